"""Measuring and changing the prosody of a speech waveform, with numpy only.

What :class:`empatheia.generators.piper_speech.PiperSpeech` reads from a recording (its gold speech
style) and what it steers when it speaks are the same five quantities, measured here:

* ``rate``: spectral change events per second of speaking time (pauses left out), about
  one per phone boundary (:func:`change_rate`); counting them needs no transcript,
  and the count follows the tempo.
* ``pitch_hz``: median fundamental frequency of the voiced frames (YIN, below).
* ``pitch_range``: spread of the pitch in semitones (1.4826 x the median absolute
  deviation: the standard deviation for a normal spread, robust to octave errors).
* ``energy_db``: loudness of the speaking frames, ``10 log10(mean power)`` in dBFS.
* ``pause_ratio``: share of the utterance (first to last speaking frame) that is pauses,
  i.e. silent runs of at least :data:`MIN_PAUSE` seconds (shorter gaps are stop
  closures inside words).
* ``formant_st``: how far the voice's spectral envelope sits above the packaged Piper
  voice's, in semitones (:func:`formant_shift`): a shorter vocal tract (a child, most
  women) raises every formant by the same factor, which moves the long-term envelope
  along a log-frequency axis without changing its shape. It does not follow the pitch.

Everything is measured on 10 ms frames (:data:`HOP`); the rate, pitch and pauses pool
:data:`GRID_PHASES` frame grids offset by a fraction of a hop, so that where the frame
boundaries fall does not move them. The changing side holds a pitch-synchronous
overlap-add pitch shifter (:func:`shift_pitch`), band-limited resampling
(:func:`resample`), pause re-timing (:func:`retime_pauses`) and a gain with a peak
limiter (:func:`set_energy`), and the closed loops that aim the pitch shift and the
pause re-timing at what the measures read (:func:`set_pitch`, :func:`set_pauses`).
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import List, Optional, Tuple

import numpy as np

HOP = 0.01
"""Seconds between analysis frames."""
WINDOW = 0.03
"""Seconds of signal in each energy frame."""
MIN_PAUSE = 0.1
"""Shortest silence (s) that counts as a pause."""
CLOSED_PAUSE = 0.05
"""Seconds a pause that :func:`pause_edit` closes is left with (a gap that does not count)."""
SPEECH_FLOOR_DB = 30.0
"""A frame speaks when it is within this many dB of the utterance's loud frames."""
F0_MIN, F0_MAX = 60.0, 500.0
"""The pitch search range (Hz): low male to child voices."""
FLUX_PROMINENCE = 5.0
"""How far a spectral-flux peak (dB, over 24 mel bands) must rise above its neighbouring
dips to count as a change event (see :func:`change_rate`)."""
FLUX_SOFTNESS = 1.5
"""Width of the soft threshold at :data:`FLUX_PROMINENCE`."""
ANALYSIS_RATE = 16000
"""Every measurement resamples to this rate first, so that a file's own rate does not
change what is measured."""


@dataclass(frozen=True)
class Prosody:
    """The measured prosody of one utterance (see the module docstring for each field)."""

    rate: float
    pitch_hz: float
    pitch_range: float
    energy_db: float
    pause_ratio: float
    formant_st: float = 0.0

    def as_array(self) -> np.ndarray:
        return np.asarray(astuple(self), dtype=np.float64)


# ------------------------------------------------------------------------ framing
def frames(x: np.ndarray, length: int, hop: int) -> np.ndarray:
    """``(T,)`` -> ``(N, length)`` overlapping frames starting every ``hop`` samples; the
    signal is zero-padded so that frame ``i`` is centred on sample ``i * hop``."""
    count = max(1, int(np.ceil(x.shape[0] / hop)))
    padded = np.zeros(count * hop + length, dtype=np.float64)
    start = length // 2
    padded[start : start + x.shape[0]] = x
    return np.lib.stride_tricks.sliding_window_view(padded, length)[::hop][:count]


def frame_db(x: np.ndarray, sample_rate: int, hop: float = HOP, window: float = WINDOW) -> np.ndarray:
    """``(T,)`` -> ``(N,)`` frame power in dB (floor -100 dB), one frame per ``hop`` s."""
    block = frames(x, max(1, int(round(window * sample_rate))), max(1, int(round(hop * sample_rate))))
    return 10.0 * np.log10(np.mean(block**2, axis=1) + 1e-10)


def speech_mask(db: np.ndarray) -> np.ndarray:
    """``(N,)`` bool: frames within :data:`SPEECH_FLOOR_DB` of the loud frames (the 95th
    percentile, so a single click does not set the scale); relative, so gain-invariant."""
    loud = np.percentile(db, 95)
    return db > max(loud - SPEECH_FLOOR_DB, -70.0)


def runs(mask: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Starts and (exclusive) ends of the runs of True in a ``(N,)`` bool mask."""
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)


def pauses(db: np.ndarray, hop: float = HOP) -> Tuple[np.ndarray, np.ndarray, int, int]:
    """The pauses inside an utterance: ``(starts, ends, first, last)`` in frames, where
    ``first``/``last`` bound the speaking span and each pause is a silent run of at least
    :data:`MIN_PAUSE` strictly inside it."""
    speaking = speech_mask(db)
    voiced_frames = np.flatnonzero(speaking)
    if voiced_frames.size == 0:
        return np.zeros(0, int), np.zeros(0, int), 0, 0
    first, last = int(voiced_frames[0]), int(voiced_frames[-1]) + 1
    starts, ends = runs(~speaking[first:last])
    keep = (ends - starts) * hop >= MIN_PAUSE - 1e-9
    return starts[keep] + first, ends[keep] + first, first, last


# ------------------------------------------------------------------------ pitch
def pitch_track(
    x: np.ndarray, sample_rate: int, hop: float = HOP, threshold: float = 0.25
) -> np.ndarray:
    """YIN fundamental frequency: ``(T,)`` -> ``(N,)`` Hz per ``hop`` frame, 0 where unvoiced.

    For every frame the difference function ``d(tau) = sum_j (x_j - x_{j+tau})^2`` over an
    integration window is built from one FFT cross-correlation and two running energy
    sums, for all frames at once; the period is the first dip of the cumulative-mean-
    normalised ``d`` below ``threshold``, refined by a parabola through its neighbours.

    Voicing has hysteresis (:func:`_grow_voicing`): a frame whose deepest dip is only
    under :data:`VOICING_RELAXED` is voiced too when its pitch continues that of a voiced
    neighbour. Rough or breathy vowels (many of the packaged Piper voice's vowel
    frames) fail the strict threshold, and which of them pass flips with any processing,
    so statistics over the strict frames alone jump on short utterances.
    """
    tau_min = int(sample_rate / F0_MAX)
    tau_max = int(np.ceil(sample_rate / F0_MIN))
    width = tau_max  # integration window: one longest period
    block = frames(x, width + tau_max + 1, max(1, int(round(hop * sample_rate))))  # (N, L)
    n_fft = 1 << int(np.ceil(np.log2(block.shape[1] + width)))
    head = np.fft.rfft(block[:, :width], n_fft)
    whole = np.fft.rfft(block, n_fft)
    # r[tau] = sum_{j < width} x_j x_{j + tau}
    corr = np.fft.irfft(np.conj(head) * whole, n_fft)[:, : tau_max + 1]
    squares = np.concatenate([np.zeros((block.shape[0], 1)), np.cumsum(block**2, axis=1)], axis=1)
    taus = np.arange(tau_max + 1)
    energy_shifted = squares[:, taus + width] - squares[:, taus]
    diff = np.maximum(corr[:, :1] + energy_shifted - 2.0 * corr, 0.0)  # (N, tau_max + 1)
    running = np.cumsum(diff[:, 1:], axis=1)
    cmnd = np.ones_like(diff)
    cmnd[:, 1:] = diff[:, 1:] * taus[1:] / np.maximum(running, 1e-12)

    inner = cmnd[:, 1:-1]
    minima = (inner <= cmnd[:, :-2]) & (inner <= cmnd[:, 2:])
    minima[:, : max(0, tau_min - 1)] = False
    dips = minima & (inner < threshold)
    found = dips.any(axis=1)
    deepest = np.where(minima, inner, np.inf).argmin(axis=1)
    tau = np.where(found, dips.argmax(axis=1), deepest) + 1  # index into cmnd
    rows = np.arange(cmnd.shape[0])
    maybe = ~found & minima.any(axis=1) & (cmnd[rows, tau] < VOICING_RELAXED)
    left, mid, right = cmnd[rows, tau - 1], cmnd[rows, tau], cmnd[rows, np.minimum(tau + 1, tau_max)]
    bend = left - 2.0 * mid + right
    offset = np.where(np.abs(bend) > 1e-12, 0.5 * (left - right) / np.where(bend == 0, 1, bend), 0.0)
    period = tau + np.clip(offset, -1.0, 1.0)

    # Unvoiced: no dip, or too quiet to be speech (breath and room noise find dips too).
    db = 10.0 * np.log10(np.mean(block[:, :width] ** 2, axis=1) + 1e-10)
    loud = np.percentile(db, 95)
    audible = db > loud - SPEECH_FLOOR_DB
    f0 = sample_rate / np.maximum(period, 1.0)
    voiced = _grow_voicing(found & audible, maybe & audible, f0)
    return _drop_pitch_outliers(np.where(voiced, f0, 0.0))


VOICING_RELAXED = 0.5
"""A frame whose deepest YIN dip is under this (but none under the strict threshold) is
voiced when its pitch continues a voiced neighbour's (:func:`_grow_voicing`)."""
VOICING_CONTINUITY = 2.0
"""Semitones the pitch may move from one 10 ms frame to the next while voicing grows."""


def _grow_voicing(voiced: np.ndarray, maybe: np.ndarray, f0: np.ndarray) -> np.ndarray:
    """``(N,)`` bool: ``voiced``, grown forwards then backwards through runs of ``maybe``
    frames whose pitch ``f0`` ``(N,)`` stays within :data:`VOICING_CONTINUITY` semitones of
    the frame before it. Unvoiced consonants seldom have a dip under the relaxed
    threshold and almost never one that continues the vowel's pitch."""
    semis = 12.0 * np.log2(np.maximum(f0, 1e-6))
    close = np.abs(np.diff(semis)) < VOICING_CONTINUITY  # (N - 1,) frame k to k + 1
    # Frame k joins the frame before it (forwards) or after it (backwards).
    forwards = _grow(voiced, np.concatenate([[False], maybe[1:] & close]))
    return _grow(forwards[::-1], np.concatenate([[False], (maybe[:-1] & close)[::-1]]))[::-1]


def _grow(seed: np.ndarray, joins: np.ndarray) -> np.ndarray:
    """``(N,)`` bool: frame k is set when some frame j <= k is set in ``seed`` and every
    frame after it up to k ``joins`` its predecessor (``(N,)`` bool)."""
    index = np.arange(seed.shape[0])
    last_seed = np.maximum.accumulate(np.where(seed, index, -1))
    last_break = np.maximum.accumulate(np.where(joins, -1, index))
    return last_seed >= np.maximum(last_break, 0) if seed.shape[0] else seed.copy()


def _drop_pitch_outliers(f0: np.ndarray) -> np.ndarray:
    """Fold octave slips back towards the utterance's median (YIN takes half the period
    at voicing onsets, twice it in creaky voice), then unvoice isolated frames and frames
    over 4 semitones from the median of their 5-frame neighbourhood."""
    voiced = f0 > 0
    if voiced.sum() < 3:
        return f0
    centre = np.median(f0[voiced])
    f0 = np.where(f0 > 1.65 * centre, f0 / 2.0, f0)
    f0 = np.where(voiced & (f0 < centre / 1.65), f0 * 2.0, f0)
    semis = np.where(voiced, 12.0 * np.log2(np.maximum(f0, 1e-6)), np.nan)
    padded = np.pad(semis, 2, constant_values=np.nan)
    window = np.lib.stride_tricks.sliding_window_view(padded, 5)
    counts = np.sum(~np.isnan(window), axis=1)
    with np.errstate(all="ignore"):
        local = np.nanmedian(np.where(counts[:, None] > 0, window, 0.0), axis=1)
    bad = voiced & ((counts < 3) | (np.abs(semis - local) > 4.0))
    return np.where(bad, 0.0, f0)


def semitones(hz: np.ndarray, reference: float = 100.0) -> np.ndarray:
    return 12.0 * np.log2(np.maximum(hz, 1e-6) / reference)


# ------------------------------------------------------------------------ formants
FORMANT_STEP = 1.0 / 24.0
"""Octaves between the points of the log-frequency grid the envelope is compared on."""
FORMANT_GRID = 2.0 ** np.arange(np.log2(250.0), np.log2(5000.0), FORMANT_STEP)
"""``(104,)`` Hz: 250 Hz to 5 kHz, where the first three formants of all voices lie."""
FORMANT_MAX_SHIFT = 7.0
"""Largest envelope shift (semitones) :func:`formant_shift` looks for: beyond the
timbres synthesis makes (``empatheia.generators.piper_speech.FEASIBLE``), and small
enough that the shifted window's top (5 kHz x 2^(7/12) = 7.5 kHz) stays under the
analysis Nyquist."""
FORMANT_REACH = int(round(FORMANT_MAX_SHIFT / (12.0 * FORMANT_STEP)))
""":data:`FORMANT_MAX_SHIFT` in grid steps."""
FORMANT_GAIN = 0.92
"""Measured semitones of envelope shift per semitone of resampling (the band edges and
the liftering take a little off); :func:`formant_shift` of ``resample(x, r)`` is about
``FORMANT_GAIN * 12 log2 r`` more than that of ``x``."""
VOICE_ENVELOPE = np.array(
    [
        -4.1, -3.4, -2.7, -1.9, -1.1, -0.5, 0.2, 0.8, 1.5, 2.0, 2.5, 3.0, 3.4, 3.7, 4.0,
        4.2, 4.3, 4.4, 4.3, 4.3, 4.1, 3.8, 3.5, 3.1, 2.7, 2.1, 1.6, 1.0, 0.4, -0.2,
        -0.8, -1.4, -1.9, -2.4, -2.8, -3.1, -3.3, -3.5, -3.6, -3.7, -3.7, -3.7, -3.6,
        -3.6, -3.7, -3.8, -4.0, -4.2, -4.5, -4.9, -5.2, -5.5, -5.7, -5.7, -5.6, -5.2,
        -4.7, -4.0, -3.2, -2.4, -1.7, -1.1, -0.8, -0.7, -0.7, -0.9, -0.9, -0.7, -0.2,
        0.5, 1.5, 2.4, 3.2, 3.9, 4.3, 4.8, 5.4, 6.4, 7.6, 8.6, 9.0, 8.6, 7.4, 6.1, 5.6,
        6.1, 7.6, 8.9, 9.0, 7.6, 5.5, 3.8, 2.8, 1.5, -1.1, -5.0, -9.1, -11.6, -12.3,
        -11.7, -9.6, -6.2, -2.2, 0.6,
    ]
)
"""``(104,)`` dB on :data:`FORMANT_GRID`: the long-term voiced envelope of the packaged
Piper voice ``en_US-joe-medium`` (five sentences, plain style), detrended; the zero of
``formant_st``."""


def voiced_envelope(x: np.ndarray, reach: int = 0, f0: Optional[np.ndarray] = None) -> np.ndarray:
    """``(T,)`` at :data:`ANALYSIS_RATE` -> ``(104 + 2 reach,)`` long-term envelope in dB on
    :data:`FORMANT_GRID` widened by ``reach`` grid steps at both ends (zeros when nothing
    is voiced). With ``reach`` 0 its linear trend is removed; a wider envelope is left
    as it is, for :func:`formant_shift` to detrend each window it compares. ``f0``
    ``(N,)``: the :func:`pitch_track` of ``x`` when it is at hand.

    Each speaking, voiced 32 ms frame's log spectrum is liftered to its first 30
    cepstral coefficients (under 1.9 ms, below any pitch period, so the harmonics go
    and the formants stay), set to 0 dB at its peak, and the frames are averaged."""
    length, hop = 512, int(round(HOP * ANALYSIS_RATE))
    grid = FORMANT_GRID[0] * 2.0 ** ((np.arange(FORMANT_GRID.shape[0] + 2 * reach) - reach) * FORMANT_STEP)
    block = frames(x, length, hop) * np.hanning(length)
    log_power = np.log(np.abs(np.fft.rfft(block, length)) ** 2 + 1e-10)
    cepstrum = np.fft.irfft(log_power, length)
    cepstrum[:, 30 : length - 29] = 0.0
    envelope_db = np.fft.rfft(cepstrum, length).real * (10.0 / np.log(10.0))
    db = frame_db(x, ANALYSIS_RATE)[: envelope_db.shape[0]]
    f0 = (pitch_track(x, ANALYSIS_RATE) if f0 is None else f0)[: envelope_db.shape[0]]
    use = speech_mask(db) & (f0 > 0)
    if use.sum() < 3:
        return np.zeros(grid.shape[0])
    chosen = envelope_db[use] - envelope_db[use].max(axis=1, keepdims=True)
    on_grid = chosen.mean(axis=0) @ _grid_interpolation(length, grid)
    return _detrend(on_grid) if reach == 0 else on_grid


def _detrend(values: np.ndarray) -> np.ndarray:
    """``(..., n)`` -> the same with each row's least-squares line removed."""
    t = np.arange(values.shape[-1]) - (values.shape[-1] - 1) / 2.0
    centred = values - values.mean(axis=-1, keepdims=True)
    slope = (centred @ t) / (t @ t)
    return centred - slope[..., None] * t


def _grid_interpolation(n_fft: int, grid: np.ndarray = FORMANT_GRID) -> np.ndarray:
    """``(n_fft // 2 + 1, len(grid))`` linear interpolation from FFT bins to ``grid`` (Hz)."""
    position = grid / (ANALYSIS_RATE / n_fft)
    low = np.floor(position).astype(int)
    weights = np.zeros((n_fft // 2 + 1, grid.shape[0]))
    columns = np.arange(grid.shape[0])
    weights[low, columns] = 1.0 - (position - low)
    weights[low + 1, columns] = position - low
    return weights


def formant_shift(x: np.ndarray, f0: Optional[np.ndarray] = None) -> float:
    """Semitones by which the voiced envelope of ``x`` (at :data:`ANALYSIS_RATE`) sits
    above :data:`VOICE_ENVELOPE`: the lag of the best correlation between the two on the
    log-frequency grid (:func:`_correlation_peak`, within :data:`FORMANT_MAX_SHIFT`); 0
    when nothing is voiced. ``f0`` ``(N,)``: the :func:`pitch_track` of ``x`` when it is at
    hand.

    Every lag compares the whole reference with a window of the same 104 points of the
    envelope measured on a grid that much wider, each window detrended on its own. A
    window that shrank with the lag (the overlap of two fixed 104-point envelopes)
    would let the extreme lags win by matching a few points, and a shifted envelope's
    tilt would count against it."""
    reach = FORMANT_REACH
    envelope = voiced_envelope(x, reach, f0)
    if not np.any(envelope):
        return 0.0
    n = FORMANT_GRID.shape[0]
    windows = _detrend(np.lib.stride_tricks.sliding_window_view(envelope, n))  # (2 reach + 1, 104)
    reference = _detrend(VOICE_ENVELOPE)
    norms = np.linalg.norm(windows, axis=1) * np.linalg.norm(reference)
    scores = windows @ reference / np.maximum(norms, 1e-12)  # (2 reach + 1,), lag -reach .. reach
    return float((_correlation_peak(scores) - reach) * FORMANT_STEP * 12.0)


def _correlation_peak(scores: np.ndarray) -> float:
    """Where ``scores`` ``(L,)`` peaks, in (fractional) index: the highest local maximum
    inside the search, refined by a parabola through its neighbours; the higher end only
    when the scores rise all the way to it.

    A short answer has few vowels, its envelope matches the reference weakly at every
    lag, and the scores at an end of the search can come out a hair above a real peak
    inside it, or not, depending on which frames the tracker voiced: the reading jumped
    between that peak and the end as the frame grid moved. An end is no peak: the search
    spans every shift synthesis makes, with room to spare."""
    inner = np.flatnonzero((scores[1:-1] >= scores[:-2]) & (scores[1:-1] >= scores[2:])) + 1
    if inner.size == 0:
        return float(np.argmax(scores))
    best = int(inner[np.argmax(scores[inner])])
    bend = scores[best - 1] - 2.0 * scores[best] + scores[best + 1]
    offset = 0.5 * (scores[best - 1] - scores[best + 1]) / bend if bend < 0 else 0.0
    return best + offset


def measure_formant(x: np.ndarray, sample_rate: int) -> float:
    """``Prosody.formant_st`` alone."""
    return formant_shift(_at_analysis_rate(x, sample_rate))


# ------------------------------------------------------------------------ rate
def mel_filterbank(n_fft: int, sample_rate: int, n_mels: int, fmin: float = 80.0, fmax: float = 7600.0) -> np.ndarray:
    """``(n_mels, n_fft // 2 + 1)`` triangular filters evenly spaced on the mel scale."""
    fmax = min(fmax, 0.475 * sample_rate)

    def to_mel(hz):
        return 2595.0 * np.log10(1.0 + np.asarray(hz) / 700.0)

    edges = 700.0 * (10.0 ** (np.linspace(to_mel(fmin), to_mel(fmax), n_mels + 2) / 2595.0) - 1.0)
    freqs = np.fft.rfftfreq(n_fft, 1.0 / sample_rate)
    low, centre, high = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    return np.maximum(0.0, np.minimum((freqs - low) / (centre - low), (high - freqs) / (high - centre)))


def log_mel(
    x: np.ndarray, sample_rate: int, hop: float = HOP, window: float = 0.025, n_mels: int = 24
) -> np.ndarray:
    """``(T,)`` -> ``(N, n_mels)`` mel band power in dB, one Hann frame per ``hop`` s."""
    length = max(2, int(round(window * sample_rate)))
    n_fft = 1 << int(np.ceil(np.log2(length)))
    block = frames(x, length, max(1, int(round(hop * sample_rate)))) * np.hanning(length)
    power = np.abs(np.fft.rfft(block, n_fft)) ** 2
    return 10.0 * np.log10(power @ mel_filterbank(n_fft, sample_rate, n_mels).T + 1e-10)


def change_rate(x: np.ndarray, sample_rate: int, speaking: np.ndarray) -> float:
    """Spectral change events per speaking frame: a soft count of the peaks of the
    spectral flux.

    The flux is the distance between consecutive frames of the log-mel spectrogram,
    smoothed over 30 ms and floored 50 dB under its loud bins (so that gain and room noise
    do not count). Each flux peak in a speaking frame counts by how far it rises above the
    dips on both sides: ``sigmoid((prominence - FLUX_PROMINENCE) / FLUX_SOFTNESS)``, so
    that a peak near the threshold does not flip the count. There is about one event per
    phone boundary, and their rate follows the tempo (unlike loudness peaks, which merge
    when speech is fast), which makes it a transcript-free speaking rate.
    """
    mel = log_mel(x, sample_rate)[: speaking.shape[0]]
    mel = np.maximum(mel, np.percentile(mel, 95) - 50.0)
    kernel = np.ones(3) / 3.0
    smooth = np.apply_along_axis(lambda band: np.convolve(band, kernel, mode="same"), 0, mel)
    flux = np.zeros(mel.shape[0])
    flux[1:] = np.linalg.norm(np.diff(smooth, axis=0), axis=1)
    flux[~speaking[: flux.shape[0]]] = 0.0
    candidates, height = _peak_prominence(flux)
    weight = 1.0 / (1.0 + np.exp(-(height - FLUX_PROMINENCE) / FLUX_SOFTNESS))
    return float(weight.sum())


def _peak_prominence(signal: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Local maxima of ``signal`` and how far each rises above the higher of the lowest
    points between it and its neighbouring maxima."""
    peak = (signal[1:-1] > signal[:-2]) & (signal[1:-1] >= signal[2:])
    candidates = np.flatnonzero(peak) + 1
    if candidates.size == 0:
        return candidates, np.zeros(0)
    # Minimum over [0, c0), [c0, c1), ..., [c_last, N): the dips around each candidate.
    dips = np.minimum.reduceat(signal, np.concatenate([[0], candidates]))
    return candidates, signal[candidates] - np.maximum(dips[:-1], dips[1:])


# ------------------------------------------------------------------------ measuring
GRID_PHASES = 4
"""Analysis grids, each :data:`HOP` / ``GRID_PHASES`` later than the one before, that the
rate, pitch and pause measures pool. On an answer of a second or two, where the 10 ms
frame boundaries fall moves one grid's count of change events by a tenth and its pitch
spread and pauses by frames near a threshold; pooled, the measures read the voice rather
than the grid, and a generator aiming at them cannot fit one grid's accidents."""


def measure(x: np.ndarray, sample_rate: int) -> Prosody:
    """The :class:`Prosody` of a ``(T,)`` mono waveform (resampled to
    :data:`ANALYSIS_RATE` first)."""
    grids = _grids(_at_analysis_rate(x, sample_rate))
    tracks = [pitch_track(g, ANALYSIS_RATE) for g in grids]
    pitch_hz, pitch_range = _pitch_statistics(np.concatenate(tracks))
    levels = [frame_db(g, ANALYSIS_RATE) for g in grids]
    db = levels[0]
    speaking = speech_mask(db)
    power = np.mean(10.0 ** (db[speaking] / 10.0)) if speaking.any() else 1e-10
    return Prosody(
        rate=_mean_rate(grids, levels),
        pitch_hz=pitch_hz,
        pitch_range=pitch_range,
        energy_db=float(10.0 * np.log10(power + 1e-10)),
        pause_ratio=float(np.mean([_pause_ratio(level) for level in levels])),
        formant_st=formant_shift(grids[0], tracks[0]),
    )


def measure_rate(x: np.ndarray, sample_rate: int) -> float:
    """``Prosody.rate`` alone (what :func:`measure` gives, for less work)."""
    grids = _grids(_at_analysis_rate(x, sample_rate))
    return _mean_rate(grids, [frame_db(g, ANALYSIS_RATE) for g in grids])


def measure_pause_ratio(x: np.ndarray, sample_rate: int) -> float:
    """``Prosody.pause_ratio`` alone."""
    return float(np.mean([_pause_ratio(frame_db(g, ANALYSIS_RATE)) for g in _grids(_at_analysis_rate(x, sample_rate))]))


def measure_pitch(x: np.ndarray, sample_rate: int) -> Tuple[float, float]:
    """``(Prosody.pitch_hz, Prosody.pitch_range)`` alone."""
    grids = _grids(_at_analysis_rate(x, sample_rate))
    return _pitch_statistics(np.concatenate([pitch_track(g, ANALYSIS_RATE) for g in grids]))


def _grids(x: np.ndarray) -> List[np.ndarray]:
    """``x`` ``(T,)`` at :data:`ANALYSIS_RATE` delayed by ``p / GRID_PHASES`` of a hop,
    ``p = 0 .. GRID_PHASES - 1``: ``(T + delay,)`` each, so that frame ``i`` of grid ``p``
    is centred ``p / GRID_PHASES`` of a hop before frame ``i`` of grid 0."""
    hop = HOP * ANALYSIS_RATE
    return [np.concatenate([np.zeros(int(round(p * hop / GRID_PHASES))), x]) for p in range(GRID_PHASES)]


def _pause_ratio(db: np.ndarray) -> float:
    starts, ends, first, last = pauses(db)
    return float(np.sum(ends - starts) / max(last - first, 1))


def _at_analysis_rate(x: np.ndarray, sample_rate: int) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return resample(x, sample_rate / ANALYSIS_RATE) if sample_rate != ANALYSIS_RATE else x


def _mean_rate(grids: List[np.ndarray], levels: List[np.ndarray]) -> float:
    """The mean over the grids of change events per speaking second (``levels``: each
    grid's :func:`frame_db`)."""
    rates = []
    for x, db in zip(grids, levels):
        starts, ends, first, last = pauses(db)
        speaking_time = max(last - first - int(np.sum(ends - starts)), 1) * HOP
        rates.append(change_rate(x, ANALYSIS_RATE, speech_mask(db)) / speaking_time)
    return float(np.mean(rates))


def _pitch_statistics(f0: np.ndarray) -> Tuple[float, float]:
    """``(median Hz, range st)`` of a ``(N,)`` pitch track's voiced frames."""
    voiced = f0 > 0
    if not voiced.any():
        return 0.0, 0.0
    semis = semitones(f0[voiced])
    centre = np.median(semis)
    return float(100.0 * 2.0 ** (centre / 12.0)), float(1.4826 * np.median(np.abs(semis - centre)))


# ------------------------------------------------------------------------ changing
def resample(x: np.ndarray, ratio: float) -> np.ndarray:
    """Band-limited resampling by FFT: ``(T,)`` -> ``(round(T / ratio),)``. Played at the
    original rate the result is ``ratio`` times faster and higher (pitch and formants)."""
    length = max(1, int(round(x.shape[0] / ratio)))
    if length == x.shape[0]:
        return x.copy()
    spectrum = np.fft.rfft(x)
    bins = length // 2 + 1
    out = np.zeros(bins, dtype=complex)
    keep = min(bins, spectrum.shape[0])
    out[:keep] = spectrum[:keep]
    return np.fft.irfft(out, length) * (length / x.shape[0])


def shift_pitch(
    x: np.ndarray, sample_rate: int, f0: np.ndarray, ratio: np.ndarray, hop: float = HOP
) -> np.ndarray:
    """Pitch-synchronous overlap-add (TD-PSOLA): multiply the pitch by ``ratio`` (per
    ``hop`` frame) keeping the duration and the formants.

    Args:
        x: ``(T,)`` waveform.
        f0: ``(N,)`` its pitch track (Hz, 0 unvoiced), e.g. from :func:`pitch_track`.
        ratio: ``(N,)`` pitch factor per frame (ignored where unvoiced).

    Analysis marks follow the local period (voiced) or a fixed 100 Hz (unvoiced) and are
    moved onto the glottal pulses; synthesis marks advance through the analysis marks'
    pulse phase ``ratio`` times as fast (so that ratio 1 reproduces the input), and each
    takes the two-period Hann grain of the analysis mark nearest in time. The sum is
    divided by the summed windows so that the level does not pulse with the marks.
    Voiced stretches only a few periods long come out rougher than long vowels.
    """
    x = np.asarray(x, dtype=np.float64)
    total = x.shape[0]
    times = np.arange(f0.shape[0]) * hop
    sample_times = np.arange(total) / sample_rate
    voiced = f0 > 0
    # Unvoiced stretches use a steady 100 Hz "period" and keep it (ratio 1).
    filled = np.interp(sample_times, times, np.where(voiced, f0, 100.0))
    voiced_now = np.interp(sample_times, times, voiced.astype(float)) > 0.5
    factor = np.where(voiced_now, np.interp(sample_times, times, ratio), 1.0)

    def marks(frequency: np.ndarray) -> np.ndarray:
        phase = np.cumsum(frequency) / sample_rate
        return np.flatnonzero(np.diff(np.floor(phase)) > 0) + 1

    analysis = marks(filled)
    if analysis.size < 2:
        return x.copy()
    periods = np.round(sample_rate / filled[analysis]).astype(int)
    # Move the voiced marks onto the glottal pulses, so that each grain has its pulse in
    # the middle and the neighbouring pulses at its faded edges. The largest sample
    # within half a period is taken as the pulse, but as a phase averaged over five
    # neighbouring marks: single maxima jump between pulse and formant ripple, and
    # grains placed at inconsistent phases smear the output's periodicity.
    polarity = 1.0 if np.percentile(x, 99.5) >= -np.percentile(x, 0.5) else -1.0
    half = int(np.ceil(sample_rate / F0_MIN / 2))
    offsets = np.arange(-half, half + 1)
    idx = np.clip(analysis[:, None] + offsets[None, :], 0, total - 1)
    reach = np.abs(offsets)[None, :] <= (periods[:, None] // 2)
    best = offsets[np.where(reach, polarity * x[idx], -np.inf).argmax(axis=1)]
    angle = 2.0 * np.pi * best / periods
    kernel = np.ones(5)
    mean_cos = np.convolve(np.cos(angle), kernel, mode="same")
    mean_sin = np.convolve(np.sin(angle), kernel, mode="same")
    shift = np.round(np.arctan2(mean_sin, mean_cos) / (2.0 * np.pi) * periods).astype(int)
    analysis = np.clip(np.where(voiced_now[analysis], analysis + shift, analysis), 0, total - 1)
    analysis, unique = np.unique(analysis, return_index=True)
    periods = periods[unique]

    # Synthesis marks: the analysis marks' pulse phase (k at the k-th mark) advanced
    # ``factor`` times as fast. At factor 1 they are the analysis marks themselves, so an
    # unshifted stretch comes out unchanged, pulse jitter and all.
    pulse_phase = np.interp(np.arange(total), analysis, np.arange(analysis.size, dtype=np.float64))
    shifted_phase = np.concatenate([[pulse_phase[0]], pulse_phase[0] + np.cumsum(np.diff(pulse_phase) * factor[1:])])
    synthesis = np.flatnonzero(np.diff(np.floor(shifted_phase + 1e-9)) > 0) + 1
    if synthesis.size == 0:
        return x.copy()
    nearest = np.clip(np.searchsorted(analysis, synthesis), 1, analysis.size - 1)
    before = analysis[nearest - 1]
    after = analysis[nearest]
    pick = np.where(synthesis - before <= after - synthesis, nearest - 1, nearest)
    source = analysis[pick]
    period = periods[pick]  # (G,)

    span = int(periods.max())
    offsets = np.arange(-span, span + 1)  # (W,)
    inside = np.abs(offsets)[None, :] < period[:, None]
    window = np.where(inside, 0.5 + 0.5 * np.cos(np.pi * offsets[None, :] / period[:, None]), 0.0)
    read = source[:, None] + offsets[None, :]
    write = synthesis[:, None] + offsets[None, :]
    valid = inside & (read >= 0) & (read < total) & (write >= 0) & (write < total)
    grains = np.where(valid, x[np.clip(read, 0, total - 1)] * window, 0.0)
    out = np.zeros(total)
    weight = np.zeros(total)
    np.add.at(out, write[valid], grains[valid])
    np.add.at(weight, write[valid], window[valid])
    return out / np.maximum(weight, 0.5)


EDIT_FADE = 0.005
"""Seconds over which speech fades into and out of the silence a pause edit inserts."""


@dataclass(frozen=True)
class TimeEdit:
    """A re-timing of a ``(T,)`` track: the output is ``pieces`` in order, each
    ``(start, end, length)`` either a copy of source samples ``[start, end)``
    (``length == end - start``, ``silent`` False) or ``length`` samples of inserted
    silence that stand in for source ``[start, end)`` (``silent`` True; the span may be
    empty). Applying one edit to a waveform and to its per-sample label track keeps the
    two in step."""

    pieces: Tuple[Tuple[int, int, int, bool], ...]
    """``(start, end, length, silent)`` per piece."""
    fade: int = 0
    """Samples over which copied audio fades out into, and in from, inserted silence: a
    pause opened between words cuts speech at a loudness dip, not at silence, and a step
    from there to digital zero is a click."""

    @property
    def length(self) -> int:
        return int(sum(piece[2] for piece in self.pieces))

    def apply(self, x: np.ndarray) -> np.ndarray:
        """The edited waveform: ``(T,)`` -> ``(self.length,)`` float64."""
        x = np.asarray(x, dtype=np.float64)
        inserted = [silent and n > 0 for _, _, n, silent in self.pieces]
        parts = []
        for i, (a, b, n, silent) in enumerate(self.pieces):  # a few pieces per pause
            if silent:
                parts.append(np.zeros(n))
                continue
            part = x[a:b].copy()
            k = min(self.fade, part.shape[0] // 2)
            rise = 0.5 - 0.5 * np.cos(np.pi * (np.arange(k) + 0.5) / max(k, 1))  # (k,) 0 -> 1
            if k and i > 0 and inserted[i - 1]:
                part[:k] *= rise
            if k and i + 1 < len(self.pieces) and inserted[i + 1]:
                part[-k:] *= rise[::-1]
            parts.append(part)
        return np.concatenate(parts or [np.zeros(0)])

    def apply_to_labels(self, labels: np.ndarray) -> np.ndarray:
        """The edited label track: ``(T,)`` int -> ``(self.length,)`` int64.

        Copied spans keep their labels. Inserted silence takes, by nearest index, the
        labels of the source span it replaces, so that a unit the cut removed whole (the
        silence of a comma, a sentence's final stop) still owns the pause that now
        stands for it; silence that replaces nothing (a pause opened between words,
        the trailing edge) is ``-1``, as is silence in the source."""
        labels = np.asarray(labels, dtype=np.int64)
        out = []
        for a, b, n, silent in self.pieces:
            if not silent:
                out.append(labels[a:b])
            elif b > a and n > 0:
                out.append(labels[a + ((np.arange(n) + 0.5) * (b - a) / n).astype(np.int64)])
            else:
                out.append(np.full(n, -1, dtype=np.int64))
        return np.concatenate(out or [np.zeros(0, np.int64)])


def retime_pauses(x: np.ndarray, sample_rate: int, target_ratio: float, edge: float = 0.12) -> np.ndarray:
    """Lengthen or shorten the pauses of an utterance so that its measured
    ``pause_ratio`` becomes ``target_ratio``; leading and trailing silence become ``edge``
    seconds. The edit itself is :func:`pause_edit` (apply it to a label track too)."""
    return pause_edit(x, sample_rate, target_ratio, edge).apply(x)


def pause_edit(x: np.ndarray, sample_rate: int, target_ratio: float, edge: float = 0.12) -> TimeEdit:
    """The :class:`TimeEdit` of :func:`retime_pauses` for waveform ``x`` ``(T,)``.

    Existing pauses are scaled together; an utterance without any gets pauses at its
    deepest loudness dips between words (one per ~1.5 s of speech). When the target is
    too small for every pause to stay over :data:`MIN_PAUSE`, the longest pauses stay and
    the others close to 50 ms gaps that no longer count.
    """
    x = np.asarray(x, dtype=np.float64)
    hop = int(round(HOP * sample_rate))
    db = frame_db(x, sample_rate)
    starts, ends, first, last = pauses(db)
    if last <= first:
        return TimeEdit(((0, x.shape[0], x.shape[0], False),))
    if starts.size == 0 and target_ratio > 0.01:
        starts, ends = _word_gaps(db, first, last)
    paused = float(np.sum(ends - starts)) * HOP
    speaking = (last - first) * HOP - paused
    target = min(max(target_ratio, 0.0), 0.8)
    want = target * speaking / (1.0 - target)
    lengths = _share_pauses((ends - starts) * HOP, want)

    # Cut in the middle of each pause (keeping 20 ms of its edges, where the speech fades
    # out and in), insert silence. A gap opened between words has no silent edges to
    # keep: it gets its whole length, or nothing when it is not to be a pause.
    margin = int(round(0.02 * sample_rate))
    pieces = []
    cursor = max(0, first * hop - int(round(edge * sample_rate)))
    for start, end, length in zip(starts, ends, lengths):
        silence = int(round(length * sample_rate))
        if end > start:
            cut_in, cut_out = start * hop + margin, max(end * hop - margin, start * hop + margin)
            silence -= 2 * margin
        else:
            cut_in = cut_out = start * hop
            silence = silence if length > CLOSED_PAUSE else 0
        cut_in = max(min(cut_in, x.shape[0]), cursor)
        cut_out = min(cut_out, x.shape[0])
        pieces.append((cursor, cut_in, cut_in - cursor, False))
        pieces.append((cut_in, max(cut_out, cut_in), max(0, silence), True))
        cursor = max(cut_out, cut_in)
    stop = max(cursor, min(x.shape[0], last * hop))
    pieces.append((cursor, stop, stop - cursor, False))
    pieces.append((stop, x.shape[0], int(round(edge * sample_rate)), True))
    pieces = tuple((int(a), int(b), int(n), bool(s)) for a, b, n, s in pieces)
    return TimeEdit(pieces, int(round(EDIT_FADE * sample_rate)))


def resample_labels(labels: np.ndarray, ratio: float) -> np.ndarray:
    """The label track of :func:`resample`: ``(T,)`` -> ``(round(T / ratio),)``, each
    output sample taking the label of the source sample at the same time (nearest)."""
    labels = np.asarray(labels, dtype=np.int64)
    length = max(1, int(round(labels.shape[0] / ratio)))
    source = ((np.arange(length) + 0.5) * labels.shape[0] / length).astype(np.int64)
    return labels[np.minimum(source, labels.shape[0] - 1)]


def _word_gaps(db: np.ndarray, first: int, last: int) -> Tuple[np.ndarray, np.ndarray]:
    """Zero-length pauses at the deepest loudness dips between ``first`` and ``last``,
    at least 0.5 s apart and 0.2 s from the ends (so that a two-word answer of half a
    second has a place for one), one per ~1.5 s."""
    smooth = np.convolve(db, np.ones(5) / 5.0, mode="same")
    margin = int(round(0.2 / HOP))
    inner = np.arange(first + margin, last - margin)
    if inner.size == 0:
        return np.zeros(0, int), np.zeros(0, int)
    wanted = max(1, int(round((last - first) * HOP / 1.5)))
    order = inner[np.argsort(smooth[inner])]
    chosen: list = []
    for frame in order:  # at most a few hundred dips, and stops after `wanted`
        if all(abs(frame - c) >= int(0.5 / HOP) for c in chosen):
            chosen.append(int(frame))
            if len(chosen) == wanted:
                break
    chosen_arr = np.sort(np.asarray(chosen, dtype=int))
    return chosen_arr, chosen_arr


def _share_pauses(current: np.ndarray, want: float) -> np.ndarray:
    """New lengths (s) for pauses of ``current`` lengths so that those that stay pauses
    add up to ``want``; the rest become :data:`CLOSED_PAUSE` gaps. A kept pause is at
    least :data:`MIN_PAUSE` + :data:`WINDOW` long: the frames whose window reaches into
    the speech around it do not count as silent."""
    count = current.shape[0]
    if count == 0:
        return current
    short, shortest = CLOSED_PAUSE, MIN_PAUSE + WINDOW
    keep = min(count, int(round(want / shortest)))
    lengths = np.full(count, short)
    if keep == 0:
        return lengths
    order = np.argsort(-current, kind="stable")[:keep]
    base = np.maximum(current[order], 1e-3)
    lengths[order] = np.maximum(base * (want / base.sum()), shortest)
    # Flooring added time: take it back from the longer ones.
    excess = lengths[order].sum() - want
    if excess > 0:
        room = lengths[order] - shortest
        lengths[order] -= excess * room / max(room.sum(), 1e-9)
    return lengths


def set_energy(x: np.ndarray, sample_rate: int, target_db: float, ceiling: float = 0.97) -> np.ndarray:
    """Scale ``x`` so that its speaking frames have ``target_db`` dBFS of power, with a
    smooth peak limiter at ``ceiling`` (the gain is re-checked once after limiting)."""
    x = np.asarray(x, dtype=np.float64)
    y = x
    for _ in range(3):
        db = frame_db(y, sample_rate)
        speaking = speech_mask(db)
        if not speaking.any():
            return y
        current = 10.0 * np.log10(np.mean(10.0 ** (db[speaking] / 10.0)) + 1e-12)
        y = _limit(y * 10.0 ** ((target_db - current) / 20.0), sample_rate, ceiling)
        if abs(target_db - current) < 0.2:
            break
    return y


def _limit(x: np.ndarray, sample_rate: int, ceiling: float) -> np.ndarray:
    """Gain reduction per 5 ms block (the worst of the block and its neighbours),
    interpolated per sample, so that peaks stay under ``ceiling`` without clicks."""
    block = max(1, int(0.005 * sample_rate))
    count = int(np.ceil(x.shape[0] / block))
    padded = np.zeros(count * block)
    padded[: x.shape[0]] = np.abs(x)
    peaks = padded.reshape(count, block).max(axis=1)
    gain = np.minimum(1.0, ceiling / np.maximum(peaks, 1e-9))
    gain = np.min(np.lib.stride_tricks.sliding_window_view(np.pad(gain, 2, mode="edge"), 5), axis=1)
    centres = (np.arange(count) + 0.5) * block
    per_sample = np.interp(np.arange(x.shape[0]), centres, gain)
    return np.clip(x * per_sample, -ceiling, ceiling)


# ------------------------------------------------------------------------ closed loops
PITCH_PASSES = 5
"""Pitch shifts :func:`set_pitch` tries per waveform."""
PITCH_TOLERANCE = 0.05
"""Weighted miss (pitch + pitch range, see :func:`set_pitch`) under which a shift is kept."""
MAX_CONTOUR_GAIN = 6.0
"""Most the intonation contour is scaled by to widen the pitch range."""
MAX_EXCURSION = 6.0
"""Semitones from the median that a scaled contour approaches but does not pass."""
PITCH_BRIDGE = 0.1
"""Seconds of unvoiced frames between voiced ones that the pitch shift moves with them."""
PAUSE_PASSES = 5
"""Pause edits :func:`set_pauses` tries per waveform."""
PAUSE_TOLERANCE = 0.002
"""Pause ratio miss under which a pause edit is kept as it is."""


def set_pitch(
    x: np.ndarray, sample_rate: int, target_hz: float, target_range: float, scales: Tuple[float, float] = (1.0, 1.0)
) -> np.ndarray:
    """``x`` ``(T,)`` with its pitch shifted so that :func:`measure_pitch` reads a median
    of ``target_hz`` and a spread of ``target_range`` semitones: ``(T,)``, same timing.

    The spread is changed by scaling the intonation contour (the voiced pitch, bridged
    over unvoiced gaps and smoothed over 150 ms) around the median: the slow
    phrase-level movement a listener hears as lively or flat. Scaling the frame-level
    jitter instead would only roughen the voice. The shifter and the tracker do not
    realise a request exactly, so measured corrections follow: at most
    :data:`PITCH_PASSES` shifts, of which the one with the smallest miss
    ``|pitch miss| / scales[0] + |range miss| / scales[1]`` (semitones) is kept.
    """
    f0 = pitch_track(x, sample_rate)
    voiced = f0 > 0
    if voiced.sum() < 3:
        return x
    semis = semitones(f0[voiced])
    centre = float(np.median(semis))
    frames = np.arange(f0.shape[0])
    bridged = np.interp(frames, frames[voiced], semis)  # (N,) semitones re 100 Hz
    contour = np.convolve(np.pad(bridged, 7, mode="edge"), np.ones(15) / 15.0, mode="valid") - centre
    # The shifter moves only the frames it is told are voiced; a vowel frame the tracker
    # missed would keep its old pitch beside shifted ones, and the measure would read a
    # mixture. Short gaps between voiced frames are shifted with them.
    bridge = _inner_gaps(voiced, int(round(PITCH_BRIDGE / HOP)))
    marks = np.where(bridge, 100.0 * 2.0 ** (bridged / 12.0), f0)
    have_hz, _ = measure_pitch(x, sample_rate)
    target = float(semitones(np.asarray(target_hz)))
    offset = target - float(semitones(np.asarray(max(have_hz, 1.0))))
    # The spread the measure will read at a gain, if the shifter were exact and the same
    # frames stayed voiced: a short answer's few voiced stretches make it far from
    # proportional to the gain, and the excursions are bounded.
    deviation, along = semis - centre, contour[voiced]
    asked = target_range
    gain = _gain_for(deviation, along, asked)
    best, best_error = x, np.inf
    for _ in range(PITCH_PASSES):
        shift = offset + _excursion(bridged - centre, contour, gain) - (bridged - centre)
        out = shift_pitch(x, sample_rate, marks, 2.0 ** (shift / 12.0))
        got_hz, got_range = measure_pitch(out, sample_rate)
        if got_hz <= 0:
            break
        miss = target - float(semitones(np.asarray(got_hz)))
        error = abs(miss) / scales[0] + abs(target_range - got_range) / scales[1]
        if error < best_error:
            best, best_error = out, error
        if error < PITCH_TOLERANCE:
            break
        offset += miss
        asked = max(asked + target_range - got_range, 0.0)
        gain = _gain_for(deviation, along, asked)
    return best


def _excursion(deviation: np.ndarray, contour: np.ndarray, gain: float) -> np.ndarray:
    """Semitones from the median ``(N,)`` for frames at ``deviation`` ``(N,)`` when the
    contour ``(N,)`` is scaled by ``gain``, softly bounded at :data:`MAX_EXCURSION`. A
    phrase's final fall scaled with the rest would sink far under the voice (and a high
    stretch past the tracker's octave check), where the tracker no longer finds it: the
    measured spread would then shrink as the gain grows."""
    return MAX_EXCURSION * np.tanh((deviation + (gain - 1.0) * contour) / MAX_EXCURSION)


def _gain_for(deviation: np.ndarray, contour: np.ndarray, spread: float) -> float:
    """The contour gain (0 .. :data:`MAX_CONTOUR_GAIN`) at which voiced frames that sit
    ``deviation`` ``(V,)`` semitones from their median, moved as :func:`_excursion` moves
    them along ``contour`` ``(V,)``, have a measured spread (1.4826 x MAD) closest to
    ``spread``."""
    gains = np.linspace(0.0, MAX_CONTOUR_GAIN, 121)  # (G,)
    moved = _excursion(deviation[None, :], contour[None, :], gains[:, None])  # (G, V)
    centred = moved - np.median(moved, axis=1, keepdims=True)
    spreads = 1.4826 * np.median(np.abs(centred), axis=1)
    return float(gains[np.argmin(np.abs(spreads - spread))])


def _inner_gaps(voiced: np.ndarray, longest: int) -> np.ndarray:
    """``(N,)`` bool: ``voiced`` plus its unvoiced runs of at most ``longest`` frames that
    have voiced frames on both sides."""
    starts, ends = runs(~voiced)
    inner = (starts > 0) & (ends < voiced.shape[0]) & (ends - starts <= longest)
    edges = np.zeros(voiced.shape[0] + 1, dtype=np.int64)
    np.add.at(edges, starts[inner], 1)
    np.add.at(edges, ends[inner], -1)
    return voiced | (np.cumsum(edges)[:-1] > 0)


def set_pauses(
    x: np.ndarray, labels: np.ndarray, sample_rate: int, ratio: float
) -> Tuple[np.ndarray, np.ndarray]:
    """Re-time the pauses of ``x`` ``(T,)`` and its ``labels`` ``(T,)`` so that
    :func:`measure_pause_ratio` comes closest to ``ratio``: ``(x', labels')``, ``(T',)``.

    :func:`pause_edit` aims at a ratio from the pauses' lengths, but the measure counts
    only silences of :data:`MIN_PAUSE` after the speech around them has faded, so a
    short pause may not count at all and a short answer has few ratios to offer. The
    edit is redone with the ratio it is asked for corrected by what it missed, then
    bisected between a try that came out short and one that came out long; the closest
    of :data:`PAUSE_PASSES` tries is kept."""
    asked, low, high = ratio, None, None
    best, best_error = None, np.inf
    for _ in range(PAUSE_PASSES):
        edit = pause_edit(x, sample_rate, asked)
        got = measure_pause_ratio(edit.apply(x), sample_rate)
        if abs(got - ratio) < best_error:
            best, best_error = edit, abs(got - ratio)
        if best_error < PAUSE_TOLERANCE:
            break
        if got < ratio:
            low = asked
        else:
            high = asked
        if low is not None and high is not None:
            asked = 0.5 * (low + high)
        else:
            asked = float(np.clip(asked + (ratio - got), 0.0, 0.8))
    return best.apply(x), best.apply_to_labels(labels)


def envelope(x: np.ndarray, sample_rate: int, fps: float, count: Optional[int] = None) -> np.ndarray:
    """``(T,)`` -> ``(count,)`` RMS of each video frame's span ``[i / fps, (i + 1) / fps)``;
    ``count`` defaults to ``round(T / sample_rate * fps)``."""
    if count is None:
        count = max(1, int(round(x.shape[0] / sample_rate * fps)))
    edges = np.round(np.arange(count + 1) / fps * sample_rate).astype(int)
    padded = np.zeros(max(edges[-1], x.shape[0]) + 1)
    padded[: x.shape[0]] = np.asarray(x, dtype=np.float64) ** 2
    cumulative = np.concatenate([[0.0], np.cumsum(padded)])
    sums = cumulative[edges[1:]] - cumulative[edges[:-1]]
    return np.sqrt(sums / np.maximum(edges[1:] - edges[:-1], 1))
