"""MERIA on the tiny preset: its three stages train, save, load and answer end to end; the
PDR disentangles the real tiny encoders' features; each ablation flag removes its module."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from empatheia.cli import main as cli_main
from empatheia.config_loader import ConfigError
from empatheia.data import read_dataset
from empatheia.stages import get_stage
from empatheia.variants.build import build_trained_variant
from empatheia.variants.fusion import uncertainty_gated_fusion
from empatheia.variants.mcoe import load_mcoe_targets
from empatheia.variants.meria import MeriaModel, MeriaOptions, MeriaSystem
from empatheia.variants.models import build_variant_model, load_variant_model, start_variant_model, variant_stage_data
from empatheia.variants.prefix import UtteranceDataset

from .training_helpers import read_metrics
from .variant_helpers import train_stage, variant_config, write_speaker_dataset

PDR_TERMS = ("pdr_recon", "pdr_kl", "pdr_align", "pdr_ortho", "pdr_triplet", "pdr_cls", "pdr_identity")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """``(train.jsonl, mcoe.jsonl)``: eight dialogues and their chains from the shipped readers."""
    root = tmp_path_factory.mktemp("meria_data")
    train = write_speaker_dataset(root)
    chains = root / "mcoe.jsonl"
    assert cli_main(["variants", "mcoe", str(train), "--out", str(chains)]) == 0
    return train, chains


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    """The three stages run in order with the repository's configs: their output folders."""
    train, chains = data
    root = tmp_path_factory.mktemp("meria_runs")
    pdr = train_stage("meria_pdr", root / "pdr", train)
    mcoe = train_stage("meria_mcoe", root / "mcoe", train, init=root / "pdr", **{"data.mcoe": str(chains)})
    response = train_stage("meria_response", root / "response", train, init=root / "mcoe", **{"data.mcoe": str(chains)})
    return {"pdr": pdr.parent, "mcoe": mcoe.parent, "response": response.parent}


@pytest.fixture(scope="module")
def without_mcoe(trained, data, tmp_path_factory) -> Path:
    """The "w/o M-CoE" ablation: meria_response from meria_pdr's output, use_mcoe off."""
    train, _ = data
    out = tmp_path_factory.mktemp("meria_wo_mcoe") / "response"
    return train_stage("meria_response", out, train, init=trained["pdr"], **{"model.variant": {"use_mcoe": False}})


def batch_of(model, train: Path, chains=None, stage="meria_pdr"):
    corpus = read_dataset(train, labels=model.label_sets())
    dataset = UtteranceDataset(corpus.dialogues, model.processor, stage, model.label_sets(), chains)
    return dataset.collator()([dataset[i] for i in range(len(dataset))])


def test_the_mcoe_command_builds_each_dialogues_chain_from_the_readers_and_the_data(data):
    train, chains = data
    targets = load_mcoe_targets(chains)
    corpus = read_dataset(train)
    assert set(targets) == {d.id for d in corpus.dialogues}
    first = targets[corpus.dialogues[0].id]
    for part in (first.visual, first.audio):  # both read from the speaker turn's clips
        assert part.emotion is not None and 0 < part.confidence <= 1
    assert first.chain.event_scenario == corpus.dialogues[0].turns[0].text


def test_the_three_stages_train_save_load_and_answer(trained, data):
    train, chains = data
    pdr_rows = read_metrics(trained["pdr"])
    assert all(all(term in row for term in PDR_TERMS) for row in pdr_rows)  # every term of eq. 1 is logged
    assert pdr_rows[-1]["loss"] < pdr_rows[0]["loss"]
    assert "loss_emp" in read_metrics(trained["mcoe"])[0] and "loss_emp" in read_metrics(trained["response"])[0]

    # Each stage trains only its parts: the PDR stays as meria_pdr left it, the M-CoE
    # adapter as meria_mcoe left it.
    after_pdr = load_variant_model(trained["pdr"]).trained_state_dict()
    after_mcoe = load_variant_model(trained["mcoe"]).trained_state_dict()
    final = load_variant_model(trained["response"])
    state = final.trained_state_dict()
    for name, value in state.items():
        group = final.group_of(name)
        if group == "pdr":
            assert torch.equal(value, after_pdr[name]) and torch.equal(value, after_mcoe[name])
        elif group in ("lora", "soft_prompts"):
            assert torch.equal(value, after_mcoe[name])
    changed = {final.group_of(n) for n, v in state.items() if not torch.equal(v, after_mcoe[n])}
    assert changed == {"response_lora"}

    system = build_trained_variant("meria", checkpoint=trained["response"])
    assert isinstance(system, MeriaSystem)
    dialogues = read_dataset(train).dialogues[:2]
    responses = system.respond(dialogues, max_new_tokens=8)
    assert len(system.last_chains) == 2 and all(c is not None for c in system.last_chains)
    for response in responses:
        assert response.system == "MERIA" and response.has_chain
        assert response.emotion.label in system.styles.speech  # the table's row styles the voice and face
        assert response.speech_style.shape == system.styles.speech[response.emotion.label].shape


def test_a_saved_meria_loads_back_exactly(tmp_path):
    model = build_variant_model("meria", "tiny", {"use_ugf": False, "latent_dim": 8})
    torch.manual_seed(1)
    with torch.no_grad():  # every trained tensor away from its fresh value
        for value in model.trained_state_dict().values():
            value.add_(torch.randn_like(value))
    model.save_pretrained(tmp_path / "saved")
    again = load_variant_model(tmp_path / "saved")
    fresh = build_variant_model("meria", "tiny", {"use_ugf": False, "latent_dim": 8}).trained_state_dict()
    assert again.options == model.options and set(again.trained_state_dict()) == set(fresh)
    for name, value in again.trained_state_dict().items():
        assert torch.equal(value, model.trained_state_dict()[name]) and not torch.equal(value, fresh[name]), name
    assert {model.group_of(n) for n in fresh} == {"pdr", "soft_prompts", "lora", "response_lora"}


@pytest.fixture
def one_thread():
    """Tiny matrices: more threads only contend with whatever else runs on the machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_pdr_disentangles_the_tiny_encoders_features(data, one_thread):
    """After a few steps of eq. 1, the shared latents of one utterance's three modalities
    lie closer together than those of different utterances."""
    train, _ = data
    torch.manual_seed(0)
    model = build_variant_model("meria", "tiny")
    model.set_stage("meria_pdr")
    batch = batch_of(model, train)
    features, present = model.utterance_features(batch)
    assert set(features) == {"text", "audio", "video"} and all(bool(p.all()) for p in present.values())

    def spread():
        model.pdr.eval()
        with torch.no_grad():
            shared = torch.stack(list(model.pdr(features, present).shared_means().values()))  # (3, B, Z)
        model.pdr.train()
        distances = torch.cdist(shared.flatten(0, 1), shared.flatten(0, 1)).view(3, 8, 3, 8)
        same = torch.eye(8, dtype=torch.bool).expand(3, 3, 8, 8).permute(0, 2, 1, 3)
        across = ~torch.eye(3, dtype=torch.bool)[:, None, :, None].expand(3, 8, 3, 8)
        return distances[same & across].mean(), distances[~same & across].mean()

    optimizer = torch.optim.Adam(model.pdr.parameters(), lr=3e-3)
    for _ in range(300):
        loss = model(batch)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    same, different = spread()
    assert same < 0.5 * different


def test_ugf_weighs_the_modality_whose_private_latent_is_surest(data):
    train, _ = data
    model = build_variant_model("meria", "tiny")
    model.eval()
    features, present = model.utterance_features(batch_of(model, train))
    output = model.pdr(features, present)
    output.logvar["audio"]["private"] = torch.full_like(output.logvar["audio"]["private"], -3.0)
    output.logvar["video"]["private"] = torch.full_like(output.logvar["video"]["private"], 1.0)
    output.logvar["text"]["private"] = torch.full_like(output.logvar["text"]["private"], 1.0)
    fusion = uncertainty_gated_fusion(output)
    assert bool((fusion.weights[:, 1] > 0.9).all())  # audio, in MODALITIES order
    ungated = uncertainty_gated_fusion(output, gated=False)
    assert torch.allclose(ungated.weights, torch.full_like(ungated.weights, 1 / 3))


# ---------------------------------------------------------------------- ablations
def test_without_pdr_there_is_no_pdr_and_one_soft_prompt_per_modality(data):
    train, chains = data
    full = build_variant_model("meria", "tiny")
    ablated = build_variant_model("meria", "tiny", {"use_pdr": False})
    assert ablated.pdr is None and not ablated.parameter_groups()["pdr"]
    assert set(ablated.soft_prompts) == {"text", "audio", "video"}
    assert set(full.soft_prompts) == {"emotion", "identity", "private"}
    assert sum(p.numel() for p in ablated.parameters()) != sum(p.numel() for p in full.parameters())
    full.eval(), ablated.eval()
    batch = batch_of(full, train)
    assert full.prefix(batch).shape[1] == ablated.prefix(batch).shape[1] == 12
    assert not torch.allclose(full.prefix(batch), ablated.prefix(batch))
    with pytest.raises(ValueError, match="no PDR"):
        ablated.set_stage("meria_pdr")
    # Its M-CoE stage starts from the preset: nothing before it trains.
    config = variant_config("meria_mcoe", train.parent / "wo_pdr", train, **{"model.variant": {"use_pdr": False},
                                                                            "data.mcoe": str(chains)})
    assert start_variant_model(config).pdr is None


def test_without_ugf_the_shared_emotions_are_averaged(data):
    train, _ = data
    gated = build_variant_model("meria", "tiny")
    plain = build_variant_model("meria", "tiny", {"use_ugf": False})
    assert [n for n, _ in gated.named_parameters()] == [n for n, _ in plain.named_parameters()]  # UGF has no weights
    plain.load_state_dict(gated.state_dict())
    gated.eval(), plain.eval()
    batch = batch_of(gated, train)
    assert not torch.allclose(gated.prefix(batch), plain.prefix(batch))


def test_without_mcoe_the_response_llm_reads_the_soft_prompts_and_no_chain_is_written(trained, data, without_mcoe):
    train, chains = data
    with pytest.raises(ValueError, match="no M-CoE LLM"):
        build_variant_model("meria", "tiny", {"use_mcoe": False}).set_stage("meria_mcoe")
    final = without_mcoe
    model = load_variant_model(final)
    assert not model.options.use_mcoe
    assert "soft_prompts" in model.stage_groups(get_stage("meria_response"))
    before = load_variant_model(trained["pdr"]).trained_state_dict()
    moved = {model.group_of(n) for n, v in model.trained_state_dict().items() if not torch.equal(v, before[n])}
    assert moved == {"soft_prompts", "response_lora"}
    system = build_trained_variant("meria", checkpoint=final)
    response = system.respond(read_dataset(train).dialogues[0], max_new_tokens=6)
    assert system.last_chains == [None] and not response.has_chain


# ---------------------------------------------------------------------- errors
def test_stage_configs_say_what_they_need(data, tmp_path):
    train, chains = data
    with pytest.raises(ConfigError, match="meria_pdr's output"):
        start_variant_model(variant_config("meria_mcoe", tmp_path / "a", train, **{"data.mcoe": str(chains)}))
    with pytest.raises(ConfigError, match="unknown MeriaOptions keys"):
        start_variant_model(variant_config("meria_pdr", tmp_path / "b", train, **{"model.variant": {"use_pfr": False}}))
    with pytest.raises(ConfigError, match="data.labels: stage meria_pdr reads the model's own label sets"):
        config = variant_config("meria_pdr", tmp_path / "e", train, **{"data.labels": "configs/labels/ed32.yaml"})
        variant_stage_data(config, build_variant_model("meria", "tiny"))
    with pytest.raises(ConfigError, match="no variant options"):
        variant_config("stage1_coe", tmp_path / "c", train, **{"model.variant": {"use_pdr": False}})
    with pytest.raises(SystemExit, match="variants mcoe"):
        cli_main(["train", "configs/train/meria_mcoe.yaml", "--set", "model.preset=tiny", "--set", f"data.train={train}",
                  "--set", "model.init=null", "--set", "model.variant={use_pdr: false}", "--set", "data.mcoe=null",
                  "--set", "model.dtype=null", "--set", "deepspeed=null", "--set", f"output_dir={tmp_path / 'd'}"])


def test_options_round_trip_through_the_saved_folder(trained):
    model = load_variant_model(trained["pdr"])
    assert model.options == MeriaOptions()
    saved = yaml.safe_load((trained["pdr"] / "final" / "variant.yaml").read_text())
    assert saved["system"] == "meria" and saved["options"]["use_pdr"] is True
    assert isinstance(model, MeriaModel)


def test_compare_runs_meria_and_an_ablation_as_rows_of_their_own(trained, data, without_mcoe, tmp_path):
    train, _ = data
    out = tmp_path / "compare"
    rows = ["pipeline", f"meria={trained['response']}", f"meria:wo_mcoe={without_mcoe.parent}"]
    assert cli_main(["compare", "--systems", *rows, "--preset", "tiny", "--data", str(train), "--limit", "2",
                     "--max-new-tokens", "6", "--no-progress", "--out", str(out)]) == 0
    comparison = yaml.safe_load((out / "comparison.json").read_text())
    assert [row["system"] for row in comparison["rows"]] == ["pipeline", "meria", "meria:wo_mcoe"]
    assert [row["folder"] for row in comparison["rows"]] == ["pipeline", "meria", "meria-wo_mcoe"]
    assert comparison["rows"][2]["checkpoint"] == str(without_mcoe.parent)
    for folder in ("meria", "meria-wo_mcoe"):
        predictions = (out / folder / "predictions.jsonl").read_text().splitlines()
        assert len(predictions) == 2
    assert "meria:wo_mcoe" in (out / "comparison.md").read_text()


def test_the_mcoe_llm_writes_the_chains_the_response_llm_trains_on(trained, data, tmp_path):
    """As the paper: `variants mcoe --model` writes each dialogue's chain with the trained
    M-CoE LLM, in the file format meria_response reads."""
    train, _ = data
    out = tmp_path / "written.jsonl"
    assert cli_main(["variants", "mcoe", str(train), "--model", str(trained["mcoe"]), "--out", str(out),
                     "--batch-size", "4"]) == 0
    written = load_mcoe_targets(out)
    assert set(written) == {d.id for d in read_dataset(train).dialogues}
    assert all(chain.raw is not None for chain in written.values())  # what the model wrote, kept whole
