"""Replay a model run's speech style requests through Piper, without the language model:
each answer's text is spoken again with the S^s the model requested and the avatar that
answered, measured back as ``empatheia eval --animate`` measures it, and compared.

    python bench/speech_style_replay.py RUN/predictions.jsonl [--limit N] [--stored]
        [--plain] [--verbose] [--steer DELTA]

``predictions.jsonl`` is what ``empatheia eval --speak`` or ``--animate`` writes: per
answer its ``text``, ``avatar`` key, the requested ``speech_style`` and, from that run,
``speech_style_realised``. Avatars are rebuilt from their keys as the model's registry
makes them when none is registered (``profile-<age>-<gender>-<timbre>``: the default
voice of that profile; ``id-<ID>``: the default voice without a profile). The realised
style is :func:`empatheia.evaluation.speech.realised_style`, through a 16-bit WAV file.

Prints, over all S^s dims (what the evaluation reports):

* the cosine of requested and realised S^s (mean, min, share >= 0.9), with ``--stored``
  also for the ``speech_style_realised`` the run stored (a replay of the same code gives
  the same numbers), and the ceiling: the cosine if every descriptor were realised
  exactly and the dims no descriptor holds came back 0, as they must;
* per dim: the range and mean of the requests, the mean realisation, the mean absolute
  error (z) on and off the frame grid (below), how far the two readings of one waveform
  differ, and the correlation of realisation with request over the answers;
* ``off-grid``: the cosine when the same waveforms are measured 3.3 ms later (a third of
  an analysis hop, so every frame boundary moves): a realisation that only fits the
  measure's frame grid, not the voice, loses agreement there;
* the voice's quality beside Piper's own output for the same texts (tempo 1, nothing
  changed): the highest peak (dBFS), samples at or over full scale, the spectral
  flatness of the speaking frames (median; higher is noisier, lower on unvoiced frames
  is buzzier), the share of 10 ms steps between voiced frames where the pitch jumps by
  more than :data:`JUMP_ST` semitones, and the largest step between digital silence
  and sound (:func:`silence_step`, dB re the peak: a click where speech is cut);
* alignment faults: answers whose ``alignment`` misses a unit, runs backwards or does
  not cover the samples (the talking head's lip sync rests on it).

``--steer DELTA`` asks, for every S^s dim in turn, ``DELTA`` z more and less than each
answer's request and prints how far each dim's realisation moves per requested z (the
steered dim itself, and the most any other dim moves), and on how many answers the
waveform changed at all: which dims reach the voice.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from empatheia.evaluation.speech import realised_style, style_agreement  # noqa: E402
from empatheia.generators import prosody  # noqa: E402
from empatheia.generators.avatars import _PROFILE_KEYS  # noqa: E402
from empatheia.generators.base import Avatar, Waveform  # noqa: E402
from empatheia.generators.piper_speech import DESCRIPTORS, VOICE_NAME, PiperSpeech  # noqa: E402

PLAIN = Avatar(key="plain", portrait=np.zeros((1, 1, 3), np.uint8), voice=VOICE_NAME, profile={})
OFF_GRID = 0.0033
"""Seconds of silence put before a waveform to measure it off the analysis frame grids:
a third of a hop, on none of the grids the measures pool."""
JUMP_ST = 2.0
"""Pitch step (semitones per 10 ms) counted as a jump: above what intonation moves."""


def avatar_from_key(key: str) -> Avatar:
    """The default-voice avatar the registry makes for ``key`` (its seed is the key's)."""
    profile = {}
    if key.startswith("profile-"):
        values = key[len("profile-"):].split("-")
        profile = {name: value for name, value in zip(_PROFILE_KEYS, values) if value != "any"}
    return Avatar(key=key, portrait=np.zeros((1, 1, 3), np.uint8), voice="default", profile=profile)


def cosines(requested: np.ndarray, realised: np.ndarray) -> np.ndarray:
    """``(N,)`` per-answer cosines of ``(N, D)`` styles, as the evaluation computes them."""
    return style_agreement(requested, realised).per_item_cosine


def cosine_line(name: str, requested: np.ndarray, realised: np.ndarray) -> str:
    found = cosines(requested, realised)
    return f"{name:<9s} cosine mean {found.mean():.3f}, min {found.min():+.3f}, share >= 0.9 {np.mean(found >= 0.9):.2f}"


def per_dim_table(requested: np.ndarray, realised: np.ndarray, off_grid: np.ndarray) -> None:
    """Range and mean of the requests, mean realisation, mean |error| (on and off the frame
    grid), how far the two measurements of one waveform differ, and the correlation of
    realisation with request, per descriptor dim (the dims past the descriptors only as
    their largest request); ``(N, D)`` each."""
    print(f"  {'dim':<12s} {'req range':>13s} {'req mean':>9s} {'real mean':>9s} {'|err| z':>8s} {'off-grid':>8s} "
          f"{'|grid diff|':>11s} {'corr':>6s}")
    for i, name in enumerate(DESCRIPTORS[: requested.shape[1]]):
        a, b, c = requested[:, i], realised[:, i], off_grid[:, i]
        corr = float(np.corrcoef(a, b)[0, 1]) if a.std() > 1e-9 and b.std() > 1e-9 else float("nan")
        span = f"{a.min():+.2f}..{a.max():+.2f}"
        print(f"  {name:<12s} {span:>13s} {a.mean():+9.3f} {b.mean():+9.3f} {np.abs(a - b).mean():8.3f} "
              f"{np.abs(a - c).mean():8.3f} {np.abs(b - c).mean():11.3f} {corr:6.2f}")
    rest = requested[:, len(DESCRIPTORS):]
    if rest.size:
        print(f"  dims {len(DESCRIPTORS)}-{requested.shape[1] - 1}: no descriptor; largest |request| {np.abs(rest).max():.3f}, "
              f"largest |realised| {np.abs(realised[:, len(DESCRIPTORS):]).max():.3f}")


def spectral_flatness(x: np.ndarray, sample_rate: int) -> np.ndarray:
    """``(N,)`` Wiener entropy (geometric over arithmetic mean of the power spectrum,
    100 Hz - 7 kHz) of each 32 ms frame of ``x`` ``(T,)``, one per analysis hop."""
    length = 512
    block = prosody.frames(x, length, int(round(prosody.HOP * sample_rate))) * np.hanning(length)
    power = np.abs(np.fft.rfft(block, length)) ** 2 + 1e-12
    freqs = np.fft.rfftfreq(length, 1.0 / sample_rate)
    band = power[:, (freqs >= 100.0) & (freqs <= 7000.0)]
    return np.exp(np.mean(np.log(band), axis=1)) / np.mean(band, axis=1)


def silence_step(x: np.ndarray, sample_rate: int) -> float:
    """The largest step (dB re the peak; -120 when there is none) between digital
    silence, runs of exact zeros of at least 1 ms such as inserted pauses and sentence
    gaps, and the sound on either side of it, in ``x`` ``(T,)``: speech cut off or
    started at full level there clicks."""
    silent = x == 0.0
    starts, ends = prosody.runs(silent)
    keep = (ends - starts) >= sample_rate // 1000
    edges = np.concatenate([starts[keep] - 1, ends[keep]])
    edges = edges[(edges >= 0) & (edges < x.shape[0])]
    step = np.abs(x[edges]).max() if edges.size else 0.0
    return float(20.0 * np.log10(max(step, 1e-6) / (np.abs(x).max() + 1e-12)))


def quality(wave: np.ndarray, sample_rate: int) -> Dict[str, float]:
    """Peak, full-scale samples, flatness of voiced and unvoiced speaking frames, pitch
    jumps and the largest step into silence of one ``(T,)`` waveform."""
    x = prosody.resample(wave, sample_rate / prosody.ANALYSIS_RATE) if sample_rate != prosody.ANALYSIS_RATE else wave
    # All three are per analysis hop over the same samples: (N,) each.
    f0 = prosody.pitch_track(x, prosody.ANALYSIS_RATE)
    speaking = prosody.speech_mask(prosody.frame_db(x, prosody.ANALYSIS_RATE))
    flat = spectral_flatness(x, prosody.ANALYSIS_RATE)
    voiced = f0 > 0
    steps = np.abs(np.diff(prosody.semitones(f0)))[voiced[1:] & voiced[:-1]]
    return {
        "peak_dbfs": float(20.0 * np.log10(np.abs(wave).max() + 1e-12)),
        "full_scale": float(np.sum(np.abs(wave) >= 1.0)),
        "flat_voiced": float(np.median(flat[speaking & voiced])) if (speaking & voiced).any() else float("nan"),
        "flat_unvoiced": float(np.median(flat[speaking & ~voiced])) if (speaking & ~voiced).any() else float("nan"),
        "jumps": float(np.mean(steps > JUMP_ST)) if steps.size else 0.0,
        "silence_step_db": silence_step(wave, sample_rate),
    }


def alignment_fault(wave: Waveform, units: int) -> Optional[str]:
    """What is wrong with ``wave.alignment`` for a text of ``units`` content units, or None."""
    labels = wave.alignment.numpy()
    if labels.shape != wave.samples.shape:
        return f"{labels.shape[0]} labels for {wave.samples.shape[0]} samples"
    spoken = labels[labels >= 0]
    if not np.array_equal(np.unique(spoken), np.arange(units)):
        return f"units {sorted(set(range(units)) - set(spoken.tolist()))[:5]} do not sound"
    if np.any(np.diff(spoken) < 0):
        return "the units run backwards"
    return None


def quality_table(raw: List[Dict[str, float]], made: List[Dict[str, float]]) -> None:
    print(f"  {'':<14s} {'peak dBFS':>10s} {'full scale':>10s} {'flat voiced':>11s} {'flat unvoiced':>13s} "
          f"{'pitch jumps':>11s} {'silence step':>12s}")
    for name, rows in (("Piper alone", raw), ("replayed", made)):
        peak = max(r["peak_dbfs"] for r in rows)
        full = sum(r["full_scale"] for r in rows)
        print(f"  {name:<14s} {peak:10.2f} {full:10.0f} {np.nanmedian([r['flat_voiced'] for r in rows]):11.4f} "
              f"{np.nanmedian([r['flat_unvoiced'] for r in rows]):13.4f} {np.mean([r['jumps'] for r in rows]):11.4f} "
              f"{max(r['silence_step_db'] for r in rows):12.1f}")


def steer(speech: PiperSpeech, rows: List[dict], avatars: List[Avatar], delta: float) -> None:
    """For every S^s dim, each answer's request with ``delta`` z more and less on that dim:
    realised movement per requested z on the dim itself and the most on any other."""
    style_dim = speech.features.style_dim
    print(f"\nsteering: each dim's request moved by +-{delta} z on {len(rows)} answers")
    print(f"  {'dim':<12s} {'own slope':>9s} {'sd':>6s} {'max other':>9s} {'changed':>8s}")
    for dim in range(style_dim):
        own, other, changed = [], [], 0
        for row, avatar in zip(rows, avatars):
            base = torch.tensor(row["speech_style"], dtype=torch.float32)
            up, down = base.clone(), base.clone()
            up[dim] += delta
            down[dim] -= delta
            high, low = (speech.synthesize(row["text"], None, style, avatar) for style in (up, down))
            same = high.samples.shape == low.samples.shape and torch.equal(high.samples, low.samples)
            changed += not same
            moved = ((realised_style(speech, high) - realised_style(speech, low)) / (2.0 * delta)).numpy()
            own.append(moved[dim])
            other.append(np.abs(np.delete(moved, dim)).max())
        name = DESCRIPTORS[dim] if dim < len(DESCRIPTORS) else f"dim {dim}"
        print(f"  {name:<12s} {np.mean(own):+9.3f} {np.std(own):6.3f} {np.mean(other):9.3f} {changed:>4d}/{len(rows)}")


def main(argv: Sequence[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("predictions", type=Path, help="predictions.jsonl of a run with speech")
    parser.add_argument("--limit", type=int, default=None, help="only the first N answers with a style")
    parser.add_argument("--stored", action="store_true", help="also score the run's stored realised styles")
    parser.add_argument("--plain", action="store_true",
                        help="speak every request with the plain voice (no avatar register), to separate what "
                             "the register band holds back from what synthesis and measurement lose")
    parser.add_argument("--verbose", action="store_true", help="print each answer's request and realisation")
    parser.add_argument("--steer", type=float, default=None, metavar="DELTA",
                        help="also move each dim's request by +-DELTA z and measure what moves")
    args = parser.parse_args(argv)

    rows = [json.loads(line) for line in args.predictions.read_text().splitlines() if line.strip()]
    rows = [row for row in rows if row.get("speech_style") and row.get("text")][: args.limit]
    if not rows:
        raise SystemExit(f"{args.predictions}: no prediction has both a text and a speech_style")
    speech = PiperSpeech(style_dim=len(rows[0]["speech_style"]))
    avatars = [PLAIN if args.plain else avatar_from_key(row.get("avatar", "profile-any-any-any")) for row in rows]
    requested, realised, off_grid, raw_quality, made_quality, faults = [], [], [], [], [], []
    started = time.perf_counter()
    for row, avatar in zip(rows, avatars):
        style = torch.tensor(row["speech_style"], dtype=torch.float32)
        wave = speech.synthesize(row["text"], None, style, avatar)
        got = realised_style(speech, wave)
        late = torch.cat([torch.zeros(int(round(OFF_GRID * wave.sample_rate))), wave.samples])
        requested.append(style.numpy())
        realised.append(got.numpy())
        off_grid.append(realised_style(speech, Waveform(late, wave.sample_rate)).numpy())
        # Piper's own output for the text, the reference of what the voice sounds like.
        sentences = [ids for ids in speech._phoneme_ids(row["text"]) if ids]
        raw, _ = speech._piper(sentences, 1.0, avatar.seed())
        raw_quality.append(quality(raw, speech.sample_rate))
        made_quality.append(quality(wave.samples.numpy().astype(np.float64), wave.sample_rate))
        fault = alignment_fault(wave, speech.content_length(row["text"]))
        if fault:
            faults.append(f"{row.get('id', row['text'][:30])}: {fault}")
        if args.verbose:
            pairs = " ".join(f"{a:+.2f}/{b:+.2f}" for a, b in zip(style[: len(DESCRIPTORS)].tolist(), got.tolist()))
            print(f"  {cosines(style.numpy()[None], got.numpy()[None])[0]:+.2f}  {pairs}  {row['text'][:50]!r}")
    elapsed = time.perf_counter() - started
    requested_arr, realised_arr = np.stack(requested).astype(np.float64), np.stack(realised).astype(np.float64)
    ceiling = requested_arr.copy()
    ceiling[:, len(DESCRIPTORS):] = 0.0
    print(f"{len(rows)} answers from {args.predictions}, {'plain voice' if args.plain else 'their avatars'} "
          f"(replayed in {elapsed:.0f} s; S^s in z, {requested_arr.shape[1]} dims)")
    if args.stored:
        print(cosine_line("stored", requested_arr, np.array([row["speech_style_realised"] for row in rows], np.float64)))
    print(cosine_line("replay", requested_arr, realised_arr))
    off_grid_arr = np.stack(off_grid).astype(np.float64)
    print(cosine_line("off-grid", requested_arr, off_grid_arr))
    print(cosine_line("ceiling", requested_arr, ceiling))
    per_dim_table(requested_arr, realised_arr, off_grid_arr)
    print("voice quality (answers' median flatness, mean jump share, largest peak and silence step, all full-scale samples):")
    quality_table(raw_quality, made_quality)
    print(f"alignment faults: {len(faults)} of {len(rows)}" + "".join(f"\n  {fault}" for fault in faults))
    if args.steer is not None:
        steer(speech, rows, avatars, args.steer)


if __name__ == "__main__":
    main()
