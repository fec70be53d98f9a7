"""Multimodal dialogues: the input of :meth:`Empatheia.respond` and of the batch builder."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import numpy as np
import torch

from .errors import DataError
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
        if self.emotion is None and self.chain is not None and self.chain.speaker_emotion:
            self.emotion = self.chain.speaker_emotion

    @classmethod
    def from_avamerg(
        cls,
        conversation: Dict[str, Any],
        turn: int = -1,
        media_root: Optional[Union[str, Path]] = None,
        require_media: bool = True,
        response_media: bool = False,
    ) -> "Dialogue":
        """Build the dialogue of one turn of a released AvaMERG conversation.

        ``turn`` indexes ``conversation["turns"]`` (``-1``: the last). With ``media_root``
        each utterance's ``dia{conversation_id}utt{index}_{avatar ID}.wav/.mp4`` is
        attached; with ``response_media`` (training) so is the gold response's (the
        utterance after the history, spoken by the listener). A missing file is a
        :class:`~empatheia.data.DataError` naming it, or with ``require_media=False`` is
        listed in ``missing_media``. Test-form conversations (no profiles) match any
        avatar ID. Train-form turns also give the gold ``response`` and ``chain``.
        Malformed input raises :class:`~empatheia.data.DataError` naming the record
        (``conversation/turn``) and the field.
        """
        cid = conversation.get("conversation_id", "?") if isinstance(conversation, dict) else "?"
        if not isinstance(cid, str):
            raise DataError(f"should be a string, got {type(cid).__name__}", record=str(cid), field="conversation_id")
        turns = _require(conversation, "turns", cid, "", list)
        if not turns:
            raise DataError("is empty", record=cid, field="turns")
        try:
            record = turns[turn]
        except IndexError:
            raise IndexError(f"conversation {cid}: turn {turn} out of range (it has {len(turns)} turns)") from None
        position = turn % len(turns)
        name = f"{cid}/{record.get('turn_id', position) if isinstance(record, dict) else position}"
        at = f"turns[{position}]"
        history = _require(record, "dialogue_history", name, at, list)
        if not history:
            raise DataError("is empty", record=name, field=f"{at}.dialogue_history")
        profiles = {}
        for role in ROLE_NAMES:
            profile = conversation.get(f"{role}_profile")
            if profile is not None and not isinstance(profile, dict):
                raise DataError(f"should be an object, got {type(profile).__name__}", record=cid, field=f"{role}_profile")
            profiles[role] = profile
        root = Path(media_root) if media_root is not None else None
        missing: List[str] = []
        out_turns = []
        last_index = -1
        for i, utterance in enumerate(history):
            where = f"{at}.dialogue_history[{i}]"
            role = _require(utterance, "role", name, where, str)
            if role not in ROLE_NAMES:
                raise DataError(f"unknown role {role!r} (expected one of {sorted(ROLE_NAMES)})", record=name, field=f"{where}.role")
            text = _require(utterance, "utterance", name, where, str)
            index = _require(utterance, "index", name, where, (int, str))
            try:
                last_index = int(index)
            except ValueError:
                raise DataError(f"should be an integer, got {index!r}", record=name, field=f"{where}.index") from None
            audio = video = None
            if root is not None:
                avatar = (profiles[role] or {}).get("ID")
                found = _media_files(root, cid, index, avatar, require_media, missing, name, where)
                audio, video = found
            if not text.strip() and audio is None and video is None:
                raise DataError("is empty and the utterance has no media", record=name, field=f"{where}.utterance")
            out_turns.append(Turn(role=role, text=text, audio=audio, video=video, profile=profiles[role]))
        response = record.get("response")
        if response is not None and not isinstance(response, str):
            raise DataError(f"should be a string, got {type(response).__name__}", record=name, field=f"{at}.response")
        chain = None
        coe = record.get("chain_of_empathy")
        if coe is not None:
            if not isinstance(coe, dict):
                raise DataError(f"should be an object, got {type(coe).__name__}", record=name, field=f"{at}.chain_of_empathy")
            values = {}
            for key in ("event_scenario", "speaker_emotion", "emotion_cause", "goal_to_response"):
                value = coe.get(key)
                if value is not None and not isinstance(value, str):
                    raise DataError(
                        f"should be a string, got {type(value).__name__}", record=name, field=f"{at}.chain_of_empathy.{key}"
                    )
                values[key] = value
            chain = ChainOfEmpathy(**values)
        response_audio = response_video = None
        if root is not None and response_media:
            avatar = (profiles["listener"] or {}).get("ID")
            response_audio, response_video = _media_files(
                root, cid, last_index + 1, avatar, require_media, missing, name, f"{at}.response"
            )
        return cls(
            turns=out_turns,
            id=name,
            context=record.get("context"),
            speaker_profile=profiles["speaker"],
            listener_profile=profiles["listener"],
            response=response,
            chain=chain,
            response_audio=response_audio,
            response_video=response_video,
            missing_media=missing,
        )


def _require(record: Any, key: str, name: str, where: str, kind):
    if not isinstance(record, dict):
        raise DataError(f"should be an object, got {type(record).__name__}", record=name, field=where)
    if key not in record:
        raise DataError("missing", record=name, field=f"{where}.{key}".lstrip("."))
    value = record[key]
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise DataError(f"should be {names}, got {type(value).__name__}", record=name, field=f"{where}.{key}".lstrip("."))
    return value


def _media_files(root: Path, cid: str, index, avatar, required: bool, missing: List[str], name: str, where: str):
    """The ``(audio, video)`` files of one utterance (``None`` where absent and allowed)."""
    found = []
    for suffix, kind in ((".wav", "audio"), (".mp4", "video")):
        stem = f"dia{cid}utt{index}_"
        if avatar is not None:
            path = root / f"{stem}{avatar}{suffix}"
            matches = [path] if path.is_file() else []
        else:
            path = root / f"{stem}*{suffix}"
            matches = sorted(root.glob(path.name))
            if len(matches) > 1:
                raise DataError(
                    f"several {kind} files match: {[p.name for p in matches]}", file=path, record=name, field=f"{where} ({kind})"
                )
        if matches:
            found.append(matches[0])
            continue
        if required:
            raise DataError(
                f"{kind} file not found (pass require_media=False to go on without it)",
                file=path,
                record=name,
                field=f"{where} ({kind})",
            )
        missing.append(str(path))
        found.append(None)
    return found
