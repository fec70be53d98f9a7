"""How well the offline generators realise a requested style: request, synthesise or
render, measure back, compare.

    python bench/bench_style_realisation.py [--quick] [--only speech|video]

For each emotion at a few intensities, over avatar profiles (child, young, middle-aged,
elderly; female, male; high, mid, low timbre), the S^s request is the training data's
(``empatheia.data.render.speech_style``: the emotion's prosody on the profile's register)
spoken by the plain voice (which realises the request alone), and the S^v request is
``render.video_style`` (emotion, intensity, gaze, head motion) rendered over the profile's
default portrait. Prints each request's cosine with what is measured back, and per
dimension the mean absolute error (z units for S^s, style units for S^v).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from empatheia.data.render import speech_style, video_style  # noqa: E402
from empatheia.generators.avatar_face import EMOTIONS, default_portrait  # noqa: E402
from empatheia.generators.avatar_renderer import FULL_STYLE_WIDTH, AvatarRenderer  # noqa: E402
from empatheia.generators.base import Avatar  # noqa: E402
from empatheia.generators.piper_speech import DESCRIPTORS, PiperSpeech  # noqa: E402

TEXTS = (
    "I hear you. That sounds really hard, and it makes sense to feel that way.",
    "Oh wow, that is wonderful news! You must be so proud of yourself.",
)
PROFILES = (
    {"age": "child", "gender": "female", "timbre": "high"},
    {"age": "young", "gender": "female", "timbre": "mid"},
    {"age": "middle-aged", "gender": "male", "timbre": "mid"},
    {"age": "elderly", "gender": "male", "timbre": "low"},
)
VIDEO_DIMS = [f"w_{e}" for e in EMOTIONS] + ["intensity", "gaze_x", "gaze_y", "head_motion"]


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a[None], b[None]).item())


def table(name: str, dims, rows) -> None:
    requested = torch.stack([r[1] for r in rows])
    realised = torch.stack([r[2] for r in rows])
    cosines = np.array([cosine(a, b) for _, a, b in rows])
    print(f"\n{name}: {len(rows)} requests")
    for label, a, b in rows:
        print(f"  {label:<40s} cos {cosine(a, b):.3f}")
    error = (realised - requested).abs().mean(dim=0)
    worst = (realised - requested).abs().max(dim=0).values
    print(f"  {'dim':<12s} {'mean |err|':>10s} {'max |err|':>10s} {'requested range':>18s}")
    for i, dim in enumerate(dims):
        span = f"{float(requested[:, i].min()):+.2f} .. {float(requested[:, i].max()):+.2f}"
        print(f"  {dim:<12s} {float(error[i]):10.3f} {float(worst[i]):10.3f} {span:>18s}")
    print(f"  cosine: mean {cosines.mean():.3f}, min {cosines.min():.3f}, share >= 0.9: {np.mean(cosines >= 0.9):.2f}")


def speech_table(speech: PiperSpeech, plain: Avatar, intensities) -> None:
    """Each emotion's S^s at ``intensities`` over the profiles, spoken by the plain voice."""
    width = len(DESCRIPTORS)
    rows, started = [], time.perf_counter()
    for e, emotion in enumerate(EMOTIONS):
        for k, intensity in enumerate(intensities):
            profile = PROFILES[(e + k) % len(PROFILES)]
            request = speech_style(emotion, intensity, 16, profile)
            wave = speech.synthesize(TEXTS[(e + k) % len(TEXTS)], None, request, plain)
            label = f"{emotion} {intensity:.1f} {profile['age']}/{profile['gender']}/{profile['timbre']}"
            rows.append((label, request[:width], speech.measure(wave)[:width]))
    table(f"S^s (Piper, plain voice; {time.perf_counter() - started:.0f} s)", DESCRIPTORS, rows)


def video_table(speech: PiperSpeech, plain: Avatar, intensities) -> None:
    """Each emotion's S^v at ``intensities``, rendered over the profiles' portraits (the
    mouth driven by the plain voice's speech)."""
    renderer = AvatarRenderer(content_dim=32, style_dim=16)
    spoken = speech.synthesize(TEXTS[0], None, torch.zeros(16), plain)
    portraits = [default_portrait(p, seed) for seed, p in enumerate(PROFILES)]
    rows, started = [], time.perf_counter()
    for e, emotion in enumerate(EMOTIONS):
        for k, intensity in enumerate(intensities):
            request = video_style(emotion, intensity, 16)
            frames = renderer.animate(spoken, None, request, portraits[(e + k) % len(portraits)]).frames.numpy()
            rows.append((f"{emotion} {intensity:.1f}", request[:FULL_STYLE_WIDTH], renderer.measure(frames)[:FULL_STYLE_WIDTH]))
    table(f"S^v (avatar renderer; {time.perf_counter() - started:.0f} s)", VIDEO_DIMS, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one intensity per emotion")
    parser.add_argument("--only", choices=("speech", "video"), default=None, help="measure one generator alone")
    args = parser.parse_args()
    speech = PiperSpeech(content_dim=64, style_dim=16)
    plain = Avatar("plain", np.zeros((8, 8, 3), np.uint8), "en_US-joe-medium", {})
    if args.only != "video":
        speech_table(speech, plain, (0.8,) if args.quick else (0.5, 1.0))
    if args.only != "speech":
        video_table(speech, plain, (0.8,) if args.quick else (0.4, 0.7, 1.0))


if __name__ == "__main__":
    main()
