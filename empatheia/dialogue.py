"""Multimodal dialogues: the input of :meth:`Empatheia.respond` and of the batch builder.

Datasets are read into them by :mod:`empatheia.data.readers` (an AvaMERG conversation's
turn: :func:`~empatheia.data.readers.avamerg_dialogue`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Union

from .prompts import ROLE_NAMES, ChainOfEmpathy

if TYPE_CHECKING:
    import numpy as np
    import torch

AudioInput = Union[None, str, Path, "np.ndarray", "torch.Tensor"]
VideoInput = Union[None, str, Path, "np.ndarray", "torch.Tensor"]


@dataclass
class Turn:
    """One utterance.

    ``audio`` is a path to an audio file or a mono waveform (then ``sample_rate`` is
    required); ``video`` is a path to a video file or ``(F, H, W, 3)`` uint8 RGB frames.
    """

    role: str
    text: str = ""
    audio: AudioInput = None
    sample_rate: Optional[int] = None
    video: VideoInput = None
    profile: Optional[Dict[str, str]] = None

    def __post_init__(self):
        if self.role not in ROLE_NAMES:
            raise ValueError(f"unknown role {self.role!r}; a turn's role is one of {sorted(ROLE_NAMES)}")
        if not isinstance(self.text, str):
            raise TypeError(f"turn text must be a string, got {type(self.text).__name__}")
        if self.audio is not None and not isinstance(self.audio, (str, Path)) and self.sample_rate is None:
            raise ValueError("a turn with a waveform as audio needs its sample_rate")
        if not self.text.strip() and self.audio is None and self.video is None:
            raise ValueError(f"a {self.role} turn needs text, audio or video")


def last_speaker_index(dialogue: "Dialogue", modality: str) -> Optional[int]:
    """Index of the last speaker turn that has ``modality`` (``"audio"``, ``"video"``, or
    ``"text"``: non-empty text): the user's most recent expression, which the reply answers."""
    for index in range(len(dialogue.turns) - 1, -1, -1):
        turn = dialogue.turns[index]
        if turn.role == "speaker" and (turn.text.strip() if modality == "text" else getattr(turn, modality) is not None):
            return index
    return None


@dataclass
class Dialogue:
    """A dialogue history to respond to, speaker first; optionally with the gold response
    and Chain of Empathy (training data)."""

    turns: List[Turn]
    id: Optional[str] = None
    context: Optional[str] = None
    """The situation behind the dialogue, when the data has one."""
    speaker_profile: Optional[Dict[str, str]] = None
    listener_profile: Optional[Dict[str, str]] = None
    response: Optional[str] = None
    chain: Optional[ChainOfEmpathy] = None
    response_audio: Optional[Path] = None
    """The gold response's speech (training data with media)."""
    response_video: Optional[Path] = None
    """The gold response's talking-head video (training data with media)."""
    emotion: Optional[str] = None
    """The dialogue's free-text emotion label (training data); defaults to the chain's
    ``speaker_emotion``."""
    missing_media: List[str] = field(default_factory=list)
    """Media files that were expected but absent (only with ``require_media=False``)."""

    def __post_init__(self):
        if not self.turns:
            raise ValueError(f"dialogue {self.id or ''} has no turns".replace("  ", " "))
        if self.context is not None and not isinstance(self.context, str):
            # Caught here, not when the prompt is rendered after the model has loaded.
            raise TypeError(f"dialogue context must be a string, got {type(self.context).__name__}")
        if self.emotion is None and self.chain is not None and self.chain.speaker_emotion:
            self.emotion = self.chain.speaker_emotion
