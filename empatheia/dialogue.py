"""Multimodal dialogues: the input of :meth:`Empatheia.respond` and of the batch builder.

Datasets are read into them by :mod:`empatheia.data.readers` (an AvaMERG conversation's
turn: :func:`~empatheia.data.readers.avamerg_dialogue`)."""

from __future__ import annotations

import dataclasses
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


def speaker_words(dialogue: "Dialogue", first_turn: int = 0) -> "Dialogue":
    """``dialogue`` told as the speaker alone: one speaker turn holding the text of the
    speaker's turns from ``first_turn`` on, joined by spaces, with the media (and profile)
    of the last of them; the listener's turns are left out.

    Why: a core that answers a later turn by repeating the listener's earlier one
    (:meth:`~empatheia.modeling.Empatheia.generate_text` with
    ``language_model.listener_echo_reanswer``) is given a dialogue with nothing of the
    listener's to repeat, in the form it answers best, a speaker's first turn."""
    kept = [t for t in dialogue.turns[first_turn:] if t.role == "speaker"]
    if not kept:
        raise ValueError(f"dialogue {dialogue.id or ''} has no speaker turn from turn {first_turn} on".replace("  ", " "))
    last = kept[-1]
    text = " ".join(t.text.strip() for t in kept if t.text.strip())
    return dataclasses.replace(dialogue, turns=[dataclasses.replace(last, text=text)])


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
