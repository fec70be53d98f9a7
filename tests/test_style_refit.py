"""The Style Disentangler refit on a frozen model's signal states (empatheia.training.style_refit)."""

from __future__ import annotations

import torch

from empatheia import Empatheia
from empatheia.data import GoldFeatureStore, StageDataset, read_dataset
from empatheia.training.style_refit import collect_signal_states, refit_style_disentangler

from .conftest import shared_data


def test_the_refit_trains_only_the_style_disentangler_on_states_computed_once(avatar):
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
        speech, _ = model.signal_states(model.hidden_states(batch), batch["input_ids"])
    torch.testing.assert_close(speech[0].float(), states.speech[0], rtol=1e-4, atol=1e-4)

    def loss_on_all() -> float:
        head = model.style_disentangler.eval()
        with torch.no_grad():
            terms = model.style_losses(head(states.speech, states.video), states.targets)
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
