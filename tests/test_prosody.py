"""The prosody measures and edits of empatheia.generators.prosody on synthetic signals (numpy only)."""

from __future__ import annotations

import numpy as np
import pytest

from empatheia.generators import prosody

RATE = prosody.ANALYSIS_RATE


def resonate(x: np.ndarray, centre: float, bandwidth: float) -> np.ndarray:
    """``x`` through a two-pole resonance (a formant) at ``centre`` Hz."""
    radius = np.exp(-np.pi * bandwidth / RATE)
    a1, a2 = 2.0 * radius * np.cos(2.0 * np.pi * centre / RATE), -radius * radius
    y = np.zeros_like(x)
    for k in range(x.shape[0]):  # 16,000 samples
        y[k] = x[k] + a1 * (y[k - 1] if k else 0.0) + a2 * (y[k - 2] if k > 1 else 0.0)
    return y


def rough_vowel(f0: float = 110.0, jitter: float = 0.02, noise: float = 0.4, seconds: float = 1.0) -> np.ndarray:
    """A vowel whose glottal pulses wander by ``jitter`` of a period, with breath noise
    at ``noise`` of its level: periodic to the ear, but many frames miss YIN's strict
    threshold."""
    rng = np.random.default_rng(0)
    pulses = np.zeros(int(seconds * RATE))
    t = 0.0
    while t < seconds:
        pulses[int(t * RATE)] += 1.0 + 0.2 * rng.standard_normal()
        t += (1.0 + jitter * rng.standard_normal()) / f0
    voiced = resonate(resonate(pulses, 600.0, 100.0), 1500.0, 150.0)
    voiced /= voiced.std()
    return 0.1 * (voiced + noise * rng.standard_normal(voiced.shape[0]))


def test_rough_vowels_are_voiced_and_noise_is_not():
    """Voicing grows from the frames that pass the strict threshold into neighbours whose
    pitch continues theirs; with the strict threshold alone, a quarter of this vowel's
    frames were voiced."""
    f0 = prosody.pitch_track(rough_vowel(), RATE)
    assert np.mean(f0 > 0) > 0.7, np.mean(f0 > 0)
    assert abs(12.0 * np.log2(np.median(f0[f0 > 0]) / 110.0)) < 0.5
    noise = 0.1 * np.random.default_rng(1).standard_normal(RATE)
    assert np.mean(prosody.pitch_track(noise, RATE) > 0) < 0.05


def spoken_words(seconds: float = 1.4, word: float = 0.28) -> np.ndarray:
    """A harmonic "utterance" with a loudness dip every ``word`` seconds (20 dB down, no
    silence) and 0.2 s of silence around it: words without pauses."""
    t = np.arange(int(seconds * RATE)) / RATE
    x = np.sin(2 * np.pi * 150 * t) + 0.5 * np.sin(2 * np.pi * 300 * t) + 0.3 * np.sin(2 * np.pi * 450 * t)
    for centre in np.arange(word, seconds - 0.1, word):
        x *= 1.0 - 0.9 * np.exp(-0.5 * ((t - centre) / 0.02) ** 2)
    pad = np.zeros(int(0.2 * RATE))
    return np.concatenate([pad, 0.1 * x, pad])


@pytest.mark.parametrize("ratio", [0.08, 0.12, 0.2])
def test_pauses_opened_between_words_are_measured_as_asked(ratio):
    """A pause opened at a dip between words has no silent edges of its own: it is
    inserted at its whole length, so that it counts as a pause (with 40 ms taken off
    for edges it does not have, the 0.08 request measured no pause at all)."""
    words = spoken_words()
    assert prosody.measure_pause_ratio(words, RATE) == 0.0
    retimed = prosody.retime_pauses(words, RATE, ratio)
    assert abs(prosody.measure_pause_ratio(retimed, RATE) - ratio) < 0.03
    assert prosody.measure_pause_ratio(retimed, RATE) == prosody.measure(retimed, RATE).pause_ratio


def envelope_voice(shift: float, f0: float = 120.0, seconds: float = 1.0) -> np.ndarray:
    """Harmonics of ``f0`` shaped by the packaged voice's envelope moved up ``shift``
    semitones (with a -6 dB/octave tilt, and held flat beyond the grid)."""
    t = np.arange(int(seconds * RATE)) / RATE
    harmonics = f0 * np.arange(1, int(7800 / f0))
    level = np.interp(np.log2(harmonics) - shift / 12.0, np.log2(prosody.FORMANT_GRID), prosody.VOICE_ENVELOPE)
    level = level - 6.0 * np.log2(harmonics / 500.0)
    phases = np.random.default_rng(0).uniform(0.0, 2.0 * np.pi, harmonics.shape[0])
    x = np.sum(10.0 ** (level[:, None] / 20.0) * np.sin(2 * np.pi * harmonics[:, None] * t + phases[:, None]), axis=0)
    return 0.1 * x / x.std()


@pytest.mark.parametrize("shift", [-4.0, 0.0, 2.0, 4.0, 5.0])
def test_formant_shift_reads_a_moved_envelope(shift):
    assert abs(prosody.formant_shift(envelope_voice(shift)) - shift) < 0.3
