"""Small deterministic gold feature extractors and sources for the gold feature tests.

They do real (if simple) work on real files, batched the way a neural encoder would be,
so that the store is tested on the shapes, dtypes and failure modes it will meet:

- :class:`CharEmbedding` (text -> ``(L, D)`` float32): one fixed seeded vector per ASCII
  character; a character outside ASCII is a :class:`DataError`.
- :class:`LogEnergyStats` (audio -> ``(8,)`` float32): statistics of the frame log energy
  of a wav read with soundfile; audio shorter than one frame is a :class:`DataError`.
- :class:`FrameStats` (video -> ``(T, 6)`` float16): per-frame channel means and standard
  deviations of a ``(T, H, W, 3)`` uint8 ``.npy`` clip.

Each records the batches it was called with (``calls``) and, when the environment
variable ``EMPATHEIA_TEST_EXTRACTOR_DELAY`` holds a number of seconds, sleeps that long
per call, so that a test can kill an extraction in the middle.

Run as a script, it extracts features of :func:`make_sources` into a directory::

    python -m tests.gold_feature_extractors OUT_DIR --media-dir DIR --count 18 --shard-size 3
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np
import soundfile
import torch

from empatheia.errors import DataError
from empatheia.data.gold_features import FeatureSource, extract_gold_features

DELAY_ENV = "EMPATHEIA_TEST_EXTRACTOR_DELAY"
SAMPLE_RATE = 16000
PHRASES = [
    "That sounds really hard.",
    "I'm so glad it worked out!",
    "Take all the time you need.",
    "How did that make you feel?",
    "You did the right thing.",
]


class _Recording:
    """Keeps every batch of inputs the extractor was called with, and slows calls down
    when the test asks for it."""

    def _called(self, inputs: List) -> None:
        self.calls.append(list(inputs))
        delay = float(os.environ.get(DELAY_ENV) or 0)
        if delay > 0:
            time.sleep(delay)

    @property
    def seen(self) -> List:
        return [item for call in self.calls for item in call]


class CharEmbedding(_Recording):
    """Text -> ``(L, dim)`` float32, row ``i`` the fixed embedding of character ``i``."""

    input = "text"

    def __init__(self, name: str = "speech_content", dim: int = 16, seed: int = 0):
        self.name = name
        self.dim = dim
        self.seed = seed
        self.table = torch.randn(128, dim, generator=torch.Generator().manual_seed(seed))
        self.calls: List[List] = []

    def fingerprint(self) -> str:
        return f"char-embedding/v1 dim={self.dim} seed={self.seed}"

    def __call__(self, inputs: List[str]) -> List[torch.Tensor]:
        self._called(inputs)
        for text in inputs:
            for char in text:
                if ord(char) >= 128:
                    raise DataError(f"character {char!r} is outside the ASCII vocabulary")
        # Padded like a real text encoder's batch; the results are views into it.
        length = max(len(text) for text in inputs)
        ids = torch.zeros(len(inputs), length, dtype=torch.long)
        for row, text in enumerate(inputs):
            ids[row, : len(text)] = torch.tensor([ord(c) for c in text])
        embedded = self.table[ids]
        return [embedded[row, : len(text)] for row, text in enumerate(inputs)]


class LogEnergyStats(_Recording):
    """Wav file -> ``(8,)`` float32: mean, std, min, max and quartiles of the log energy of
    25 ms frames every 10 ms, and the duration in seconds."""

    input = "audio"
    frame = 400
    hop = 160

    def __init__(self, name: str = "speech_style"):
        self.name = name
        self.calls: List[List] = []

    def fingerprint(self) -> str:
        return f"log-energy-stats/v1 frame={self.frame} hop={self.hop}"

    def __call__(self, inputs: List[Path]) -> List[torch.Tensor]:
        self._called(inputs)
        rows = []
        for path in inputs:
            data, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
            wave = torch.from_numpy(data.mean(axis=1))
            if wave.numel() < self.frame:
                raise DataError(f"audio has {wave.numel()} samples, shorter than one {self.frame}-sample frame", file=path)
            energy = torch.log(wave.unfold(0, self.frame, self.hop).pow(2).mean(-1) + 1e-8)
            quartiles = torch.quantile(energy, torch.tensor([0.25, 0.5, 0.75]))
            seconds = torch.tensor([wave.numel() / rate])
            rows.append(torch.cat([energy.mean()[None], energy.std()[None], energy.min()[None], energy.max()[None], quartiles, seconds]))
        stacked = torch.stack(rows).float()
        return list(stacked)


class FrameStats(_Recording):
    """``(T, H, W, 3)`` uint8 ``.npy`` clip -> ``(T, 6)`` float16: per frame, the channel
    means then the channel standard deviations, scaled to [0, 1]."""

    input = "video"

    def __init__(self, name: str = "video_content"):
        self.name = name
        self.calls: List[List] = []

    def fingerprint(self) -> str:
        return "frame-stats/v1 float16"

    def __call__(self, inputs: List[Path]) -> List[torch.Tensor]:
        self._called(inputs)
        out = []
        for path in inputs:
            frames = torch.from_numpy(np.load(path)).float() / 255.0
            flat = frames.flatten(1, 2)  # (T, H * W, 3)
            out.append(torch.cat([flat.mean(1), flat.std(1)], dim=-1).to(torch.float16))
        return out


def default_extractors() -> List:
    return [CharEmbedding(), LogEnergyStats(), FrameStats()]


def write_wav(path: Path, seconds: float, seed: int) -> Path:
    """A short tone in noise, 16 kHz mono."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(SAMPLE_RATE * seconds)) / SAMPLE_RATE
    wave = 0.3 * np.sin(2 * np.pi * (180 + 20 * seed) * t) * np.linspace(0.2, 1.0, t.size) + 0.02 * rng.standard_normal(t.size)
    soundfile.write(str(path), wave.astype(np.float32), SAMPLE_RATE)
    return path


def write_clip(path: Path, frames: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    np.save(path, rng.integers(0, 256, size=(frames, 6, 8, 3), dtype=np.uint8))
    return path


def make_sources(media_dir: Path, count: int) -> List[FeatureSource]:
    """``count`` sources keyed like ``"00001/2"``, each with text, a wav and a clip in
    ``media_dir``. Files already there are kept, so that repeated calls (the test and its
    subprocess) describe the same sources."""
    media_dir = Path(media_dir)
    media_dir.mkdir(parents=True, exist_ok=True)
    sources = []
    for i in range(count):
        audio, video = media_dir / f"response-{i:03d}.wav", media_dir / f"response-{i:03d}.npy"
        if not audio.exists():
            write_wav(audio, 0.1 + 0.03 * (i % 7), seed=i)
        if not video.exists():
            write_clip(video, 2 + i % 5, seed=i)
        text = f"{PHRASES[i % len(PHRASES)]} ({i})"
        sources.append(FeatureSource(f"{i // 3:05d}/{i % 3}", text=text, audio=audio, video=video))
    return sources


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir", type=Path)
    parser.add_argument("--media-dir", type=Path, required=True)
    parser.add_argument("--count", type=int, default=18)
    parser.add_argument("--shard-size", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--on-error", choices=["raise", "skip"], default="raise")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    store = extract_gold_features(
        make_sources(args.media_dir, args.count),
        default_extractors(),
        args.output_dir,
        shard_size=args.shard_size,
        batch_size=args.batch_size,
        on_error=args.on_error,
        progress=not args.no_progress,
    )
    print(f"{len(store)} samples stored, {len(store.skipped)} skipped, in {args.output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
