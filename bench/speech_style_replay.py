"""Re-score a model run's speech style agreement without the language model: each
answer's text is spoken again by the offline speech generator with the S^s the model
requested and the avatar that answered, measured back, and compared.

    python bench/speech_style_replay.py RUN/predictions.jsonl [--limit N] [--stored]

``predictions.jsonl`` is what ``empatheia eval --animate`` (or ``--speak``) writes: per
answer its ``text``, ``avatar`` key, requested ``speech_style`` and, from that run,
``speech_style_realised``. Avatars are rebuilt from their keys as the model's registry
makes them when none is registered (``profile-<age>-<gender>-<timbre>``: the default
voice of that profile; ``id-<ID>``: the default voice without a profile). The realised
style is measured as the evaluation measures it, through a 16-bit WAV file.

Prints the cosine of requested and realised S^s (mean, share >= 0.9) and the mean
absolute error per descriptor (z units), for the replay and, with ``--stored``, for the
``speech_style_realised`` the run stored, side by side.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import List, Sequence

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from empatheia.evaluation.speech import realised_style, style_agreement  # noqa: E402
from empatheia.generators.avatars import _PROFILE_KEYS  # noqa: E402
from empatheia.generators.base import Avatar  # noqa: E402
from empatheia.generators.piper_speech import DESCRIPTORS, VOICE_NAME, PiperSpeech  # noqa: E402


PLAIN = Avatar(key="plain", portrait=np.zeros((1, 1, 3), np.uint8), voice=VOICE_NAME, profile={})


def avatar_from_key(key: str) -> Avatar:
    """The default-voice avatar the registry makes for ``key`` (its seed is the key's)."""
    profile = {}
    if key.startswith("profile-"):
        values = key[len("profile-"):].split("-")
        profile = {name: value for name, value in zip(_PROFILE_KEYS, values) if value != "any"}
    return Avatar(key=key, portrait=np.zeros((1, 1, 3), np.uint8), voice="default", profile=profile)


def summary(name: str, requested: np.ndarray, realised: np.ndarray) -> None:
    """One line of cosine statistics and the per-descriptor mean absolute error, for
    ``requested`` and ``realised`` ``(N, style_dim)``."""
    cosines = style_agreement(requested, realised).per_item_cosine
    error = np.abs(requested - realised).mean(axis=0)
    per_dim = "  ".join(f"{dim} {error[i]:.3f}" for i, dim in enumerate(DESCRIPTORS))
    print(f"{name:<8s} cosine mean {cosines.mean():.3f}, min {cosines.min():+.3f}, share >= 0.9 "
          f"{np.mean(cosines >= 0.9):.2f} | mean |err| (z): {per_dim}")


def main(argv: Sequence[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("predictions", type=Path, help="predictions.jsonl of a run with speech")
    parser.add_argument("--limit", type=int, default=None, help="only the first N answers with a style")
    parser.add_argument("--stored", action="store_true", help="also score the run's stored realised styles")
    parser.add_argument("--plain", action="store_true",
                        help="speak every request with the plain voice (no avatar register), to separate what "
                             "the register band holds back from what synthesis and measurement lose")
    parser.add_argument("--verbose", action="store_true", help="print each answer's request and realisation")
    args = parser.parse_args(argv)

    rows = [json.loads(line) for line in args.predictions.read_text().splitlines() if line.strip()]
    rows = [row for row in rows if row.get("speech_style") and row.get("text")][: args.limit]
    if not rows:
        raise SystemExit(f"{args.predictions}: no prediction has both a text and a speech_style")
    style_dim = len(rows[0]["speech_style"])
    speech = PiperSpeech(style_dim=style_dim)
    requested: List[np.ndarray] = []
    replayed: List[np.ndarray] = []
    started = time.perf_counter()
    for row in rows:
        style = torch.tensor(row["speech_style"], dtype=torch.float32)
        avatar = PLAIN if args.plain else avatar_from_key(row.get("avatar", "profile-any-any-any"))
        wave = speech.synthesize(row["text"], None, style, avatar)
        realised = realised_style(speech, wave)
        requested.append(style.numpy())
        replayed.append(realised.numpy())
        if args.verbose:
            shown = len(DESCRIPTORS)
            pairs = " ".join(f"{a:+.2f}/{b:+.2f}" for a, b in zip(style[:shown].tolist(), realised[:shown].tolist()))
            cos = style_agreement(style, realised).cosine
            print(f"  {cos:+.2f}  {pairs}  {row['text'][:50]!r}")
    elapsed = time.perf_counter() - started
    requested_arr = np.stack(requested).astype(np.float64)
    print(f"{len(rows)} answers from {args.predictions} (replayed in {elapsed:.0f} s; request/realised in z, "
          f"dims {', '.join(DESCRIPTORS)})")
    if args.stored:
        stored = np.array([row["speech_style_realised"] for row in rows], dtype=np.float64)
        summary("stored", requested_arr, stored)
    summary("replay", requested_arr, np.stack(replayed).astype(np.float64))


if __name__ == "__main__":
    main()
