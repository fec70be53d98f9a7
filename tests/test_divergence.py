"""A diverging run stops in every engine configuration (ZeRO-2, ZeRO-3, ZeRO stage 0),
with a message naming the step and what to change; within the skipped-step budget a run
trains on; metrics.jsonl stays strict JSON; no checkpoint or final/ holds inf or NaN."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from empatheia import Empatheia
from empatheia.cli import main
from empatheia.modeling import load_trained_state
from empatheia.recipes import recipe
from empatheia.training import ConfigError, TrainingDiverged

from .training_helpers import REPO, STAGE_CONFIGS, tiny_config, tiny_settings, write_avatar_dataset

ZERO2 = str(REPO / "configs/deepspeed/zero2.json")
ZERO3 = str(REPO / "configs/deepspeed/zero3.json")


@pytest.fixture(scope="module")
def dialogues(tmp_path_factory) -> Path:
    """Stage 1 reads the text alone, so no gold features are extracted."""
    return write_avatar_dataset(tmp_path_factory.mktemp("dialogues"))


def strict_metrics(output_dir: Path) -> list:
    """Every row of metrics.jsonl, read by a parser that refuses Infinity and NaN."""

    def refuse(constant):
        raise ValueError(f"metrics.jsonl holds {constant}, which is not JSON")

    lines = (output_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line, parse_constant=refuse) for line in lines]


def assert_saved_weights_finite(output_dir: Path) -> None:
    for folder in sorted(output_dir.glob("checkpoint-*")):
        for name, tensor in load_trained_state(folder / "model").items():
            assert torch.isfinite(tensor).all(), f"{folder.name} saved {name} with inf or NaN"


class _NaNGradient(torch.autograd.Function):
    """The identity going forward and NaN coming back: a finite loss whose gradients
    overflow, as fp16 loss scaling or a blown-up model produces."""

    @staticmethod
    def forward(ctx, loss):
        return loss.clone()

    @staticmethod
    def backward(ctx, grad):
        return torch.full_like(grad, float("nan"))


def poison_gradients(monkeypatch, calls_to_poison) -> None:
    """The forward passes whose numbers (from 1) are in ``calls_to_poison`` get NaN gradients."""
    forward = Empatheia.forward
    calls = []

    def forward_with_nan_gradients(self, batch, stage=None):
        out = forward(self, batch, stage)
        calls.append(1)
        if calls_to_poison(len(calls)):
            out["loss"] = _NaNGradient.apply(out["loss"])
        return out

    monkeypatch.setattr(Empatheia, "forward", forward_with_nan_gradients)


def test_the_lr_1e4_run_under_the_default_zero2_config_stops_naming_the_step_and_what_to_do(dialogues, tmp_path):
    """The reported run: lr 1e4 under zero2.json blows up at step 2, after which DeepSpeed
    skips every step as an overflow. It used to train on to the end, exit 0, write final/
    and log "grad_norm": Infinity."""
    run = tmp_path / "run"
    sets = tiny_settings(1, run, dialogues, deepspeed=ZERO2, max_steps=18, save_steps=5, **{"optim.learning_rate": 1e4})
    with pytest.raises(SystemExit) as stopped:
        main(["train", str(STAGE_CONFIGS[1]), "--set", *sets])
    message = str(stopped.value.code)
    found = re.search(r"skipped (\d+) optimizer steps in a row \(steps (\d+) to (\d+)\)", message)
    assert found, message
    count, first, last = map(int, found.groups())
    assert count == 11 and last - first + 1 == count and last < 18, message  # the default budget is 10
    assert f"Training stopped at step {last}" in message
    assert "lower optim.learning_rate (now 10000)" in message and "raise max_consecutive_skipped_steps" in message
    assert not (run / "final").exists()
    assert_saved_weights_finite(run)

    rows = strict_metrics(run)
    assert [row["step"] for row in rows] == list(range(1, last + 1))
    for row in rows[first - 1:]:
        assert row["skipped_steps"] == 1 and row["grad_norm"] is None and row["nonfinite"] == {"grad_norm": "inf"}
    assert all(row["skipped_steps"] == 0 and "nonfinite" not in row for row in rows[: first - 1])

    # Resuming with the same settings starts from the last checkpoint, which remembers the
    # skips it was written after, and stops at the same step with the same message.
    latest = max(int(p.name.split("-")[1]) for p in run.glob("checkpoint-*"))
    assert first <= latest < last
    with pytest.raises(SystemExit) as again:
        main(["train", str(STAGE_CONFIGS[1]), "--set", *sets, "--resume"])
    assert str(again.value.code) == message
    # A higher budget, which a resumed run may change, lets it train on to the end.
    assert main(["train", str(STAGE_CONFIGS[1]), "--set", *sets, "max_consecutive_skipped_steps=100", "--resume"]) == 0
    assert (run / "final").is_dir() and strict_metrics(run)[-1]["step"] == 18
    assert_saved_weights_finite(run)


@pytest.mark.parametrize("deepspeed", [ZERO2, ZERO3], ids=["zero2", "zero3"])
def test_skipped_steps_within_the_budget_train_on_and_beyond_it_stop(deepspeed, dialogues, tmp_path, monkeypatch):
    # Steps 1-2 overflow (a settling loss scale), step 3 applies, steps 4 on overflow.
    poison_gradients(monkeypatch, lambda call: call != 3)
    run = tmp_path / "run"
    config = tiny_config(1, run, dialogues, deepspeed=deepspeed, max_steps=10, save_steps=3,
                         max_consecutive_skipped_steps=2)
    with pytest.raises(TrainingDiverged, match=r"skipped 3 optimizer steps in a row \(steps 4 to 6\)") as stopped:
        recipe.run(config)
    assert f"the last good checkpoint is {run / 'checkpoint-3'}" in str(stopped.value)
    rows = strict_metrics(run)
    assert [(row["step"], row["skipped_steps"], row["grad_norm"] is None) for row in rows] == [
        (1, 1, True), (2, 1, True), (3, 0, False), (4, 1, True), (5, 1, True), (6, 1, True)]
    assert rows[0]["nonfinite"] == {"grad_norm": "inf"}
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-3"] and not (run / "final").exists()
    assert_saved_weights_finite(run)


def test_zero_stage_0_stops_before_it_would_apply_a_nan_gradient(dialogues, tmp_path, monkeypatch):
    """Without DeepSpeed's ZeRO optimizer nothing skips an overflowing step: it would
    leave every weight NaN, so the run stops before it, whatever the budget."""
    poison_gradients(monkeypatch, lambda call: call == 3)
    run = tmp_path / "run"
    with pytest.raises(TrainingDiverged, match=r"the gradient norm became nan at step 3 .*stopped before it") as stopped:
        recipe.run(tiny_config(1, run, dialogues, max_steps=6, save_steps=2))
    assert f"the last good checkpoint is {run / 'checkpoint-2'}" in str(stopped.value)
    assert "lower optim.learning_rate" in str(stopped.value)
    assert [row["step"] for row in strict_metrics(run)] == [1, 2]
    assert not (run / "final").exists()
    assert_saved_weights_finite(run)


def test_weights_that_stop_being_finite_are_never_saved(dialogues, tmp_path, monkeypatch):
    """An update can blow the weights up although its gradient was finite; the checkpoint
    of that step and final/ are then not written."""
    step = torch.optim.AdamW.step
    updates = []

    def blowing_up_step(self, *args, **kwargs):
        out = step(self, *args, **kwargs)
        updates.append(1)
        if len(updates) == 4:
            with torch.no_grad():
                self.param_groups[0]["params"][0].fill_(float("inf"))
        return out

    monkeypatch.setattr(torch.optim.AdamW, "step", blowing_up_step)
    run = tmp_path / "run"
    with pytest.raises(TrainingDiverged, match=r"after step 4 the trained weights hold inf or NaN \(\S+"):
        recipe.run(tiny_config(1, run, dialogues, max_steps=6, save_steps=2))
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-2"] and not (run / "final").exists()
    assert_saved_weights_finite(run)


def test_the_budget_must_be_a_non_negative_integer(dialogues, tmp_path):
    with pytest.raises(ConfigError, match=r"max_consecutive_skipped_steps: must be a non-negative integer, got -1"):
        tiny_config(1, tmp_path / "run", dialogues, max_consecutive_skipped_steps=-1)


def test_deepspeeds_fp16_loss_scale_at_its_minimum_stops_as_a_divergence(dialogues, tmp_path, monkeypatch):
    """fp16 needs a GPU, so DeepSpeed's own stop (a bare Exception from its loss scaler)
    is raised here by hand, as its engine raises it from step()."""
    from deepspeed.runtime.engine import DeepSpeedEngine

    step = DeepSpeedEngine.step
    calls = []

    def overflowing_at_the_minimum_scale(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise Exception("Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.")
        return step(self, *args, **kwargs)

    monkeypatch.setattr(DeepSpeedEngine, "step", overflowing_at_the_minimum_scale)
    run = tmp_path / "run"
    with pytest.raises(TrainingDiverged, match=r"at step 2 the gradients overflowed fp16 .*lower optim.learning_rate"):
        recipe.run(tiny_config(1, run, dialogues, max_steps=4, save_steps=1))
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-1"] and not (run / "final").exists()
