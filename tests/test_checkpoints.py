"""A saved model's folder in the ecosystem's shape: the language model's LoRA and signal
rows as a PEFT adapter that plain ``peft`` loads, the other trained parts in safetensors,
the config in YAML; folders written before that layout still load."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from safetensors.torch import save_file

from empatheia import Empatheia
from empatheia.modeling import load_trained_state, shipped_weights

from .conftest import full_batch


def _trained(model: Empatheia) -> Empatheia:
    """Move every trained part away from its initial value (LoRA's B starts at zero and the
    signal rows at the base rows, where an adapter would change nothing)."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for group in ("lora", "signal_rows", "projectors", "content_synchronizer", "style_disentangler"):
            for _, param in model.parameter_groups()[group]:
                param.add_(torch.randn(param.shape, generator=g) * 0.05)
    return model.eval()


def test_the_adapter_loads_with_plain_peft_onto_the_base_and_gives_the_same_logits(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = _trained(Empatheia.from_preset("tiny"))
    model.save_pretrained(tmp_path / "model")
    adapter = json.loads((tmp_path / "model" / "adapter_config.json").read_text())
    signals = list(model.token_ids.signals)
    assert adapter["peft_type"] == "LORA" and adapter["trainable_token_indices"]["embed_tokens"] == signals
    assert adapter["base_model_name_or_path"] is None  # tiny's base has random weights, no name
    # The config reads without this package.
    assert yaml.safe_load((tmp_path / "model" / "config.yaml").read_text())["preset"] == "tiny"

    # The tiny base: the preset's language model before any adapter, saved as a plain
    # transformers model (its random weights come from the config's seed).
    Empatheia.from_preset("tiny", trained=False).language_model.unload().save_pretrained(tmp_path / "base")
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    plain = PeftModel.from_pretrained(base, tmp_path / "model").eval()

    ids = torch.cat([torch.tensor([model.token_ids.eos]), torch.arange(5, 40), torch.tensor(signals)])[None]
    with torch.no_grad():
        ours = model.language_model(input_ids=ids).logits
        theirs = plain(input_ids=ids).logits
    assert torch.equal(ours, theirs)
    # ... and the adapter does change them: a base alone gives other logits.
    with torch.no_grad():
        bare = AutoModelForCausalLM.from_pretrained(tmp_path / "base").eval()(input_ids=ids).logits
    assert not torch.allclose(bare, ours)


def test_a_checkpoint_of_the_earlier_single_file_layout_still_loads(tmp_path):
    model = _trained(Empatheia.from_preset("tiny"))
    batch = full_batch(model)
    # What save_pretrained wrote before the adapter had files of its own: everything
    # trained in one empatheia.safetensors, version 1.
    old = tmp_path / "old"
    old.mkdir()
    model.config.save_yaml(old / "config.yaml")
    model.tokenizer.save_pretrained(str(old / "tokenizer"))
    state = {k: v.detach().contiguous() for k, v in model.trained_state_dict().items()}
    save_file(state, str(old / "empatheia.safetensors"), metadata={"format": "empatheia", "version": "1"})

    loaded = Empatheia.from_pretrained(old).eval()
    with torch.no_grad():
        before, after = model(batch, stage=4), loaded(batch, stage=4)
    for key in before:
        torch.testing.assert_close(after[key], before[key], rtol=0, atol=0)
    # Re-saved, it takes the new layout and loads to the same weights.
    loaded.save_pretrained(tmp_path / "new")
    again = load_trained_state(tmp_path / "new")
    assert again.keys() == state.keys() and all(torch.equal(again[k], state[k]) for k in state)


def test_the_shipped_small_weights_are_the_single_file_layout():
    weights = shipped_weights("small")
    if weights is None:
        pytest.skip("the package ships no small weights here")
    state = load_trained_state(weights)
    assert any(k.startswith("language_model.") and "lora_" in k for k in state)
    assert any(k.startswith("style_disentangler.") for k in state)


def test_a_folder_with_a_missing_or_foreign_adapter_names_the_problem(tmp_path):
    model = Empatheia.from_preset("tiny")
    folder = model.save_pretrained(tmp_path / "model")
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, "r": config["r"] * 2}))
    with pytest.raises(ValueError, match=r"adapter_config.json does not match .*r: 8 there, 4 from config.yaml"):
        Empatheia.from_pretrained(folder)
    (folder / "adapter_config.json").unlink()
    with pytest.raises(FileNotFoundError, match="adapter_config.json is missing"):
        Empatheia.from_pretrained(folder)
