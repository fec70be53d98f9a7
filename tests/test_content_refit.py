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

from .conftest import saved_before, shared_data


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


def _unit_batch(model, units: torch.Tensor, lengths: torch.Tensor):
    """Hidden states of a fixed random response for each row of ``units`` ``(B, L)``."""
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(1, 6, model.content_synchronizer.input_ffn[0].in_features, generator=g).expand(units.shape[0], -1, -1)
    return hidden, torch.ones(units.shape[0], 6, dtype=torch.bool), lengths, units


def test_a_content_row_sees_its_neighbours_units_and_nothing_past_the_end():
    torch.manual_seed(0)
    model = Empatheia.from_preset("tiny").eval()
    head = model.content_synchronizer
    assert head.unit_context is not None and head.unit_context.kernel_size == (5,)
    torch.nn.init.normal_(head.unit_context.weight, std=0.05)  # as if trained
    units = torch.tensor([[5, 6, 7, 8, 9, 10], [5, 6, 7, 40, 9, 10], [5, 6, 7, 8, 9, 10]])
    lengths = torch.tensor([6, 6, 4])
    with torch.no_grad():
        out = head(*_unit_batch(model, units, lengths))
    # The rows' own ids and positions are equal in rows 0 and 1 but for row 3: rows 1, 2,
    # 4 and 5, within two of it, see the change through the context alone.
    unit_rows = head._unit_rows(units, lengths)
    assert torch.equal(unit_rows[0, 0], unit_rows[1, 0])
    assert all(not torch.allclose(unit_rows[0, i], unit_rows[1, i]) for i in (1, 2, 4, 5))
    # An item of four units reads as it does alone: its padded rows' ids are nobody's neighbours.
    with torch.no_grad():
        alone = head(*_unit_batch(model, units[2:, :4], lengths[2:]))
    torch.testing.assert_close(out.video[2, :4], alone.video[0], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out.video[0, :4], alone.video[0], atol=1e-4)


def test_a_head_trained_without_unit_context_gains_one_that_changes_nothing_until_refit(tmp_path):
    from empatheia.training.content_refit import add_unit_context

    torch.manual_seed(0)
    # A config written before the key existed loads as the weights were trained.
    model = Empatheia.from_pretrained(saved_before(tmp_path, "content_synchronizer", "unit_context", 0)).eval()
    assert model.config.content_synchronizer.unit_context == 0 and model.content_synchronizer.unit_context is None

    units, lengths = torch.randint(1, 200, (2, 7)), torch.tensor([7, 5])
    with torch.no_grad():
        before = model.content_synchronizer(*_unit_batch(model, units, lengths)).video
        assert add_unit_context(model) and not add_unit_context(model)
        after = model.content_synchronizer(*_unit_batch(model, units, lengths)).video
    torch.testing.assert_close(after, before)
    assert model.config.content_synchronizer.unit_context == 5
    model.save_pretrained(tmp_path / "new")
    again = Empatheia.from_pretrained(tmp_path / "new")
    assert again.content_synchronizer.unit_context is not None
