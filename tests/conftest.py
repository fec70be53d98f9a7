"""Shared fixtures: tiny models, dialogues and complete training batches."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from empatheia import Dialogue, Empatheia, Turn
from empatheia.processing import Target
from empatheia.prompts import ChainOfEmpathy, PromptMode

SHARED_DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def pytest_configure(config):
    # `make test` runs the suite in pytest-xdist workers, one per core: each worker is a
    # process with torch's default of one thread per core, so without this the workers'
    # threads would fight over the same cores. The processes a test starts (the command
    # line, training stages, torchrun's ranks) inherit the variable and do the same: the
    # worker waits while they run on its core.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)
        os.environ["OMP_NUM_THREADS"] = "1"


# The files that take longest (`make test`'s --durations, summed per file, on 2 cores), in
# that order. `make test` hands whole files to its workers in collection order
# (--dist loadfile --no-loadscope-reorder); pytest-xdist's own order, by the number of
# tests in a file, would leave the long files with few tests (the documented fine-tuning
# path, the killed run) for the end, where one worker runs them while the other idles.
LONGEST_FILES = (
    "test_offline_generators.py", "test_render.py", "test_training_processes.py", "test_finetune_docs.py",
    "test_decoding.py", "test_small_preset.py", "test_training.py", "test_styletts2.py", "test_variants.py",
    "test_small_variants.py", "test_style_heads.py", "test_finetune_avatar.py", "test_meria.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


def shared_data(relative: str) -> Path:
    """A file of the project's shared real data; the test is skipped where it is absent."""
    path = (SHARED_DATA / relative).resolve()
    if not path.exists():
        pytest.skip(f"shared data {relative} not available")
    return path


@pytest.fixture
def model() -> Empatheia:
    return Empatheia.from_preset("tiny")


@pytest.fixture(scope="module")
def tiny_model() -> Empatheia:
    """One tiny model for all the tests of a module that only read it."""
    return Empatheia.from_preset("tiny")


@pytest.fixture
def answer_with(tiny_model, monkeypatch):
    """The command line answers (``respond``, ``eval``) with the module's tiny model instead
    of loading its own."""
    monkeypatch.setattr("empatheia.cli.load_system", lambda args: tiny_model)
    return tiny_model


def make_dialogue(turns: int = 3, audio: bool = True, video: bool = True, seed: int = 0, gold: bool = True) -> Dialogue:
    rng = np.random.default_rng(seed)
    texts = [
        "I finally got the keys to my first apartment today!",
        "That's wonderful! How does it feel?",
        "Honestly a bit scary, it's so quiet at night.",
        "It takes time to feel at home somewhere new.",
        "I keep wondering if I made the right choice.",
    ]
    out = []
    for i in range(turns):
        role = "speaker" if i % 2 == 0 else "listener"
        wave = rng.standard_normal(int(16000 * (0.6 + 0.2 * i))).astype(np.float32) * 0.1 if audio else None
        frames = rng.integers(0, 256, size=(6 + i, 40, 52, 3), dtype=np.uint8) if video else None
        out.append(Turn(role, texts[i % len(texts)], audio=wave, sample_rate=16000 if audio else None, video=frames))
    chain = ChainOfEmpathy(
        event_scenario="Moving into a first apartment alone.",
        speaker_emotion="anxious",
        emotion_cause="The new place feels quiet and unfamiliar.",
        goal_to_response="Reassure the speaker.",
    )
    return Dialogue(
        out,
        id=f"test-{seed}-{turns}",
        response="New places often feel strange at first; give it a few weeks." if gold else None,
        chain=chain if gold else None,
        listener_profile={"age": "young", "gender": "female", "timbre": "mid"},
    )


def add_generator_targets(model: Empatheia, batch: dict, seed: int = 0) -> dict:
    """Gold generator features and class labels, as the data pipeline would add them."""
    g = torch.Generator().manual_seed(seed)
    b = batch["input_ids"].shape[0]
    cs, sd = model.config.content_synchronizer, model.config.style_disentangler
    speech_len = torch.tensor([7, 5, 9, 4][:b])
    batch = dict(batch)
    mask = torch.arange(int(speech_len.max()))[None] < speech_len[:, None]
    batch["speech_content_target"] = torch.randn(b, int(speech_len.max()), cs.speech_content_dim, generator=g)
    batch["speech_content_mask"] = mask
    # C^v has one row per speech content unit, like C^s.
    batch["video_content_target"] = torch.randn(b, int(speech_len.max()), cs.video_content_dim, generator=g)
    batch["video_content_mask"] = mask.clone()
    if cs.unit_vocab_size > 0:
        batch["speech_units"] = torch.randint(0, cs.unit_vocab_size, (b, int(speech_len.max())), generator=g) * mask
    batch["speech_style_target"] = torch.randn(b, sd.speech_style_dim, generator=g)
    batch["video_style_target"] = torch.randn(b, sd.video_style_dim, generator=g)
    batch["emotion_label"] = torch.randint(0, len(sd.emotion_labels), (b,), generator=g)
    for name, values in sd.profile_labels.items():
        batch[f"{name}_label"] = torch.randint(0, len(values), (b,), generator=g)
    return batch


def full_batch(model: Empatheia, dialogues=None, seed: int = 0) -> dict:
    """A stage-4 layout batch (text, media placeholders, chain, response, signal tokens)
    with every gold target, usable by every stage."""
    dialogues = dialogues or [make_dialogue(3, seed=seed), make_dialogue(2, seed=seed + 1)]
    examples = [
        model.processor.encode(d, PromptMode.FULL, Target(response=d.response, chain=d.chain, signals=True))
        for d in dialogues
    ]
    return add_generator_targets(model, model.processor.collate(examples), seed)


# ---------------------------------------------------------------------- training
@pytest.fixture(scope="module")
def avatar(tmp_path_factory):
    """A four-dialogue avatar dataset with generated media and tiny gold features:
    ``(train.jsonl, gold feature folder)``."""
    from .training_helpers import extract_tiny_gold_features, write_avatar_dataset

    root = tmp_path_factory.mktemp("avatar")
    train = write_avatar_dataset(root)
    return train, extract_tiny_gold_features(train, root / "gold")


@pytest.fixture(scope="module")
def stage1_output(tmp_path_factory):
    """A saved tiny model standing in for a previous stage's output directory."""
    out = tmp_path_factory.mktemp("previous")
    Empatheia.from_preset("tiny").save_pretrained(out / "final")
    return out


def saved_before(folder: Path, section: str, option: str, value) -> Path:
    """A tiny model saved with ``<section>.<option>`` at ``value`` and its config saying
    nothing of it, as a model saved before the option existed: the folder."""
    Empatheia.from_preset("tiny", {f"{section}.{option}": value}).save_pretrained(folder / "old")
    config = folder / "old" / "config.yaml"
    line = f"  {option}: {str(value).lower()}\n"
    assert config.read_text().count(line) == 1, line
    config.write_text(config.read_text().replace(line, ""))
    return folder / "old"


def wav_bytes(seconds: float = 1.0, rate: int = 16000, seed: int = 0) -> bytes:
    """A WAV file's bytes: a voiced-sounding tone with noise."""
    import io

    import soundfile

    t = np.arange(int(seconds * rate)) / rate
    noise = np.random.default_rng(seed).normal(0, 0.02, t.shape)
    buffer = io.BytesIO()
    soundfile.write(buffer, (0.3 * np.sin(2 * np.pi * 180 * t) + noise).astype("float32"), rate, format="WAV")
    return buffer.getvalue()
