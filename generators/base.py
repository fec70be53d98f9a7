"""The two generator roles Empatheia drives, and what passes between them.

A :class:`SpeechGenerator` turns the response text, the speech content feature C^s and
the speech style feature S^s into a waveform; a :class:`TalkingHeadGenerator` turns that
waveform (or the video content feature C^v), the video style feature S^v and the avatar's
portrait into frames. Each also defines the gold features that training aligns the heads
with (``content_features``/``style_features``), which :func:`gold_feature_extractors`
offers to ``empatheia data extract-features``.
"""

from __future__ import annotations

import abc
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from empatheia.feature_sizes import GeneratorFeatures

PathLike = Union[str, Path]


@dataclass
class Waveform:
    samples: torch.Tensor
    """``(T,)`` float32 in [-1, 1]."""
    sample_rate: int
    alignment: Optional[torch.Tensor] = None
    """``(T,)`` int64 or ``None``: per sample, the content unit sounding (the row of
    C^s, 0..Ls-1), -1 where the generator put silence (sentence gaps, pauses it
    inserted, leading and trailing silence). ``None`` when the generator cannot say."""

    def __post_init__(self):
        if self.alignment is not None and self.alignment.shape != self.samples.shape:
            raise ValueError(
                f"alignment must have one label per sample {tuple(self.samples.shape)}, got {tuple(self.alignment.shape)}"
            )

    @property
    def duration(self) -> float:
        return self.samples.shape[0] / self.sample_rate


@dataclass
class VideoFrames:
    frames: torch.Tensor
    """``(F, H, W, 3)`` uint8 RGB."""
    fps: float

    @property
    def duration(self) -> float:
        return self.frames.shape[0] / self.fps


@dataclass
class Avatar:
    """Who answers: the same avatar keeps the same voice and face across turns."""

    key: str
    """Stable identity, e.g. an AvaMERG listener ``ID`` or a registered name."""
    portrait: np.ndarray
    """``(H, W, 3)`` uint8 RGB reference portrait (DreamTalk renders 256 x 256)."""
    voice: str
    """The speech generator's voice: a voice name, or a reference clip path for
    generators that clone a voice (StyleTTS2)."""
    profile: dict
    """``age``, ``gender``, ``timbre``... of the avatar."""

    def seed(self) -> int:
        """A seed derived from the key, for anything an avatar draws at random."""
        return int.from_bytes(hashlib.sha256(self.key.encode()).digest()[:4], "little")


class SpeechGenerator(abc.ABC):
    """Text + C^s + S^s -> speech."""

    features: GeneratorFeatures
    sample_rate: int
    unit_vocab_size: int = 0
    """How many distinct unit ids :meth:`content_units` gives (0: it gives none)."""

    def content_units(self, text: str) -> torch.Tensor:
        """``(Ls,)`` int64 ids of the content units ``synthesize`` reads for ``text``, in
        the order of C^s's rows (``Ls == content_length(text)``), each below
        :attr:`unit_vocab_size`."""
        raise NotImplementedError(f"{type(self).__name__} does not give content unit ids (unit_vocab_size is 0)")

    @abc.abstractmethod
    def content_length(self, text: str) -> int:
        """How many content units (phonemes) ``synthesize`` reads for ``text``: the length
        the Content Synchronizer's speech output must have."""

    @abc.abstractmethod
    def synthesize(
        self, text: str, content: Optional[torch.Tensor], style: torch.Tensor, avatar: Avatar
    ) -> Waveform:
        """
        Args:
            text: the response text.
            content: ``(Ls, content_dim)`` C^s with ``Ls == content_length(text)``, or
                ``None`` to read the text alone.
            style: ``(style_dim,)`` S^s.
            avatar: whose voice speaks.
        """

    @abc.abstractmethod
    def content_features(self, texts: Sequence[str]) -> List[torch.Tensor]:
        """Gold C^s of each response text: ``(Ls, content_dim)`` each."""

    @abc.abstractmethod
    def style_features(self, audio: Sequence[PathLike]) -> List[torch.Tensor]:
        """Gold S^s of each response recording: ``(style_dim,)`` each."""

    def describe_style(self, style: torch.Tensor) -> Optional[dict]:
        """What ``style`` ``(style_dim,)`` asks the voice for, in words and units a
        person reads (``None`` where the style is a learned embedding)."""
        return None

    def fingerprint(self) -> str:
        """Identifies the weights behind the gold features (stores built from other
        weights are refused)."""
        return type(self).__name__


class TalkingHeadGenerator(abc.ABC):
    """Speech (or C^v) + S^v + portrait -> talking-head frames."""

    features: GeneratorFeatures
    fps: float = 25.0

    def frame_count(self, speech: Waveform) -> int:
        """Frames for ``speech``: the length of the Content Synchronizer's video output."""
        return max(1, round(speech.duration * self.fps))

    @abc.abstractmethod
    def animate(
        self,
        speech: Waveform,
        content: Optional[torch.Tensor],
        style: torch.Tensor,
        portrait: np.ndarray,
    ) -> VideoFrames:
        """
        Args:
            speech: the spoken response; the frames span exactly its duration.
            content: ``(Ls, content_dim)`` C^v, one row per speech content unit, expanded
                to frames by ``speech.alignment`` (:func:`expand_units`); or ``None`` to
                derive the content from ``speech``. Without an alignment a C^v is taken
                as a time series and resampled to ``frame_count``.
            style: ``(style_dim,)`` S^v.
            portrait: ``(H, W, 3)`` uint8 RGB of the avatar.
        """

    @abc.abstractmethod
    def content_features(self, audio: Sequence[PathLike]) -> List[torch.Tensor]:
        """C^v of each recording per video frame: ``(F, content_dim)`` each. The gold C^v
        of training is this pooled per speech unit (:func:`unit_content_features`)."""

    @abc.abstractmethod
    def style_features(self, video: Sequence[PathLike]) -> List[torch.Tensor]:
        """Gold S^v of each response video: ``(style_dim,)`` each."""

    def describe_style(self, style: torch.Tensor) -> Optional[dict]:
        """What ``style`` ``(style_dim,)`` asks the face for, in words a person reads
        (``None`` where the style is a learned embedding)."""
        return None

    def fingerprint(self) -> str:
        return type(self).__name__


def frame_units(alignment: torch.Tensor, sample_rate: int, count: int, fps: float) -> torch.Tensor:
    """``(T,)`` per-sample unit labels -> ``(count,)`` int64: the label sounding at each
    video frame's centre, ``(i + 0.5) / fps`` seconds (-1: silence). Past the end of
    the speech a frame is silence."""
    centres = torch.floor((torch.arange(count, dtype=torch.float64) + 0.5) / fps * sample_rate).long()
    inside = centres < alignment.shape[0]
    labels = torch.full((count,), -1, dtype=torch.long)
    labels[inside] = alignment.long().cpu()[centres[inside]]
    return labels


def expand_units(
    content: torch.Tensor, speech: Waveform, count: int, fps: float, silence: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-unit C^v ``(Ls, D)`` -> per-frame ``(count, D)`` by ``speech.alignment``: each
    frame takes the unit at its centre (:func:`frame_units`), a frame in silence takes
    ``silence`` ``(D,)``. Returns ``(frames (count, D), labels (count,))``."""
    if speech.alignment is None:
        raise ValueError("expanding per-unit content needs speech.alignment (the unit at each sample)")
    labels = frame_units(speech.alignment, speech.sample_rate, count, fps)
    top = int(labels.max()) if labels.numel() else -1
    if top >= content.shape[0]:
        raise ValueError(
            f"video content has {content.shape[0]} rows but speech.alignment names unit {top}: "
            "C^v must have one row per speech content unit (content_length)"
        )
    table = torch.cat([content, silence.to(content.dtype).reshape(1, -1)])  # row -1 is silence
    return table[labels], labels


def unit_means(frames: torch.Tensor, alignment: torch.Tensor, sample_rate: int, fps: float, count: int) -> torch.Tensor:
    """Per-frame content ``(F, D)`` -> per-unit ``(count, D)``: each unit's mean over the
    frames it sounds in, weighted by its samples in each frame (so that a unit shorter
    than a frame still gets the frame it falls in). A unit with no samples (timing
    edits can remove one) is interpolated from its neighbours in unit order.

    Args:
        alignment: ``(T,)`` per-sample unit labels, -1 for silence.
        count: the number of units ``Ls``."""
    alignment = alignment.long().cpu()
    frame_of = torch.clamp((torch.arange(alignment.shape[0], dtype=torch.float64) * fps / sample_rate).long(), max=frames.shape[0] - 1)
    keep = (alignment >= 0) & (alignment < count)
    pairs = alignment[keep] * frames.shape[0] + frame_of[keep]
    weights = torch.bincount(pairs, minlength=count * frames.shape[0]).reshape(count, frames.shape[0]).double()
    totals = weights.sum(1)
    means = (weights @ frames.double()) / totals.clamp(min=1)[:, None]
    present = totals > 0
    if not bool(present.any()):
        raise ValueError("the alignment names none of the units: nothing to pool")
    if not bool(present.all()):
        order = torch.arange(count, dtype=torch.float64)
        filled = np.stack(
            [np.interp(order.numpy(), order[present].numpy(), column) for column in means[present].T.numpy()], axis=1
        )
        means = torch.from_numpy(filled)
    return means.to(frames.dtype)


def even_alignment(speaking: np.ndarray, count: int, samples: int, sample_rate: int, hop: float) -> torch.Tensor:
    """An alignment for a recording without one: ``count`` units spread evenly over its
    speaking frames, -1 elsewhere.

    Args:
        speaking: ``(N,)`` bool, one analysis frame per ``hop`` s (e.g.
            :func:`empatheia.generators.prosody.speech_mask`).
        samples: the recording's length ``T``.
    Returns ``(T,)`` int64."""
    frame_of = np.minimum((np.arange(samples) / (hop * sample_rate)).astype(np.int64), speaking.shape[0] - 1)
    rank = np.cumsum(speaking) - 1  # speaking frames numbered 0..S-1
    total = max(int(speaking.sum()), 1)
    units = np.minimum((rank[frame_of] * count) // total, count - 1)
    return torch.from_numpy(np.where(speaking[frame_of], units, -1).astype(np.int64))


def resample_rows(features: torch.Tensor, length: int) -> torch.Tensor:
    """``(L, D)`` -> ``(length, D)`` by linear interpolation along time."""
    if features.shape[0] == length:
        return features
    x = features.float().T.unsqueeze(0)  # (1, D, L)
    out = torch.nn.functional.interpolate(x, size=length, mode="linear", align_corners=True)
    return out[0].T.to(features.dtype)


class _GoldFeature:
    """One gold feature of a generator in the shape ``extract_gold_features`` reads."""

    def __init__(self, name: str, input: str, generator, method: str):
        self.name, self.input, self._generator, self._method = name, input, generator, method

    def fingerprint(self) -> str:
        return f"{self._generator.fingerprint()}:{self._method}"

    def __call__(self, items):
        return getattr(self._generator, self._method)(items)


ALIGNMENT_SUFFIX = ".align.npy"
"""Beside a rendered clip ``uttN.wav``, ``uttN.align.npy`` holds its alignment."""


def alignment_path(audio: PathLike) -> Path:
    """Where the alignment of the clip ``audio`` is kept: ``<stem>.align.npy`` beside it."""
    audio = Path(audio)
    return audio.with_name(audio.stem + ALIGNMENT_SUFFIX)


def alignment_runs(alignment: torch.Tensor) -> np.ndarray:
    """``(T,)`` per-sample labels -> ``(R, 3)`` int64 rows ``[unit, start, end)`` of its
    runs (the compact form kept on disk; silence runs have unit -1)."""
    labels = alignment.long().cpu().numpy()
    if labels.size == 0:
        return np.zeros((0, 3), dtype=np.int64)
    starts = np.flatnonzero(np.concatenate([[True], labels[1:] != labels[:-1]]))
    ends = np.concatenate([starts[1:], [labels.size]])
    return np.stack([labels[starts], starts, ends], axis=1).astype(np.int64)


def alignment_from_runs(runs: np.ndarray, samples: int) -> torch.Tensor:
    """``(R, 3)`` rows ``[unit, start, end)`` -> ``(samples,)`` int64 labels, -1 where no
    run covers a sample."""
    runs = np.asarray(runs, dtype=np.int64).reshape(-1, 3)
    labels = np.full(samples, -1, dtype=np.int64)
    lengths = np.clip(np.minimum(runs[:, 2], samples) - runs[:, 1], 0, None)
    positions = np.repeat(runs[:, 1], lengths) + (np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths))
    labels[positions] = np.repeat(runs[:, 0], lengths)
    return torch.from_numpy(labels)


class _SpeechUnits:
    """Gold ``speech_units`` of a response text: ``(Ls, 1)`` int64 unit ids (a column,
    since the store keeps ``(L, D)`` sequences)."""

    name, input = "speech_units", "text"

    def __init__(self, speech: SpeechGenerator):
        self._speech = speech

    def fingerprint(self) -> str:
        return f"{self._speech.fingerprint()}:content_units"

    def __call__(self, texts):
        return [self._speech.content_units(text).reshape(-1, 1) for text in texts]


class _UnitVideoContent:
    """Gold C^v of a response recording, one row per speech unit of its text: the
    talking head's per-frame content averaged over each unit's samples
    (:func:`unit_means`).

    The unit timing comes from the clip's alignment sidecar (:func:`alignment_path`),
    which ``empatheia data render`` writes for every clip it synthesises. A recording
    without one (real speech) gets the documented fallback: the text's units spread
    evenly over the recording's speaking frames (:func:`empatheia.generators.prosody.speech_mask`),
    a rough timing that keeps per-unit targets defined."""

    name, input = "video_content", "speech"

    def __init__(self, speech: SpeechGenerator, talking_head: TalkingHeadGenerator):
        self._speech, self._head = speech, talking_head

    def fingerprint(self) -> str:
        return f"{self._head.fingerprint()}:unit_content-v1:{self._speech.fingerprint()}"

    def __call__(self, items):
        import soundfile

        from empatheia.errors import DataError

        from . import prosody

        out = []
        frames_all = self._head.content_features([path for _, path in items])
        for (text, path), frames in zip(items, frames_all):
            count = self._speech.content_length(text)
            if count < 1:
                raise DataError(f"text {text!r} has no speech units", field="text")
            sidecar = alignment_path(path)
            if sidecar.is_file():
                info = soundfile.info(str(path))
                alignment = alignment_from_runs(np.load(sidecar), info.frames)
                rate = info.samplerate
                top = int(alignment.max())
                if top >= count:
                    raise DataError(
                        f"alignment names unit {top} but the text reads as {count} units", file=sidecar, field="alignment"
                    )
            else:
                from empatheia.media import load_audio

                wave = load_audio(path, prosody.ANALYSIS_RATE).numpy()
                speaking = prosody.speech_mask(prosody.frame_db(wave, prosody.ANALYSIS_RATE))
                rate = prosody.ANALYSIS_RATE
                alignment = even_alignment(speaking, count, wave.shape[0], rate, prosody.HOP)
            if not bool((alignment >= 0).any()):
                raise DataError("the recording has no speaking samples to pool", file=path, field="audio")
            out.append(unit_means(frames, alignment, rate, self._head.fps, count))
        return out


def gold_feature_extractors(speech: SpeechGenerator, talking_head: TalkingHeadGenerator) -> list:
    """The gold features of stages 2-4 as extractors for
    :func:`empatheia.data.extract_gold_features`: ``speech_content`` (text),
    ``speech_style`` (audio), ``video_content`` per speech unit (text and audio: see
    :class:`_UnitVideoContent`), ``video_style`` (video), and with a speech generator that
    gives unit ids, ``speech_units`` (text)."""
    extractors = [
        _GoldFeature("speech_content", "text", speech, "content_features"),
        _GoldFeature("speech_style", "audio", speech, "style_features"),
        _UnitVideoContent(speech, talking_head),
        _GoldFeature("video_style", "video", talking_head, "style_features"),
    ]
    if speech.unit_vocab_size > 0:
        extractors.append(_SpeechUnits(speech))
    return extractors
