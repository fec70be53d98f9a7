"""Checkpoints that are complete or absent, never half-written.

A checkpoint is written into a hidden ``.checkpoint-STEP.tmp`` folder by every process
and renamed to ``checkpoint-STEP`` by the main process once all have finished; a rename
within one file system is atomic, so a run killed mid-write leaves only a ``.tmp`` folder,
which no reader takes for a checkpoint and the next run removes. Layout::

    checkpoint-STEP/
        model/               trained weights, loadable by Empatheia.from_pretrained
        deepspeed/           DeepSpeed engine state: optimizer, LR schedule, trained params
        rng/rank-R.pt        random number generator states of process R
        trainer_state.json   step, micro-batches consumed, examples seen
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional, Union

import numpy as np
import torch

from ..errors import DataError
from ..io import replace_path, write_text_atomic
from .distributed import barrier

CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")
STATE_NAME = "trainer_state.json"
ENGINE_DIR = "deepspeed"
ENGINE_TAG = "state"
MODEL_DIR = "model"


@dataclass
class TrainerState:
    step: int = 0
    """Optimizer steps taken."""
    micro_steps: int = 0
    """Micro-batches this process has consumed."""
    examples: int = 0
    """Training examples seen by all processes together."""

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> "TrainerState":
        return cls(**json.loads(path.read_text()))


def checkpoints(output_dir: Union[str, Path]) -> List[Path]:
    """Complete checkpoints in ``output_dir``, oldest first."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in output_dir.iterdir()
        if (m := CHECKPOINT_PATTERN.match(p.name)) and p.is_dir() and (p / STATE_NAME).is_file()
    ]
    return [p for _, p in sorted(found)]


def latest_checkpoint(output_dir: Union[str, Path]) -> Optional[Path]:
    found = checkpoints(output_dir)
    return found[-1] if found else None


def remove_partial_checkpoints(output_dir: Path) -> List[Path]:
    """Delete what killed runs left mid-write (main process only)."""
    removed = []
    for path in output_dir.glob(".*.tmp"):
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


@contextlib.contextmanager
def atomic_directory(final: Path, is_main: bool):
    """Yield a temporary folder that becomes ``final`` when every process leaves the block
    without an error. All processes must enter it together (it synchronises them)."""
    tmp = final.with_name(f".{final.name}.tmp")
    if is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    yield tmp
    barrier()
    if is_main:
        replace_path(tmp, final)
    barrier()


def rotate_checkpoints(output_dir: Path, keep: Optional[int]) -> None:
    if keep is None:
        return
    for old in checkpoints(output_dir)[: -keep or None]:
        shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------------- RNG
def rng_state(device: torch.device) -> Dict[str, object]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: Dict[str, object], device: torch.device) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def save_rng(directory: Path, rank: int, device: torch.device) -> None:
    (directory / "rng").mkdir(exist_ok=True)
    torch.save(rng_state(device), directory / "rng" / f"rank-{rank}.pt")


def load_rng(directory: Path, rank: int, device: torch.device) -> None:
    path = directory / "rng" / f"rank-{rank}.pt"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: the checkpoint was written by fewer processes than this run has; "
            "resume with the same number of processes"
        )
    # The state holds Python and NumPy objects, so it cannot load with weights_only.
    set_rng_state(torch.load(path, weights_only=False), device)


# ---------------------------------------------------------------------- metrics
def truncate_metrics(path: Path, step: int) -> None:
    """Drop the lines a killed run logged after the checkpoint it resumes from, so the
    resumed run's log reads as if it had never stopped. A last line cut short (a kill or a
    full disk mid-write) is dropped with them; an unreadable line before it is a
    :class:`~empatheia.errors.DataError` naming the file and the line."""
    if not path.is_file():
        return
    lines = [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    kept = []
    for number, line in enumerate(lines, 1):
        try:
            logged = json.loads(line)["step"]
        except (json.JSONDecodeError, KeyError, TypeError):
            if number == len(lines):
                break
            raise DataError(f"line {number} is not a metrics record ({line[:60]!r}); remove it to resume", file=path,
                            field=f"line {number}") from None
        if logged <= step:
            kept.append(line)
    write_text_atomic(path, "".join(line + "\n" for line in kept))
