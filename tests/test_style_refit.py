"""The Style Disentangler refit on a frozen model's signal states (empatheia.training.style_refit)."""

from __future__ import annotations

import pytest
import torch

from empatheia import Empatheia, modeling
from empatheia.data import GoldFeatureStore, StageDataset, read_dataset
from empatheia.training.style_refit import SignalStates, collect_signal_states, refit_style_disentangler

from .conftest import saved_before, shared_data


def test_the_refit_trains_only_the_style_disentangler_on_states_computed_once(avatar, tmp_path):
    train, gold = avatar
    torch.manual_seed(0)
    model = Empatheia.from_preset("tiny")
    labels = model.label_sets()
    corpus = read_dataset(train, labels=labels, require_media=True).dialogues
    text = read_dataset(shared_data("ed/ed_valid_conversations.jsonl"), labels=labels).dialogues[:3]
    dataset = StageDataset(corpus, model.processor, 4, GoldFeatureStore(gold), labels, text_dialogues=text)
    states = collect_signal_states(model, dataset, batch_size=3, progress=False)
    n = model.config.language_model.num_signal_tokens
    assert states.speech.shape == states.video.shape and states.speech.shape[:2] == (len(dataset), n)
    assert states.targets["style_target_mask"].tolist() == [True] * len(corpus) + [False] * 3
    assert states.targets["emotion_label"].shape == (len(dataset),)
    # The states are the ones inference sees: the model's own, in evaluation mode.
    model.eval()
    with torch.no_grad():
        batch = model.processor.collate([dataset[0].encoded])
        speech, _, chain, has_chain = model.style_inputs(model.hidden_states(batch), batch)
    torch.testing.assert_close(speech[0].float(), states.speech[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(chain[0].float(), states.chain[0], rtol=1e-4, atol=1e-4)
    assert bool(has_chain[0]) == bool(states.has_chain[0])
    assert states.chain.shape == (len(dataset), states.speech.shape[-1]) and states.has_chain.any()
    # Saved and read back, the states and every target are the same.
    states.save(tmp_path / "states.safetensors", key="tiny model, avatar corpus")
    assert SignalStates.key_of(tmp_path / "states.safetensors") == "tiny model, avatar corpus"
    again = SignalStates.load(tmp_path / "states.safetensors")
    assert torch.equal(again.speech, states.speech) and torch.equal(again.video, states.video)
    assert torch.equal(again.chain, states.chain) and torch.equal(again.has_chain, states.has_chain)
    assert again.targets.keys() == states.targets.keys()
    assert all(torch.equal(again.targets[k], v) for k, v in states.targets.items())

    def loss_on_all() -> float:
        head = model.style_disentangler.eval()
        with torch.no_grad():
            terms = model.style_losses(head(*states.inputs(torch.arange(len(states)))), states.targets)
        return float(sum(model.weighted_terms(terms, 3).values()))

    start = loss_on_all()
    model.train()
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    log = refit_style_disentangler(model, states, steps=60, learning_rate=3e-3, batch_size=4, warmup_steps=5, progress=False)
    assert [row["step"] for row in log] == [50, 60] and {"loss_sal", "loss_cls_emotion", "kl_style"} <= set(log[-1])
    after = model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith("style_disentangler.") for k in changed)
    # The standardisers keep the statistics they had; the model's training mode is kept.
    assert not any("running_" in k or k.endswith(".updates") for k in changed)
    assert model.training and model.style_disentangler.speech_norm.training
    assert loss_on_all() < 0.8 * start


def test_a_file_that_is_not_signal_states_is_named(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "weights.safetensors"
    save_file({"speech": torch.zeros(2, 3, 4)}, str(path))
    try:
        SignalStates.load(path)
    except ValueError as error:
        assert str(path) in str(error) and "video" in str(error)
    else:
        raise AssertionError("a file without video states was read")


def test_the_refit_rate_warms_up_then_decays_to_zero(monkeypatch):
    """Linear warm-up, then a cosine decay: the last steps train at a small rate."""
    model = Empatheia.from_preset("tiny")
    n, h = model.config.language_model.num_signal_tokens, model.config.language_model.hidden_size
    targets = {"emotion_label": torch.zeros(6, dtype=torch.long), "style_target_mask": torch.ones(6, dtype=torch.bool)}
    for name, values in model.config.style_disentangler.profile_labels.items():
        targets[f"{name}_label"] = torch.zeros(6, dtype=torch.long)
    targets["speech_style_target"] = torch.zeros(6, model.config.style_disentangler.speech_style_dim)
    targets["video_style_target"] = torch.zeros(6, model.config.style_disentangler.video_style_dim)
    states = SignalStates(torch.randn(6, n, h), torch.randn(6, n, h), torch.randn(6, h), torch.ones(6, dtype=torch.bool), targets)
    rates = []
    step = torch.optim.AdamW.step

    def record(self, *args, **kwargs):
        rates.append(self.param_groups[0]["lr"])
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", record)
    refit_style_disentangler(model, states, steps=20, learning_rate=1e-3, batch_size=2, warmup_steps=4, progress=False)
    assert len(rates) == 20
    assert rates[:4] == sorted(rates[:4]) and abs(rates[3] - 1e-3) < 1e-12
    assert rates[4:] == sorted(rates[4:], reverse=True) and rates[-1] < 0.02 * 1e-3


def test_a_head_trained_without_the_emotion_slot_gets_it_and_keeps_its_weights(tmp_path):
    """Weights saved before the Style Disentangler read the emotion slot load as they were
    trained (their config says nothing of it), and the refit adds the input to them."""
    from empatheia.training.style_refit import add_chain_reading

    torch.manual_seed(0)
    loaded = Empatheia.from_pretrained(saved_before(tmp_path, "style_disentangler", "reads_chain_emotion", False))
    assert loaded.config.style_disentangler.reads_chain_emotion is False
    before = {k: v.clone() for k, v in loaded.style_disentangler.state_dict().items()}
    assert add_chain_reading(loaded) and not add_chain_reading(loaded)
    head = loaded.style_disentangler
    assert loaded.config.style_disentangler.reads_chain_emotion and hasattr(head, "chain_ffn")
    assert all(torch.equal(head.state_dict()[k], v) for k, v in before.items())
    # The slot's state now moves the style; a row without a slot reads the stand-in.
    head.eval()
    n, h = loaded.config.language_model.num_signal_tokens, loaded.config.language_model.hidden_size
    signals = torch.randn(2, n, h)
    chain = torch.randn(2, h)
    with torch.no_grad():
        a = head(signals, signals, chain, torch.tensor([True, False]))
        # Another state, not a shifted one: the slot's LayerNorm removes a constant shift.
        b = head(signals, signals, torch.randn(2, h), torch.tensor([True, False]))
        c = head(signals, signals)
    assert not torch.allclose(a.speech_style[0], b.speech_style[0])
    torch.testing.assert_close(a.speech_style[1], b.speech_style[1])
    torch.testing.assert_close(a.speech_style[1], c.speech_style[1])


def test_class_style_offsets_load_old_weights_as_trained_and_a_refit_of_the_style_parts_keeps_every_class(tmp_path):
    """Weights saved before the per-class style offsets load without them; added, they
    start at zero (the styles unchanged); a refit of the style parts alone moves the
    styles toward their targets and leaves every classification as it was."""
    from empatheia.training.style_refit import STYLE_PARTS, add_class_styles

    torch.manual_seed(0)
    model = Empatheia.from_pretrained(saved_before(tmp_path, "style_disentangler", "styles_follow_classes", False))
    assert model.config.style_disentangler.styles_follow_classes is False
    head = model.style_disentangler.eval()
    sd = model.config.style_disentangler
    n, h = model.config.language_model.num_signal_tokens, model.config.language_model.hidden_size
    count = 16
    signals = torch.randn(count, n, h)
    with torch.no_grad():
        before = head(signals, signals)
    assert add_class_styles(model) and not add_class_styles(model)
    assert set(head.class_styles) == {"emotion", *sd.profile_labels}
    with torch.no_grad():
        added = head(signals, signals)
    torch.testing.assert_close(added.video_style, before.video_style)

    # Targets that depend on the class the head already predicts: the offsets can fit them.
    predicted = before.emotion_logits.argmax(1)
    table = torch.randn(len(sd.emotion_labels), sd.video_style_dim)
    targets = {
        "emotion_label": predicted,
        "style_target_mask": torch.ones(count, dtype=torch.bool),
        "speech_style_target": before.speech_style,
        "video_style_target": before.video_style + table[predicted],
    }
    for name, logits in before.profile_logits.items():
        targets[f"{name}_label"] = logits.argmax(1)
    states = SignalStates(signals, signals, torch.zeros(count, h), torch.zeros(count, dtype=torch.bool), targets)
    weights = {k: v.clone() for k, v in head.state_dict().items()}
    refit_style_disentangler(model, states, steps=150, learning_rate=3e-2, batch_size=8, warmup_steps=5,
                             progress=False, only=STYLE_PARTS)
    changed = {k for k, v in head.state_dict().items() if not torch.equal(weights[k], v)}
    assert changed and all(k.startswith(STYLE_PARTS) for k in changed)
    head.eval()
    with torch.no_grad():
        after = head(signals, signals)
    assert torch.equal(after.emotion_logits, before.emotion_logits)
    assert all(torch.equal(after.profile_logits[k], v) for k, v in before.profile_logits.items())
    error_before = ((before.video_style - targets["video_style_target"]) ** 2).sum(1).mean()
    error_after = ((after.video_style - targets["video_style_target"]) ** 2).sum(1).mean()
    assert error_after < 0.3 * error_before
    with pytest.raises(ValueError, match="no Style Disentangler parameter"):
        refit_style_disentangler(model, states, steps=1, only=("nothing.",), progress=False)


def test_new_label_sets_keep_the_class_style_offsets_of_known_classes():
    from empatheia.labels import LabelSets

    model = Empatheia.from_preset("tiny")
    head = model.style_disentangler
    with torch.no_grad():
        for table in head.class_styles.values():
            table.weight.copy_(torch.randn_like(table.weight))
    old = model.label_sets()
    happy = head.class_styles["emotion"].weight[:, old.emotions.index("happy")].clone()
    labels = LabelSets(emotions=["happy", "bored"], profile=old.profile)
    model.set_label_sets(labels)
    table = model.style_disentangler.class_styles["emotion"].weight
    assert table.shape[1] == 2
    assert torch.equal(table[:, 0], happy) and torch.equal(table[:, 1], torch.zeros_like(happy))


def test_shipped_weights_without_class_style_offsets_load_as_they_were_trained(tmp_path, monkeypatch):
    """A preset whose shipped weights predate the per-class offsets builds its head without
    them (its config asks for them), so the weights load and give the styles they gave."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    old = Empatheia.from_preset("tiny", {"style_disentangler.styles_follow_classes": False}, trained=False)
    path = tmp_path / "empatheia.safetensors"
    save_file({k: v.contiguous() for k, v in old.trained_state_dict().items()}, str(path))
    monkeypatch.setattr(modeling, "shipped_weights", lambda name: path)
    loaded = Empatheia.from_preset("tiny")
    assert loaded.config.style_disentangler.styles_follow_classes is False
    assert not hasattr(loaded.style_disentangler, "class_styles")
    n, h = old.config.language_model.num_signal_tokens, old.config.language_model.hidden_size
    signals = torch.randn(2, n, h)
    with torch.no_grad():
        torch.testing.assert_close(loaded.style_disentangler.eval()(signals, signals).video_style,
                                   old.style_disentangler.eval()(signals, signals).video_style)
    # Weights that have them load with them.
    monkeypatch.setattr(modeling, "shipped_weights", lambda name: None)
    fresh = Empatheia.from_preset("tiny")
    save_file({k: v.contiguous() for k, v in fresh.trained_state_dict().items()}, str(path))
    monkeypatch.setattr(modeling, "shipped_weights", lambda name: path)
    assert Empatheia.from_preset("tiny").config.style_disentangler.styles_follow_classes is True


@pytest.mark.parametrize("section,option,before,prefix", modeling.ADDED_OPTIONS)
def test_shipped_weights_without_an_added_option_load_without_it(section, option, before, prefix, tmp_path, monkeypatch):
    """Each head option added after weights shipped (modeling.ADDED_OPTIONS): a preset
    whose shipped weights hold none of its parameters builds without it, so they load."""
    from safetensors.torch import save_file

    old = Empatheia.from_preset("tiny", {f"{section}.{option}": before}, trained=False)
    state = old.trained_state_dict()
    assert not any(k.startswith(prefix) for k in state)
    path = tmp_path / "empatheia.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    monkeypatch.setattr(modeling, "shipped_weights", lambda name: path)
    loaded = Empatheia.from_preset("tiny")
    assert getattr(getattr(loaded.config, section), option) == before
    assert all(torch.equal(v, state[k]) for k, v in loaded.trained_state_dict().items())
