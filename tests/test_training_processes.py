"""Training in real processes: two ranks under torchrun with DeepSpeed ZeRO-2 and ZeRO-3
on the CPU (gloo), and a run killed with SIGKILL partway, resumed, and compared with one
that was never interrupted."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from .training_helpers import (
    REPO,
    STAGE_CONFIGS,
    clean_launch_env,
    final_weights,
    read_metrics,
    tiny_settings,
)


def _run(args, timeout=300, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(args, cwd=REPO, env=clean_launch_env(), capture_output=True, text=True, timeout=timeout, **kwargs)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.mark.parametrize("zero", [2, 3])
def test_two_processes_with_deepspeed_zero_end_with_identical_weights(zero, avatar, stage1_output, tmp_path):
    train, gold = avatar
    sets = tiny_settings(
        4, tmp_path / "run", train, gold=gold, init=stage1_output, max_steps=4, save_steps=2,
        deepspeed=str(REPO / f"configs/deepspeed/zero{zero}.json"), **{"optim.batch_size": 2, "optim.gradient_accumulation_steps": 2},
    )
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(29600 + zero),
          "tests/distributed_train.py", str(tmp_path), str(STAGE_CONFIGS[4]), *sets])
    ranks = [load_file(str(tmp_path / f"rank-{r}.safetensors")) for r in (0, 1)]
    assert ranks[0].keys() == ranks[1].keys()
    for key in ranks[0]:
        assert torch.equal(ranks[0][key], ranks[1][key]), key
    # What rank 0 saved is that same model, and it trained.
    saved = final_weights(tmp_path / "run")
    assert all(torch.equal(saved[k], ranks[0][k]) for k in saved)
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[-1]["examples"] == 4 * 2 * 2 * 2  # steps x micro-batch x accumulation x processes
    assert (tmp_path / "run" / "checkpoint-4" / "rng" / "rank-1.pt").is_file()


def test_a_killed_run_resumes_to_the_weights_of_an_uninterrupted_one(avatar, stage1_output, tmp_path):
    train, gold = avatar
    # Enough steps after the checkpoint the run is killed at for the kill to land before
    # the end; each step costs the suite three times (whole, killed, resumed).
    steps = 16

    def command(out: Path, *extra: str):
        sets = tiny_settings(4, out, train, gold=gold, init=stage1_output, max_steps=steps, save_steps=4,
                             **{"optim.batch_size": 2, "optim.gradient_accumulation_steps": 2})
        return [sys.executable, "-m", "empatheia", "train", str(STAGE_CONFIGS[4]), *[a for s in sets for a in ("--set", s)], *extra]

    _run(command(tmp_path / "whole"))

    killed = tmp_path / "killed"
    process = subprocess.Popen(command(killed), cwd=REPO, env=clean_launch_env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not (killed / "checkpoint-8").exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL, "the run finished before it could be killed"
    assert not (killed / "final").exists()
    rows_before = read_metrics(killed)
    assert steps > rows_before[-1]["step"] >= 8

    resumed = _run(command(killed, "--resume"))
    assert f'"steps": {steps}' in resumed.stdout
    whole, again = final_weights(tmp_path / "whole"), final_weights(killed)
    assert whole.keys() == again.keys()
    for key in whole:
        torch.testing.assert_close(again[key], whole[key], rtol=1e-5, atol=1e-6, msg=key)
    losses = [r["loss"] for r in read_metrics(tmp_path / "whole")]
    assert [r["step"] for r in read_metrics(killed)] == list(range(1, steps + 1))
    assert [r["loss"] for r in read_metrics(killed)] == pytest.approx(losses, rel=1e-5)
