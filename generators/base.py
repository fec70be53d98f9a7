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

from .features import GeneratorFeatures

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
            :func:`generators.prosody.speech_mask`).
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


def gold_feature_extractors(speech: SpeechGenerator, talking_head: TalkingHeadGenerator) -> list:
    """The four gold features of stages 2-4 as extractors for
    :func:`empatheia.data.extract_gold_features`."""
    return [
        _GoldFeature("speech_content", "text", speech, "content_features"),
        _GoldFeature("speech_style", "audio", speech, "style_features"),
        _GoldFeature("video_content", "audio", talking_head, "content_features"),
        _GoldFeature("video_style", "video", talking_head, "style_features"),
    ]
