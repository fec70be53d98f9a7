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
from typing import List, Optional, Sequence, Union

import numpy as np
import torch

from .features import GeneratorFeatures

PathLike = Union[str, Path]


@dataclass
class Waveform:
    samples: torch.Tensor
    """``(T,)`` float32 in [-1, 1]."""
    sample_rate: int

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
            content: ``(Lv, content_dim)`` C^v, or ``None`` to derive the content from
                ``speech``; a C^v of another length is resampled to ``frame_count``.
            style: ``(style_dim,)`` S^v.
            portrait: ``(H, W, 3)`` uint8 RGB of the avatar.
        """

    @abc.abstractmethod
    def content_features(self, audio: Sequence[PathLike]) -> List[torch.Tensor]:
        """Gold C^v of each response recording: ``(Lv, content_dim)`` each, one row per
        video frame."""

    @abc.abstractmethod
    def style_features(self, video: Sequence[PathLike]) -> List[torch.Tensor]:
        """Gold S^v of each response video: ``(style_dim,)`` each."""

    def describe_style(self, style: torch.Tensor) -> Optional[dict]:
        """What ``style`` ``(style_dim,)`` asks the face for, in words a person reads
        (``None`` where the style is a learned embedding)."""
        return None

    def fingerprint(self) -> str:
        return type(self).__name__


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
