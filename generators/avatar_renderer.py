"""A talking head drawn with OpenCV: no learned weights, so it runs offline.

No DreamTalk weights can be had offline, so the ``small`` preset animates the avatar with
this renderer. It draws stylised eyes, brows and a mouth over the avatar's portrait at
25 fps: the mouth opens with the speech, the face holds the requested emotion, the eyes
blink. The video style feature S^v is a vector of expression weights that can be
*measured* back from the frames (:meth:`AvatarRenderer.style_features` reads the drawn
geometry), so the gold S^v of rendered videos and what :meth:`AvatarRenderer.animate`
reads are the same quantities.

The face itself (its expression space, drawing, portraits and the geometry read back
from pixels) is :mod:`empatheia.generators.avatar_face`; this module turns styles and
speech into its expressions and mouth movements, frame by frame, and measures styles
back. Portraits follow one layout (``avatar_face.LAYOUT``); the renderer paints over the
eye, brow and mouth areas of the portrait (OpenCV inpainting) and draws its own features
there.

Style layout (``style_dim >= 8``; each later dim is used when ``style_dim`` holds it;
dims 11 and up are always 0)::

    dims 0-6  emotion weights for sad, happy, angry, fear, surprised, contempt, disgusted
              (negative entries count as 0; the renderer normalises them to sum 1)
    dim  7    intensity in [0, 1] (0: a neutral face)
    dim  8    gaze_x in [-1, 1]: the irises move towards the image's right (+) or left
              (-), 1 = ``avatar_face.GAZE_TRAVEL`` of the side; 0 = eye contact
    dim  9    gaze_y in [-1, 1]: the irises move down (+) or up (-)
    dim  10   head_motion in [0, 2]: RMS of the head's vertical nodding over the clip in
              units of :data:`HEAD_NOD` of the side (a horizontal sway of half that goes
              with it); 0 = a still head

The gaze is measured from where the white of each eye lies around the iris; the head
motion from the frame-to-frame shift of the whole image (phase correlation against the
clip's median frame), after which the frames are shifted back so that the expression is
read on a still face. The head moves the whole portrait (a smooth, seeded translation
per frame, the same for the same portrait and length); it does not tilt.

Each emotion is a direction in a 9-parameter expression space (``EXPRESSION_PARAMS`` and
``EMOTION_DIRECTIONS`` of :mod:`~empatheia.generators.avatar_face`); the face drawn is
``neutral + intensity ** EXPRESSION_GAMMA * sum_k w_k d_k``. Measuring inverts this:
per-frame geometry (brow heights and slopes, eye openness, mouth outline and opening) ->
expression parameters by a linear map fitted on faces this renderer draws, the median over
frames (the 10th percentile for the jaw, which speech opens further), then non-negative
least squares onto the emotion directions.

Content layout (``content_dim >= 3``), measured per 25 fps video frame of the speech
(:func:`audio_content`); the model's C^v has one row per speech content unit, the mean
of these over the unit's frames (:meth:`AvatarRenderer.unit_content`), and
:meth:`AvatarRenderer.animate` spreads it back over the frames by the speech's
alignment (:func:`spread_units`). Speech opens the jaw on top of the expression's rest
opening, and silence closes it back to that rest
(:func:`~empatheia.generators.avatar_face.jaw_opening`)::

    col 0     loudness: frame power in dB, 0 at 50 dB under the utterance's loud frames,
              1 at them (clipped to [0, 1]; the loud frames' level is taken as at least
              :data:`LOUDNESS_FLOOR_DB`, so digital silence reads 0); it opens the mouth
    col 1     brightness: the mel-band centroid in [0, 1]; bright vowels spread the
              mouth, dark ones round it
    cols 2-   log-mel band power (``content_dim - 2`` bands, 80 Hz - 7.6 kHz), 0 at 60 dB
              under the utterance's loudest band, 1 at it
"""

from __future__ import annotations

import hashlib
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from empatheia.feature_sizes import GeneratorFeatures

from . import prosody
from .avatar_face import (
    EMOTION_DIRECTIONS,
    EMOTIONS,
    EXPRESSION_PARAMS,
    LAYOUT,
    default_portrait,
    draw_features,
    face_geometry,
    feature_mask,
    jaw_opening,
    square_crop,
)
from .base import (
    PathLike,
    TalkingHeadGenerator,
    VideoFrames,
    Waveform,
    expand_units,
    resample_rows,
    unit_means,
)

STYLE_WIDTH = len(EMOTIONS) + 1
"""Dims every S^v holds: the emotion weights and the intensity."""
GAZE_X, GAZE_Y, HEAD_MOTION = STYLE_WIDTH, STYLE_WIDTH + 1, STYLE_WIDTH + 2
"""Positions of the optional dims (see the module docstring)."""
FULL_STYLE_WIDTH = HEAD_MOTION + 1
HEAD_NOD = 0.02
"""RMS of the vertical head motion at ``head_motion`` 1, as a fraction of the side."""
HEAD_MOTION_MAX = 2.0
RIDGE = 0.1
"""Ridge weight of the emotion read-out (see :func:`style_from_expression`)."""
READ_TRUST = np.where(np.array(EXPRESSION_PARAMS) == "eye_open", 0.35, 1.0)
"""``(9,)`` weight of each expression parameter when the style is read back from it: the
lids stop short of the pupil (which the gaze is measured by), so a narrowing is drawn,
and read, far less than the other parameters."""
EXPRESSION_GAMMA = 0.6
"""The face drawn for intensity ``i`` moves its features by ``i ** EXPRESSION_GAMMA`` of the
full expression: a moderate request (0.6 draws 0.74 of the full change) already shows
clearly, as faces in photographs do, while 0 stays neutral and 1 is the full expression.
Measuring inverts it."""
HEAD_SWAY_HZ = (0.1, 0.4)
"""Frequency range of the head's sway. A slow sway moves the lower face only a little from
one frame to the next, so the mouth's own motion (what lip sync reads) stays the larger."""


# ---------------------------------------------------------------------- style
def expression_from_style(style: torch.Tensor) -> np.ndarray:
    """``(style_dim,)`` S^v -> ``(9,)`` expression parameters (0 = neutral)."""
    z = torch.nan_to_num(style.detach().float().cpu(), nan=0.0).numpy()
    weights = np.clip(z[: len(EMOTIONS)], 0.0, None)
    intensity = float(np.clip(z[len(EMOTIONS)], 0.0, 1.0))
    if weights.sum() <= 1e-6 or intensity <= 0.0:
        return np.zeros(len(EXPRESSION_PARAMS))
    return intensity**EXPRESSION_GAMMA * (weights / weights.sum()) @ EMOTION_DIRECTIONS


def gaze_from_style(style: torch.Tensor) -> Tuple[float, float]:
    """``(style_dim,)`` S^v -> the requested ``(gaze_x, gaze_y)`` in [-1, 1] (0 where the
    style has no such dim)."""
    z = torch.nan_to_num(style.detach().float().cpu(), nan=0.0).numpy()
    read = [float(np.clip(z[i], -1.0, 1.0)) if z.shape[0] > i else 0.0 for i in (GAZE_X, GAZE_Y)]
    return read[0], read[1]


def head_motion_from_style(style: torch.Tensor) -> float:
    """``(style_dim,)`` S^v -> the requested head motion in [0, :data:`HEAD_MOTION_MAX`]."""
    if style.shape[-1] <= HEAD_MOTION:
        return 0.0
    value = float(torch.nan_to_num(style.detach().float().cpu(), nan=0.0)[HEAD_MOTION])
    return float(np.clip(value, 0.0, HEAD_MOTION_MAX))


def head_path(count: int, amplitude: float, seed: int, size: int) -> np.ndarray:
    """``(count, 2)`` per-frame head shift ``(dx, dy)`` in pixels: a sum of three slow
    sinusoids per axis (:data:`HEAD_SWAY_HZ` at 25 fps, seeded phases and frequencies)
    with zero mean, scaled so that the vertical RMS is exactly ``amplitude * HEAD_NOD *
    size`` and the horizontal one half that."""
    if count < 2 or amplitude <= 0.0:
        return np.zeros((count, 2))
    rng = np.random.default_rng(seed)
    t = np.arange(count)[:, None] / 25.0
    path = np.empty((count, 2))
    for axis in range(2):
        frequency = rng.uniform(*HEAD_SWAY_HZ, size=3)
        phase = rng.uniform(0.0, 2.0 * np.pi, size=3)
        wave = np.sin(2.0 * np.pi * frequency[None, :] * t + phase[None, :]) @ np.array([1.0, 0.6, 0.35])
        wave = wave - wave.mean()
        path[:, axis] = wave / max(float(np.sqrt(np.mean(wave**2))), 1e-9)
    return path * np.array([0.5, 1.0]) * amplitude * HEAD_NOD * size


def move_head(frame: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """The ``(S, S, 3)`` frame translated by ``shift = (dx, dy)`` pixels (sub-pixel,
    edges replicated)."""
    import cv2

    if not np.any(shift):
        return frame
    matrix = np.array([[1.0, 0.0, shift[0]], [0.0, 1.0, shift[1]]], dtype=np.float64)
    size = (frame.shape[1], frame.shape[0])
    return cv2.warpAffine(frame, matrix, size, flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)


def head_shifts(frames: np.ndarray) -> np.ndarray:
    """``(F, S, S, 3)`` uint8 frames -> ``(F, 2)`` each frame's shift ``(dx, dy)`` in
    pixels, with the mean shift removed: phase correlation of the grey images (under a
    Hann window, :func:`phase_shifts`) against the first frame, then once more against the
    median of the frames shifted back (a sharp reference first, since the median of a
    moving head is blurred; then one that no single frame's mouth or blink dominates). The
    window leaves out the mouth, softly: a speaking mouth changes more between frames than
    anything else, and a phase correlation that sees it reads part of that change as a
    shift."""
    import cv2

    grey = frames.astype(np.float32) @ np.array([0.299, 0.587, 0.114], dtype=np.float32)
    size = grey.shape[1]
    mouth = np.zeros(grey.shape[1:], np.float32)
    centre = (round(0.5 * size), round((LAYOUT.mouth_y + 0.03) * size))
    cv2.ellipse(mouth, centre, (round(0.15 * size), round(0.1 * size)), 0, 0, 360, 1.0, -1)
    mouth = cv2.GaussianBlur(mouth, (0, 0), 0.03 * size)
    window = cv2.createHanningWindow(grey.shape[1:][::-1], cv2.CV_32F) * (1.0 - mouth)
    reference = grey[0]
    for _ in range(2):
        shifts = phase_shifts(reference, grey, window)
        # A frame whose mouth or lids changed most can lock onto the wrong peak; a head
        # path is smooth, so a shift over 3 px from its 5-frame median is such a miss.
        local = np.median(np.lib.stride_tricks.sliding_window_view(np.pad(shifts, ((2, 2), (0, 0)), mode="edge"), 5, axis=0), axis=-1)
        shifts = np.where(np.abs(shifts - local) > 3.0, local, shifts)
        shifts -= shifts.mean(axis=0)
        reference = np.median(np.stack([move_head(g, -d) for g, d in zip(grey, shifts)]), axis=0).astype(np.float32)
    return shifts


def phase_shifts(reference: np.ndarray, images: np.ndarray, window: np.ndarray) -> np.ndarray:
    """``(F, 2)`` shift ``(dx, dy)`` in pixels of each of the ``(F, S, S)`` grey ``images``
    against the ``(S, S)`` ``reference``, both under ``window`` ``(S, S)``: the peak of the
    phase correlation, refined to the centroid of its 5 x 5 neighbourhood (as OpenCV's
    ``phaseCorrelate`` refines it).

    The cross-power spectrum is whitened with a floor of 1e-3 of its mean magnitude.
    Plain whitening (``phaseCorrelate``'s) divides by the magnitude alone, which at
    frequencies where the windowed picture has next to no energy blows rounding noise up
    into a bias: two copies of one frame, grey-converted in different rows of one array,
    then read as up to a pixel apart."""
    spectrum = np.fft.rfft2(images * window) * np.conj(np.fft.rfft2(reference * window))
    magnitude = np.abs(spectrum)
    spectrum /= magnitude + 1e-3 * magnitude.mean(axis=(-2, -1), keepdims=True)
    correlation = np.fft.irfft2(spectrum, s=reference.shape)  # (F, S, S), peak at the shift
    f, h, w = correlation.shape
    peak = correlation.reshape(f, -1).argmax(axis=1)
    offsets = np.arange(-2, 3)
    rows = (peak // w)[:, None] + offsets  # (F, 5)
    cols = (peak % w)[:, None] + offsets
    around = np.clip(correlation[np.arange(f)[:, None, None], rows[:, :, None] % h, cols[:, None, :] % w], 0.0, None)  # (F, 5, 5)
    mass = np.maximum(around.sum(axis=(1, 2)), 1e-12)
    dy = (around.sum(axis=2) * rows).sum(axis=1) / mass
    dx = (around.sum(axis=1) * cols).sum(axis=1) / mass
    # Peaks past the middle are negative shifts (the correlation wraps around).
    return np.stack([(dx + w / 2) % w - w / 2, (dy + h / 2) % h - h / 2], axis=1)


def style_from_expression(
    expression: np.ndarray, style_dim: int, directions: np.ndarray = EMOTION_DIRECTIONS
) -> torch.Tensor:
    """``(9,)`` expression parameters -> ``(style_dim,)`` S^v: the non-negative mix of
    emotion ``directions`` ``(7, 9)`` closest to them, and the intensity that draws that
    far along it (:data:`EXPRESSION_GAMMA` inverted).

    A small ridge term keeps opposite emotions (sad and happy nearly cancel) from
    explaining measurement noise with large amounts of both; it also shrinks the amounts,
    so how far the face moved along the chosen mix is read without it, by projection."""
    trust = READ_TRUST[:, None]
    ridge = np.sqrt(RIDGE) * np.eye(len(EMOTIONS))
    system = np.concatenate([trust * directions.T, ridge])
    amounts = _nonnegative_least_squares(system, np.concatenate([READ_TRUST * expression, np.zeros(len(EMOTIONS))]))
    total = float(amounts.sum())
    style = torch.zeros(style_dim, dtype=torch.float32)
    if total > 0.05:
        weights = amounts / total
        mix = READ_TRUST * (weights @ directions)
        drawn = float(np.clip((READ_TRUST * expression) @ mix / max(float(mix @ mix), 1e-9), 0.0, 1.0))
        style[: len(EMOTIONS)] = torch.from_numpy(weights.astype(np.float32))
        style[len(EMOTIONS)] = drawn ** (1.0 / EXPRESSION_GAMMA)
    return style


def _nonnegative_least_squares(a: np.ndarray, b: np.ndarray, iterations: int = 50) -> np.ndarray:
    """``argmin ||a x - b||, x >= 0`` by Lawson-Hanson active sets (``a`` is ``(m, n)``
    with small ``n``; at most ``iterations`` outer steps)."""
    n = a.shape[1]
    x = np.zeros(n)
    active = np.zeros(n, dtype=bool)
    for _ in range(iterations):
        gradient = a.T @ (b - a @ x)
        free = ~active & (gradient > 1e-10)
        if not free.any():
            break
        active[np.argmax(np.where(free, gradient, -np.inf))] = True
        while True:
            z = np.zeros(n)
            z[active] = np.linalg.lstsq(a[:, active], b, rcond=None)[0]
            if (z[active] > 0).all():
                x = z
                break
            # Step back to the boundary and drop the variables that hit zero.
            blocked = active & (z <= 0)
            step = np.min(x[blocked] / np.maximum(x[blocked] - z[blocked], 1e-12))
            x = x + step * (z - x)
            active &= x > 1e-12
    return x


# ---------------------------------------------------------------------- content
LOUDNESS_FLOOR_DB = -60.0
"""The least level (dB of the mean square of samples in [-1, 1]) that :func:`audio_content`
takes for an utterance's loud frames. Speech is far above it (Piper's loud frames are near
-24 dB); a recording of digital silence, whose own loudest frames are silence, would
otherwise read as loud throughout and open the mouth wide."""


def audio_content(samples: np.ndarray, sample_rate: int, frames: int, content_dim: int) -> np.ndarray:
    """``(T,)`` speech -> ``(frames, content_dim)`` float32 C^v (layout in the module
    docstring), one row per 25 fps frame ``[i / 25, (i + 1) / 25)``, from 80 ms Hann
    windows centred on each frame at 16 kHz."""
    if content_dim < 3:
        raise ValueError(f"video content_dim must be >= 3 (loudness, brightness, bands), got {content_dim}")
    rate = prosody.ANALYSIS_RATE
    x = np.asarray(samples, dtype=np.float64)
    if sample_rate != rate:
        x = prosody.resample(x, sample_rate / rate)
    hop = rate // 25
    length = 2 * hop
    # frames() centres frame i on sample i * hop; the video frame's centre is half a hop on.
    block = prosody.frames(x[hop // 2 :] if x.shape[0] > hop // 2 else x, length, hop)
    block = np.pad(block, ((0, max(0, frames - block.shape[0])), (0, 0)))[:frames] * np.hanning(length)
    power = np.abs(np.fft.rfft(block, 2 * length)) ** 2
    bands = content_dim - 2
    mel = power @ prosody.mel_filterbank(2 * length, rate, bands).T  # (F, bands)
    mel_db = 10.0 * np.log10(mel + 1e-10)
    frame_db = 10.0 * np.log10(np.mean(block**2, axis=1) + 1e-10)
    loud = max(float(np.percentile(frame_db, 95) if frames > 1 else frame_db.max()), LOUDNESS_FLOOR_DB)
    out = np.empty((frames, content_dim), dtype=np.float32)
    out[:, 0] = np.clip((frame_db - (loud - 50.0)) / 50.0, 0.0, 1.0)
    weights = mel / np.maximum(mel.sum(axis=1, keepdims=True), 1e-12)
    out[:, 1] = weights @ np.linspace(0.0, 1.0, bands) if bands > 1 else 0.5
    out[:, 2:] = np.clip((mel_db - mel_db.max()) / 60.0 + 1.0, 0.0, 1.0)
    return out


MOUTH_OPENS_AT = 0.6
"""Loudness (C^v column 0) at which the mouth starts to open: 20 dB under the utterance's
loud frames. It is fully open at 1 (the loud frames). Quieter sounds (most consonants, the
tails of syllables) leave it nearly closed, so it opens and closes once per syllable
nucleus as a speaking mouth does; opening from 30 dB under kept it open through whole
words, and the lip-sync offset search no longer found the sound's onsets in its motion
(docs/small_preset.md compares the two on held-out answers)."""

UNIT_LOUDNESS_ANCHOR = 0.98
"""The most that the 95th percentile of per-unit C^v loudness over the speaking frames may
be. Loudness is relative to the utterance's own loud frames, 1 at them, by definition
(:func:`audio_content`), and the per-unit means of it that the speech's own units give put
that percentile just under 1. A model's regression of them can sit above that as a whole,
which opens the mouth fully on most units so that it no longer moves with the syllables
(``python bench/unit_loudness.py`` measures both)."""


def anchor_loudness(content: np.ndarray, speaking: np.ndarray) -> np.ndarray:
    """``(F, content_dim)`` per-frame C^v with column 0 shifted down so that its 95th
    percentile over the ``speaking`` frames ``(F,)`` bool is at most
    :data:`UNIT_LOUDNESS_ANCHOR`. A quieter request is kept as it is: a mouth asked to stay
    nearly closed stays so."""
    if not speaking.any():
        return content
    excess = float(np.percentile(content[speaking, 0], 95)) - UNIT_LOUDNESS_ANCHOR
    if excess <= 0.0:
        return content
    out = content.copy()
    out[:, 0] -= excess
    return out


def spread_units(content: np.ndarray, alignment: np.ndarray, sample_rate: int, count: int, fps: float) -> np.ndarray:
    """Per-unit C^v ``(Ls, D)`` -> per-frame ``(count, D)`` float32: each frame is the mean
    of the rows sounding over its span ``[i / fps, (i + 1) / fps)``, weighted by their
    samples under ``alignment`` ``(T,)`` (the unit at each sample, -1 in silence, which
    counts as a row of zeros: the closed mouth of no sound).

    A phoneme is often shorter than a frame; taking only the unit at each frame's centre
    skips such phonemes and moves a change of loudness to whichever frame a boundary falls
    nearest, while the sound's own envelope (which lip sync compares the mouth with) is an
    average over the frame."""
    units = content.shape[0]
    labels = np.asarray(alignment, dtype=np.int64)
    frame = np.floor(np.arange(labels.shape[0]) * fps / sample_rate).astype(np.int64)
    inside = frame < count
    row = np.where((labels < 0) | (labels >= units), units, labels)
    samples = np.bincount(frame[inside] * (units + 1) + row[inside], minlength=count * (units + 1)).reshape(count, units + 1)
    span = np.diff(np.round(np.arange(count + 1) * sample_rate / fps))  # samples per frame; past the speech, silence
    table = np.concatenate([content, np.zeros((1, content.shape[1]), content.dtype)])
    return ((samples / span[:, None]) @ table).astype(np.float32)


def mouth_drive(content: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """``(F, content_dim)`` C^v -> per-frame mouth ``opening`` in [0, 1] and
    ``roundness`` in [-1, 1] (negative: spread)."""
    loud = content[:, 0].astype(np.float64)
    opening = np.clip((loud - MOUTH_OPENS_AT) / (1.0 - MOUTH_OPENS_AT), 0.0, 1.0)
    # The jaw cannot snap shut between frames: a short smoothing, as a real jaw lags.
    opening = np.convolve(np.pad(opening, 1, mode="edge"), [0.25, 0.5, 0.25], mode="valid")
    # Rounding follows how much darker than the utterance's own average a frame sounds,
    # so that it averages out over an utterance and the mouth's mean width stays the
    # style's.
    brightness = content[:, 1].astype(np.float64)
    speaking = opening > 0.05
    centre = float(np.median(brightness[speaking])) if speaking.any() else 0.5
    roundness = np.clip((centre - brightness) * 4.0, -1.0, 1.0) * speaking
    return opening, roundness


# ---------------------------------------------------------------------- renderer
class AvatarRenderer(TalkingHeadGenerator):
    """The weight-free talking head (see the module docstring).

    Args:
        content_dim: width of a C^v row (tiny preset 20; at least 3).
        style_dim: width of S^v (tiny preset 10; at least 8).
        size: side of the rendered square frames.
        max_style_frames: most frames :meth:`style_features` reads from a video.
    """

    def __init__(self, content_dim: int = 32, style_dim: int = 16, size: int = 256, max_style_frames: int = 100):
        if style_dim < STYLE_WIDTH:
            raise ValueError(f"video style_dim must be >= {STYLE_WIDTH} (7 emotions + intensity), got {style_dim}")
        if content_dim < 3:
            raise ValueError(f"video content_dim must be >= 3 (loudness, brightness, bands), got {content_dim}")
        if size < 64:
            raise ValueError(f"size must be >= 64 pixels, got {size}")
        self.features = GeneratorFeatures(
            name="AvatarRenderer",
            content_dim=content_dim,
            content_unit="frame",
            style_dim=style_dim,
            units_per_char=25.0 / 14.0,
        )
        self.size = int(size)
        self.max_style_frames = int(max_style_frames)
        self._readout: Optional[np.ndarray] = None
        self._directions: Optional[np.ndarray] = None

    # ------------------------------------------------------------------ content
    def content_features(self, audio: Sequence[PathLike]) -> List[torch.Tensor]:
        """``(Lv, content_dim)`` float32 per recording, ``Lv = round(duration * 25)``."""
        from empatheia.media import load_audio

        out = []
        for path in audio:
            wave = load_audio(path, prosody.ANALYSIS_RATE).numpy()
            count = max(1, round(wave.shape[0] / prosody.ANALYSIS_RATE * self.fps))
            out.append(torch.from_numpy(audio_content(wave, prosody.ANALYSIS_RATE, count, self.features.content_dim)))
        return out

    def unit_content(self, speech: Waveform, count: int) -> torch.Tensor:
        """Gold per-unit C^v of a waveform with an alignment: ``(count, content_dim)``,
        the mean of :meth:`speech_content`'s frames over each unit's samples
        (:func:`empatheia.generators.base.unit_means`)."""
        if speech.alignment is None:
            raise ValueError("unit_content needs speech.alignment")
        return unit_means(self.speech_content(speech), speech.alignment, speech.sample_rate, self.fps, count)

    def speech_content(self, speech: Waveform) -> torch.Tensor:
        """C^v of a waveform in memory: ``(frame_count(speech), content_dim)``."""
        samples = speech.samples.detach().float().cpu().numpy()
        content = audio_content(samples, speech.sample_rate, self.frame_count(speech), self.features.content_dim)
        return torch.from_numpy(content)

    # ------------------------------------------------------------------ animating
    def animate(
        self,
        speech: Waveform,
        content: Optional[torch.Tensor],
        style: torch.Tensor,
        portrait: np.ndarray,
    ) -> VideoFrames:
        """Frames spanning ``speech``; ``content`` is ``(Ls, content_dim)`` per speech unit
        when ``speech.alignment`` is given (each frame takes the mean of the units sounding
        over its span, :func:`spread_units`, and a frame whose centre is in silence closes
        the jaw to the expression's rest), a per-frame time series (resampled to
        ``frame_count``) without one, or ``None`` (derived from the speech)."""
        count = self.frame_count(speech)
        silent = np.zeros(count, dtype=bool)
        if content is None:
            content = self.speech_content(speech)
        else:
            if content.dim() != 2 or content.shape[1] != self.features.content_dim:
                raise ValueError(f"video content must be (L, {self.features.content_dim}), got {tuple(content.shape)}")
            content = content.detach().float().cpu()
            if speech.alignment is not None:
                # The unit at each frame's centre says which frames are silence (and checks
                # that C^v has a row for every unit the speech names).
                _, labels = expand_units(content, speech, count, self.fps, torch.zeros(content.shape[1]))
                silent = labels.numpy() < 0
                spread = spread_units(content.numpy(), speech.alignment.numpy(), speech.sample_rate, count, self.fps)
                content = torch.from_numpy(anchor_loudness(spread, ~silent))
            else:
                content = resample_rows(content, count)
        if style.shape[-1] != self.features.style_dim:
            raise ValueError(f"video style must have {self.features.style_dim} dims, got {tuple(style.shape)}")
        expression = expression_from_style(style)
        opening, roundness = mouth_drive(content.numpy())
        # Silence closes the jaw to the expression's rest whatever C^v says: the jaw
        # smoothing would otherwise carry a neighbour's opening into the pause.
        opening, roundness = np.where(silent, 0.0, opening), np.where(silent, 0.0, roundness)
        base = self.prepare_portrait(portrait)
        blinks = self._blinks(count, base)
        gaze, path = gaze_from_style(style), self._head_path(count, style, base)
        frames = np.empty((count, self.size, self.size, 3), dtype=np.uint8)
        for i in range(count):  # per frame, not per sample: OpenCV draws one image at a time
            frames[i] = move_head(draw_features(base, expression, opening[i], roundness[i], blinks[i], gaze=gaze), path[i])
        return VideoFrames(torch.from_numpy(frames), self.fps)

    def describe_style(self, style: torch.Tensor) -> dict:
        """The face ``style`` ``(style_dim,)`` asks for: its strongest emotion, the mix of
        emotions (weights summing to 1, those under 5 % left out), the intensity, and
        where the style has the dims, the gaze ``(x, y)`` in [-1, 1] and the head motion."""
        z = torch.nan_to_num(style.detach().float().cpu(), nan=0.0).numpy()
        weights = np.clip(z[: len(EMOTIONS)], 0.0, None)
        intensity = float(np.clip(z[len(EMOTIONS)], 0.0, 1.0))
        if weights.sum() <= 1e-6 or intensity <= 0.0:
            described = {"emotion": "neutral", "intensity": 0.0}
        else:
            shares = weights / weights.sum()
            described = {
                "emotion": EMOTIONS[int(shares.argmax())],
                "mix": {name: round(float(w), 3) for name, w in zip(EMOTIONS, shares) if w >= 0.05},
                "intensity": round(intensity, 3),
            }
        if self.features.style_dim > GAZE_Y:
            described["gaze"] = [round(v, 3) for v in gaze_from_style(style)]
        if self.features.style_dim > HEAD_MOTION:
            described["head_motion"] = round(head_motion_from_style(style), 3)
        return described

    def prepare_portrait(self, portrait: np.ndarray) -> np.ndarray:
        """The portrait at ``size`` with its own eyes, brows and mouth painted out."""
        import cv2

        image = square_crop(portrait, self.size)
        return cv2.inpaint(image, feature_mask(self.size, LAYOUT), 5, cv2.INPAINT_TELEA)

    def _head_path(self, count: int, style: torch.Tensor, base: np.ndarray) -> np.ndarray:
        """``(count, 2)`` head shifts for the style's head motion (:func:`head_path`),
        seeded by the portrait so the same avatar moves the same way."""
        seed = int.from_bytes(hashlib.sha256(b"head" + base.tobytes()).digest()[:4], "little")
        return head_path(count, head_motion_from_style(style), seed, self.size)

    def _blinks(self, count: int, base: np.ndarray) -> np.ndarray:
        """``(count,)`` lid factors: a blink (3 frames) every 2.5-5 s, timed from a seed
        of the portrait, so the same avatar blinks the same way."""
        seed = int.from_bytes(hashlib.sha256(base.tobytes()).digest()[:4], "little")
        rng = np.random.default_rng(seed)
        factors = np.ones(count)
        start = int(rng.uniform(1.0, 2.5) * self.fps)
        while start < count:
            shape = np.array([0.45, 0.08, 0.5])[: count - start]
            factors[start : start + shape.shape[0]] = shape
            start += int(rng.uniform(2.5, 5.0) * self.fps)
        return factors

    # ------------------------------------------------------------------ style
    def style_features(self, video: Sequence[PathLike]) -> List[torch.Tensor]:
        """``(style_dim,)`` float32 per video, measured from up to ``max_style_frames``
        of its frames (see the module docstring)."""
        from empatheia.media import load_video_frames

        out = []
        for path in video:
            frames = load_video_frames(path, max_frames=self.max_style_frames, frame_rate=self.fps).numpy()
            out.append(self.measure(frames))
        return out

    def measure(self, frames: np.ndarray) -> torch.Tensor:
        """S^v of ``(F, H, W, 3)`` uint8 frames in memory."""
        frames = np.asarray(frames)
        if frames.shape[1] != self.size or frames.shape[2] != self.size:
            frames = np.stack([square_crop(f, self.size) for f in frames])
        style_dim = self.features.style_dim
        shifts = head_shifts(frames) if frames.shape[0] > 1 else np.zeros((frames.shape[0], 2))
        still = np.stack([move_head(frame, -shift) for frame, shift in zip(frames, shifts)])
        readout = self.readout(still)
        style = style_from_expression(self._expression_of(readout), style_dim, self._read_directions())
        gaze = self._gaze_of(readout)
        motion = float(np.sqrt(np.mean(shifts[:, 1] ** 2))) / (HEAD_NOD * self.size)
        for index, value in ((GAZE_X, gaze[0]), (GAZE_Y, gaze[1]), (HEAD_MOTION, motion)):
            if index < style_dim:
                style[index] = value
        return style

    def readout(self, frames: np.ndarray) -> np.ndarray:
        """``(F, 11)`` per-frame readout of still (not head-moving) frames: the 9
        expression parameters, then ``gaze_x``, ``gaze_y``."""
        geometry = face_geometry(frames)
        return np.concatenate([geometry, np.ones((geometry.shape[0], 1))], axis=1) @ self._fitted_readout()

    def expression(self, frames: np.ndarray) -> np.ndarray:
        """``(9,)`` expression parameters of a clip of still frames (see
        :meth:`_expression_of`)."""
        return self._expression_of(self.readout(frames))

    @staticmethod
    def _gaze_of(per_frame: np.ndarray) -> np.ndarray:
        """``(2,)`` gaze of a clip: the median over frames, clipped to [-1, 1]."""
        return np.clip(np.median(per_frame[:, len(EXPRESSION_PARAMS) :], axis=0), -1.0, 1.0)

    @staticmethod
    def _expression_of(per_frame: np.ndarray) -> np.ndarray:
        """``(9,)`` expression parameters from the per-frame readout: the median over
        frames; the jaw from the 10th percentile of the mouth opening, since speech only
        ever opens it further."""
        per_frame = per_frame[:, : len(EXPRESSION_PARAMS)]
        expression = np.median(per_frame, axis=0)
        jaw = EXPRESSION_PARAMS.index("jaw_open")
        expression[jaw] = np.percentile(per_frame[:, jaw], 10)
        # Blinks narrow the eyes for a few frames; the upper half of the openness is the
        # face's own.
        eye = EXPRESSION_PARAMS.index("eye_open")
        expression[eye] = np.percentile(per_frame[:, eye], 60)
        return expression

    def _fitted_readout(self) -> np.ndarray:
        """``(18, 11)`` least-squares map from ``[geometry, 1]`` to the 9 expression
        parameters (mouth opening counted into ``jaw_open``) and the gaze, fitted once on
        faces this renderer draws with random expressions, gazes and speech over a few
        default portraits."""
        if self._readout is None:
            rng = np.random.default_rng(0)
            count = 240
            expressions = rng.uniform(-1.0, 1.0, size=(count, len(EXPRESSION_PARAMS)))
            expressions[:, EXPRESSION_PARAMS.index("eye_open")] *= 0.7
            for name in ("jaw_open", "lip_raise"):
                expressions[:, EXPRESSION_PARAMS.index(name)] = rng.uniform(0.0, 1.0, size=count)
            # Mixed emotions as well as random faces, so that the readout is best where
            # renderer styles actually fall.
            mixes = rng.dirichlet(np.ones(len(EMOTIONS)) * 0.3, size=count // 2)
            expressions[: count // 2] = (mixes * rng.uniform(0.2, 1.0, (count // 2, 1))) @ EMOTION_DIRECTIONS
            openings = rng.uniform(0.0, 1.0, size=count) * (rng.random(count) < 0.6)
            roundness = rng.uniform(-1.0, 1.0, size=count) * (openings > 0.05)
            gazes = rng.uniform(-1.0, 1.0, size=(count, 2))
            portraits = self._fit_portraits()
            frames = np.stack(
                [
                    draw_features(
                        portraits[i % len(portraits)], expressions[i], openings[i], roundness[i], gaze=tuple(gazes[i])
                    )
                    for i in range(count)
                ]
            )
            geometry = face_geometry(frames)
            inputs = np.concatenate([geometry, np.ones((count, 1))], axis=1)
            targets = np.concatenate([expressions, gazes], axis=1)
            # The mouth's opening counts into the jaw as drawn: the speech's share of what
            # the expression's rest leaves.
            jaw = EXPRESSION_PARAMS.index("jaw_open")
            targets[:, jaw] = [jaw_opening(rest, speech) for rest, speech in zip(expressions[:, jaw], openings)]
            # A little ridge keeps the map steady where two geometry columns move together.
            gram = inputs.T @ inputs + 1e-4 * np.eye(inputs.shape[1])
            self._readout = np.linalg.solve(gram, inputs.T @ targets)
        return self._readout

    def _read_directions(self) -> np.ndarray:
        """``(7, 9)`` each emotion's direction as :meth:`readout` reads it: the slope,
        through the origin, of the expression read from faces drawn at half and at full
        intensity over the readout's portraits. The drawing is not linear everywhere (the
        lids stop short of the pupil, a raised upper lip widens the mouth's outline), and
        matching the face read against what the same reading gives for each emotion keeps
        such bends from reading as a mix of other emotions."""
        if self._directions is None:
            portraits = self._fit_portraits()
            levels = np.repeat([0.5, 1.0], len(portraits))  # (L,) drawn amount of each face
            faces = [draw_features(p, level * d) for d in EMOTION_DIRECTIONS for level in (0.5, 1.0) for p in portraits]
            read = self.readout(np.stack(faces))[:, : len(EXPRESSION_PARAMS)]  # (7 * L, 9)
            read = read.reshape(len(EMOTIONS), levels.shape[0], len(EXPRESSION_PARAMS))
            self._directions = np.einsum("l,klp->kp", levels, read) / float(levels @ levels)
        return self._directions

    def _fit_portraits(self) -> List[np.ndarray]:
        """The prepared default portraits that the readout is fitted on."""
        profiles = [{"gender": "female", "age": "young"}, {"gender": "male", "age": "elderly"}, {"gender": "male", "age": "child"}]
        return [self.prepare_portrait(default_portrait(p, seed, self.size)) for seed, p in enumerate(profiles)]

    def fingerprint(self) -> str:
        # v3: the face is drawn and its style read back otherwise (FACS expressions, the jaw
        # shared with speech, the readout against measured directions), so gold S^v of
        # the same clip differs from v2's.
        return f"AvatarRenderer/v3/{self.size}px/c{self.features.content_dim}/s{self.features.style_dim}"
