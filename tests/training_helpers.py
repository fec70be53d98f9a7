"""A small avatar dataset with generated speech and video, its gold features, and tiny
training configs built from the repository's stage configs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, List, Sequence

import av
import numpy as np
import soundfile
import torch

from empatheia.data import extract_gold_features, gold_feature_sources, read_dataset
from empatheia.modeling import load_trained_state
from empatheia.training import TrainConfig, load_train_config

from .test_data_stages import tiny_extractors

REPO = Path(__file__).resolve().parents[1]
STAGE_CONFIGS = {
    1: REPO / "configs/train/stage1_coe.yaml",
    2: REPO / "configs/train/stage2_ccl.yaml",
    3: REPO / "configs/train/stage3_sac.yaml",
    4: REPO / "configs/train/stage4_joint.yaml",
    "finetune": REPO / "configs/train/finetune_avatar.yaml",
}

DIALOGUES = [
    ("I finally got the keys to my first apartment!", "That is wonderful news, congratulations!", "excited",
     {"age": "young", "gender": "female", "timbre": "high"}),
    ("My dog has been sick all week.", "I am so sorry, that must be worrying.", "sad",
     {"age": "elderly", "gender": "male", "timbre": "low"}),
    ("Someone scratched my car and drove off.", "That is infuriating, I would be angry too.", "angry",
     {"age": "middle-aged", "gender": "male", "timbre": "mid"}),
    ("I heard a strange noise downstairs last night.", "That sounds frightening. Are you safe now?", "afraid",
     {"age": "young", "gender": "male", "timbre": "mid"}),
]


def _clip(folder: Path, name: str, seconds: float, pitch: float, shade: int) -> Dict[str, str]:
    rate = 16000
    t = np.arange(int(rate * seconds)) / rate
    wave = 0.3 * np.sin(2 * np.pi * pitch * t) * (1 + np.sin(2 * np.pi * 3 * t))
    soundfile.write(folder / f"{name}.wav", wave.astype(np.float32), rate)
    with av.open(str(folder / f"{name}.mp4"), "w") as out:
        stream = out.add_stream("mpeg4", rate=25)
        stream.width, stream.height, stream.pix_fmt = 48, 48, "yuv420p"
        for i in range(int(25 * seconds)):
            frame = np.full((48, 48, 3), (shade + 7 * i) % 255, dtype=np.uint8)
            out.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        out.mux(stream.encode())
    return {"audio": f"clips/{name}.wav", "video": f"clips/{name}.mp4"}


def write_avatar_dataset(root: Path, emotions: Sequence[str] = (), listener: Dict[str, str] = None) -> Path:
    """``root/train.jsonl`` with four dialogues, each turn with its own speech and video,
    and the gold features of the tiny preset in ``root/gold``."""
    clips = root / "clips"
    clips.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, (said, answer, emotion, profile) in enumerate(DIALOGUES):
        lines.append(
            {
                "id": f"avatar/{i}",
                "context": said,
                "listener": listener or profile,
                "emotion": emotions[i] if emotions else emotion,
                "history": [{"role": "speaker", "text": said, **_clip(clips, f"{i}-0", 0.8 + 0.1 * i, 150 + 40 * i, 30 * i)}],
                "response": {"text": answer, **_clip(clips, f"{i}-1", 0.9, 220 + 30 * i, 60 + 20 * i)},
                "chain": {"event_scenario": said, "goal_to_response": "Acknowledge the feeling."},
            }
        )
    path = root / "train.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def extract_tiny_gold_features(train: Path, out: Path, labels=None) -> Path:
    corpus = read_dataset(train, labels=labels)
    extract_gold_features(gold_feature_sources(corpus), tiny_extractors(), out, progress=False)
    return out


def tiny_settings(stage, output_dir: Path, data: Path, gold: Path = None, init: Path = None, **extra) -> List[str]:
    """``--set`` items that turn a repository stage config into a seconds-long CPU run."""
    sets = {
        "model.preset": "tiny",
        "model.dtype": None,
        "model.init": str(init) if init else None,
        "data.train": str(data),
        "data.gold_features": str(gold) if gold else None,
        "data.media_root": None,
        "data.media_cache": None,
        "data.num_workers": 0,
        "data.eval": None,
        "data.eval_gold_features": None,
        "data.labels": None,
        "output_dir": str(output_dir),
        "deepspeed": None,
        "max_steps": 8,
        "optim.batch_size": 4,
        "optim.gradient_accumulation_steps": 1,
        "optim.learning_rate": 1e-2,
        "optim.warmup_steps": 0,
        "optim.scheduler": "constant",
        "logging_steps": 1,
        "save_steps": 1000,
        "eval_steps": None,
        "tensorboard": False,
        "progress": False,
    }
    sets.update(extra)
    return [f"{k}={json.dumps(v) if v is not None else 'null'}" for k, v in sets.items()]


def tiny_config(stage, output_dir: Path, data: Path, **kwargs) -> TrainConfig:
    return load_train_config(STAGE_CONFIGS[stage], tiny_settings(stage, output_dir, data, **kwargs))


def read_metrics(output_dir: Path, split: str = "train") -> List[dict]:
    lines = (Path(output_dir) / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if row["split"] == split]


def final_weights(output_dir: Path) -> Dict[str, torch.Tensor]:
    """Every trained tensor of a run's ``final/`` (adapter and heads), keyed as
    ``Empatheia.trained_state_dict``."""
    return load_trained_state(Path(output_dir) / "final")


def clean_launch_env() -> Dict[str, str]:
    """The environment for a child training process: without the process-group variables
    an in-process run of this test session set, and with the repository importable."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"
    return env
