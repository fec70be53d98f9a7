"""A small avatar dataset whose speakers have profiles and identities (MERIA's identity
branch reads them), each speaker turn with its own speech and face clip, and tiny
settings for the variants' stage configs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List

from empatheia.cli import main as cli_main
from empatheia.training import load_train_config

from .training_helpers import DIALOGUES, REPO, _clip, tiny_settings

SPEAKERS = [
    {"ID": "speaker-a", "gender": "female", "age": "young"},
    {"ID": "speaker-b", "gender": "male", "age": "elderly"},
]


def write_speaker_dataset(root: Path, copies: int = 2) -> Path:
    """``root/train.jsonl``: the four dialogues of the training tests ``copies`` times, every
    copy with clips of its own (another pitch and shade), spoken by two named speakers."""
    clips = root / "clips"
    clips.mkdir(parents=True, exist_ok=True)
    lines = []
    for copy in range(copies):
        for i, (said, answer, emotion, listener) in enumerate(DIALOGUES):
            n = copy * len(DIALOGUES) + i
            lines.append({
                "id": f"speaker/{n}",
                "context": said,
                "speaker": SPEAKERS[n % len(SPEAKERS)],
                "listener": listener,
                "emotion": emotion,
                "history": [{"role": "speaker", "text": said,
                             **_clip(clips, f"{n}-0", 0.7 + 0.1 * i, 140 + 45 * n, 25 * n)}],
                "response": {"text": answer, **_clip(clips, f"{n}-1", 0.8, 230 + 20 * n, 70 + 15 * n)},
                "chain": {"event_scenario": said, "speaker_emotion": emotion},
            })
    path = root / "train.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def variant_settings(stage: str, output_dir: Path, data: Path, init: Path = None, **extra) -> List[str]:
    """``--set`` items for a seconds-long CPU run of a variant's stage config."""
    sets = {"max_steps": 4, "optim.learning_rate": 5e-3, **extra}
    return tiny_settings(stage, output_dir, data, init=init, **sets)


def variant_config(stage: str, output_dir: Path, data: Path, init: Path = None, **extra):
    return load_train_config(REPO / f"configs/train/{stage}.yaml", variant_settings(stage, output_dir, data, init, **extra))


def train_stage(stage: str, output_dir: Path, data: Path, init: Path = None, **extra) -> Path:
    """Run ``empatheia train configs/train/<stage>.yaml`` with tiny settings; its ``final/``."""
    sets = variant_settings(stage, output_dir, data, init, **extra)
    argv = ["train", str(REPO / f"configs/train/{stage}.yaml")]
    for item in sets:
        argv += ["--set", item]
    assert cli_main(argv) == 0
    return output_dir / "final"
