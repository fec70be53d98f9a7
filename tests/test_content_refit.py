"""The Content Synchronizer refit on a frozen model's response states (empatheia.training.content_refit)."""

from __future__ import annotations

import pytest
import torch

from empatheia import Empatheia
from empatheia.data import GoldFeatureStore, StageDataset, read_dataset
from empatheia.training.content_refit import (
    ResponseStates,
    collect_response_states,
    refit_content_synchronizer,
    response_rows,
)

from .conftest import shared_data


def test_response_rows_packs_each_rows_response_tokens_in_order():
    hidden = torch.arange(2 * 6, dtype=torch.float32).reshape(2, 6, 1)
    mask = torch.tensor([[0, 1, 1, 0, 1, 0], [0, 0, 0, 1, 1, 0]], dtype=torch.bool)
    packed, packed_mask = response_rows(hidden, mask)
    assert packed[..., 0].tolist() == [[1, 2, 4], [9, 10, 0]]
    assert packed_mask.tolist() == [[True, True, True], [True, True, False]]


def test_the_refit_trains_only_the_content_synchronizer_on_states_computed_once(avatar, tmp_path):
    train, gold = avatar
    torch.manual_seed(0)
    model = Empatheia.from_preset("tiny")
    labels = model.label_sets()
    corpus = read_dataset(train, labels=labels, require_media=True).dialogues
    dataset = StageDataset(corpus, model.processor, 2, GoldFeatureStore(gold), labels)
    states = collect_response_states(model, dataset, batch_size=2, progress=False)
    assert len(states) == len(dataset)
    assert states.mask.shape == states.hidden.shape[:2] and states.mask[:, 0].all()
    assert "speech_units" in states.targets  # tiny reads Piper's phoneme ids

    # The packed states give the Content Synchronizer's output on the full prompt.
    model.eval()
    with torch.no_grad():
        batch = model.processor.collate([dataset[0].encoded])
        one = states.batch(torch.tensor([0]))
        lengths = one["speech_content_mask"].sum(1)
        full = model.content_synchronizer(model.hidden_states(batch), batch["response_mask"], lengths, one.get("speech_units"))
        packed = model.content_synchronizer(one["hidden"], one["response_mask"], lengths, one.get("speech_units"))
    torch.testing.assert_close(packed.video.float(), full.video.float(), rtol=1e-4, atol=1e-4)

    # Saved and read back, the states and every target are the same.
    states.save(tmp_path / "states.safetensors", key="tiny model, avatar corpus")
    assert ResponseStates.key_of(tmp_path / "states.safetensors") == "tiny model, avatar corpus"
    again = ResponseStates.load(tmp_path / "states.safetensors")
    assert torch.equal(again.hidden, states.hidden) and torch.equal(again.mask, states.mask)
    assert all(torch.equal(again.targets[k], v) for k, v in states.targets.items())

    def loss_on_all() -> float:
        head = model.content_synchronizer.eval()
        every = states.batch(torch.arange(len(states)))
        with torch.no_grad():
            content = head(every["hidden"], every["response_mask"], every["speech_content_mask"].sum(1),
                           every.get("speech_units"))
            return float(model.content_losses(content, every)["loss_ccl"])

    start = loss_on_all()
    model.train()
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    log = refit_content_synchronizer(model, states, steps=60, learning_rate=3e-3, batch_size=4, warmup_steps=5,
                                     progress=False)
    assert [row["step"] for row in log] == [50, 60] and {"loss_ccl_video", "kl_content"} <= set(log[-1])
    changed = {k for k, v in model.state_dict().items() if not torch.equal(before[k], v)}
    assert changed and all(k.startswith("content_synchronizer.") for k in changed)
    assert model.training
    assert loss_on_all() < 0.5 * start


def test_a_dataset_without_gold_content_is_refused(avatar):
    """Dialogues given as text alone have no speech to take content from."""
    _, gold = avatar
    model = Empatheia.from_preset("tiny")
    labels = model.label_sets()
    text = read_dataset(shared_data("ed/ed_valid_conversations.jsonl"), labels=labels).dialogues[:2]
    dataset = StageDataset([], model.processor, 4, GoldFeatureStore(gold), labels, text_dialogues=text)
    with pytest.raises(ValueError, match="gold content"):
        collect_response_states(model, dataset, batch_size=2, progress=False)
