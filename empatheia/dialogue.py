"""Multimodal dialogues: the input of :meth:`Empatheia.respond` and of the batch builder."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import numpy as np
import torch

from .prompts import ROLE_NAMES, ChainOfEmpathy

AudioInput = Union[None, str, Path, np.ndarray, torch.Tensor]
VideoInput = Union[None, str, Path, np.ndarray, torch.Tensor]


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
    missing_media: List[str] = field(default_factory=list)
    """Media files that were expected but absent (only with ``require_media=False``)."""

    def __post_init__(self):
        if not self.turns:
            raise ValueError(f"dialogue {self.id or ''} has no turns".replace("  ", " "))

    @classmethod
    def from_avamerg(
        cls,
        conversation: Dict[str, Any],
        turn: int = -1,
        media_root: Optional[Union[str, Path]] = None,
        require_media: bool = True,
    ) -> "Dialogue":
        """Build the dialogue of one turn of a released AvaMERG conversation.

        ``turn`` indexes ``conversation["turns"]`` (``-1``: the last). With ``media_root``
        each utterance's ``dia{conversation_id}utt{index}_{avatar ID}.wav/.mp4`` is
        attached; a missing file is an error naming it, or with ``require_media=False`` is
        listed in ``missing_media``. Test-form conversations (no profiles) match any avatar
        ID. Train-form turns also give the gold ``response`` and ``chain``.
        """
        cid = conversation.get("conversation_id", "?")
        where = f"conversation {cid}"
        turns = _require(conversation, "turns", where, list)
        if not turns:
            raise ValueError(f"{where}: 'turns' is empty")
        try:
            record = turns[turn]
        except IndexError:
            raise IndexError(f"{where}: turn {turn} out of range (it has {len(turns)} turns)") from None
        where = f"{where}, turn {record.get('turn_id', turn)}"
        history = _require(record, "dialogue_history", where, list)
        profiles = {
            "speaker": conversation.get("speaker_profile"),
            "listener": conversation.get("listener_profile"),
        }
        root = Path(media_root) if media_root is not None else None
        missing: List[str] = []
        out_turns = []
        for position, utterance in enumerate(history):
            at = f"{where}, dialogue_history[{position}]"
            role = _require(utterance, "role", at, str)
            if role not in ROLE_NAMES:
                raise ValueError(f"{at}: unknown role {role!r} (expected one of {sorted(ROLE_NAMES)})")
            text = _require(utterance, "utterance", at, str)
            index = _require(utterance, "index", at, (int, str))
            audio = video = None
            if root is not None:
                avatar = (profiles[role] or {}).get("ID")
                audio = _media_file(root, cid, index, avatar, ".wav", require_media, missing, at)
                video = _media_file(root, cid, index, avatar, ".mp4", require_media, missing, at)
            out_turns.append(Turn(role=role, text=text, audio=audio, video=video, profile=profiles[role]))
        chain = None
        if isinstance(record.get("chain_of_empathy"), dict):
            coe = record["chain_of_empathy"]
            chain = ChainOfEmpathy(
                event_scenario=coe.get("event_scenario"),
                speaker_emotion=coe.get("speaker_emotion"),
                emotion_cause=coe.get("emotion_cause"),
                goal_to_response=coe.get("goal_to_response"),
            )
        return cls(
            turns=out_turns,
            id=f"{cid}/{record.get('turn_id', turn)}",
            context=record.get("context"),
            speaker_profile=profiles["speaker"],
            listener_profile=profiles["listener"],
            response=record.get("response"),
            chain=chain,
            missing_media=missing,
        )


def _require(record: Any, key: str, where: str, kind):
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected an object, got {type(record).__name__}")
    if key not in record:
        raise KeyError(f"{where}: missing field {key!r}")
    value = record[key]
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ValueError(f"{where}: field {key!r} should be {names}, got {type(value).__name__}")
    return value


def _media_file(root: Path, cid: str, index, avatar, suffix: str, required: bool, missing: List[str], where: str):
    stem = f"dia{cid}utt{index}_"
    if avatar is not None:
        path = root / f"{stem}{avatar}{suffix}"
        found = [path] if path.is_file() else []
    else:
        path = root / f"{stem}*{suffix}"
        found = sorted(root.glob(path.name))
        if len(found) > 1:
            raise ValueError(f"{where}: several files match {path}: {[p.name for p in found]}")
    if found:
        return found[0]
    if required:
        raise FileNotFoundError(f"{where}: media file {path} not found (pass require_media=False to go on without it)")
    missing.append(str(path))
    return None
