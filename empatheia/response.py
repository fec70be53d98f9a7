"""What :meth:`Empatheia.respond` returns."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Optional, Union

import torch
from safetensors.torch import save_file

from .io import atomic_path, folder_lock, write_text_atomic
from .page import response_page
from .prompts import ChainOfEmpathy

if TYPE_CHECKING:
    from empatheia.generators.base import VideoFrames, Waveform

    from .dialogue import Dialogue
    from .labels import LabelSets


@dataclass
class LabelPrediction:
    label: str
    probabilities: Dict[str, float]

    def to_dict(self) -> dict:
        return {"label": self.label, "probabilities": self.probabilities}


@dataclass
class EmpatheticResponse:
    """One multimodal empathetic response.

    The tensors are the signals for the generators: ``speech_content`` ``(Ls, D_cs)`` and
    ``speech_style`` ``(D_ss,)`` for the speech generator, ``video_content`` ``(Ls, D_cv)``
    (one row per speech content unit, like ``speech_content``; the talking head spreads
    the rows over frames by ``audio.alignment``) and ``video_style`` ``(D_sv,)`` for the
    talking-head generator.
    """

    text: str
    chain: ChainOfEmpathy
    emotion: LabelPrediction
    """The Style Disentangler's emotion class, which styles the voice and the face; fused
    with the chain's emotion where ``style_disentangler.chain_emotion_prior_weight`` > 0."""
    profile: Dict[str, LabelPrediction]
    speech_content: torch.Tensor
    speech_style: torch.Tensor
    video_content: torch.Tensor
    video_style: torch.Tensor
    dialogue_id: Optional[str] = None
    generated_text: str = ""
    """Everything the language model wrote, chain included."""
    audio: Optional["Waveform"] = None
    """The spoken response (``respond(speak=True)``): ``audio.samples`` ``(T,)`` at
    ``audio.sample_rate``, and ``audio.alignment`` ``(T,)`` (the row of
    ``speech_content``/``video_content`` sounding at each sample, -1 in silence) when the
    speech generator reports it."""
    video: Optional["VideoFrames"] = None
    """The talking head (``respond(animate=True)``): ``video.frames`` ``(F, H, W, 3)``
    uint8 at ``video.fps``."""
    avatar: Optional[str] = None
    """The key of the avatar that spoke."""
    chain_emotion: Optional[LabelPrediction] = None
    """The speaker's emotion as the Chain of Empathy weighs it: the probabilities of
    ``language_model.chain_emotions`` at that step, fused with the text reader's where
    ``language_model.chain_emotion_reader`` is set (``None`` without labels or step)."""
    voice_style: Optional[Dict[str, object]] = None
    """What the voice was asked for, as the speech generator reads ``speech_style``
    (e.g. Piper's rate, pitch, energy; ``None`` until spoken, or for a generator whose
    style is a learned embedding)."""
    face_style: Optional[Dict[str, object]] = None
    """What the face was asked for, as the talking head reads ``video_style`` (e.g. the
    avatar renderer's emotion mix and intensity)."""
    avatar_profile: Optional[Dict[str, object]] = None
    """The profile (age, gender, timbre) of the avatar that spoke."""
    system: str = "Empatheia"
    """The system that answered, as a person reads its name (docs/variants.md)."""
    emotion_source: str = "the Style Disentangler (from the signal tokens)"
    """What chose :attr:`emotion`, the class that styles the voice and the face."""
    has_chain: bool = True
    """Whether the system reasons with a Chain of Empathy (the pipeline baseline writes only
    its emotion)."""
    dropped_turns: int = 0
    """How many of the dialogue's oldest turns were left out so that the prompt fits
    ``language_model.max_length`` (0: the answer read them all)."""
    label_sets: Optional["LabelSets"] = None
    """The label sets of the system that answered (``respond`` sets them): their fold reads
    the chain's emotion in :meth:`style_agreement` (``None``: AvaMERG's)."""

    def style_agreement(self) -> Optional[str]:
        """A sentence saying how the Style Disentangler's emotion, which styles the voice
        and the face, relates to the Chain of Empathy's, or ``None`` when the chain names
        no emotion that :attr:`label_sets` fold onto their classes."""
        from .labels import UnknownEmotionError, fold_emotion

        named = self.chain_emotion.label if self.chain_emotion is not None else self.chain.speaker_emotion
        # A model fine-tuned to its own classes reads the chain with its own fold: AvaMERG's
        # would compare, say, 'worried' as fear with a class called 'stressed'.
        fold = self.label_sets.emotion_class if self.label_sets is not None else fold_emotion
        try:
            folded = fold(named) if named else None
        except UnknownEmotionError:
            folded = None
        if folded is None:
            return None
        if folded == self.emotion.label:
            return f"The chain's emotion ({named}) and the voice and face's ({self.emotion.label}) agree."
        return (
            f"The chain names {named} ({folded}), while {self.emotion_source}, which styles the voice and face, "
            f"reads {self.emotion.label}: two readings of the same dialogue that disagree here."
        )

    def to_dict(self) -> dict:
        return {
            "dialogue_id": self.dialogue_id,
            "system": self.system,
            "text": self.text,
            "chain_of_empathy": self.chain.to_dict(),
            "emotion": self.emotion.to_dict(),
            "chain_emotion": None if self.chain_emotion is None else self.chain_emotion.to_dict(),
            "profile": {name: p.to_dict() for name, p in self.profile.items()},
            "generated_text": self.generated_text,
            "dropped_turns": self.dropped_turns,
            "features": {name: list(value.shape) for name, value in self._features().items()},
            "avatar": self.avatar,
            "avatar_profile": self.avatar_profile,
            "voice_style": self.voice_style,
            "face_style": self.face_style,
            "style_agreement": self.style_agreement(),
            "audio": None if self.audio is None else {
                "file": "response.wav", "sample_rate": self.audio.sample_rate, "seconds": round(self.audio.duration, 3)},
            "video": None if self.video is None else {
                "file": "response.mp4", "fps": self.video.fps, "frames": int(self.video.frames.shape[0]),
                "size": list(self.video.frames.shape[1:3])},
        }

    def save(self, directory: Union[str, Path], dialogue: Optional["Dialogue"] = None) -> Path:
        """Write ``response.json``, the generator signals as ``features.safetensors``,
        ``index.html`` (the dialogue when given, the Chain of Empathy, the emotion
        probabilities and the answer's player) and, when generated, ``response.wav`` and
        ``response.mp4`` (H.264 with the speech muxed as AAC).

        The folder is locked while it is written (:func:`~empatheia.io.folder_lock`): a
        second process saving into it meanwhile gets a
        :class:`~empatheia.io.FolderLockedError` instead of mixing its files with these.
        Every file is written whole and renamed into place (:mod:`empatheia.io`), so a
        symbolic link planted at one of the names is replaced, never written through."""
        directory = Path(directory)
        with folder_lock(directory):
            self.save_audio(directory)
            self.save_video(directory)
            return self.save_record(directory, dialogue)

    def save_audio(self, directory: Union[str, Path]) -> Optional[Path]:
        """Write ``response.wav`` into an existing ``directory`` when there is speech."""
        from .media import write_wav

        if self.audio is None:
            return None
        target = Path(directory) / "response.wav"
        with atomic_path(target) as temporary:
            write_wav(temporary, self.audio.samples, self.audio.sample_rate)
        return target

    def save_video(self, directory: Union[str, Path]) -> Optional[Path]:
        """Write ``response.mp4`` (the speech muxed in) into an existing ``directory``
        when there is a talking head."""
        from .media import write_mp4

        if self.video is None:
            return None
        audio = self.audio.samples if self.audio is not None else None
        rate = self.audio.sample_rate if self.audio is not None else None
        target = Path(directory) / "response.mp4"
        with atomic_path(target) as temporary:
            write_mp4(temporary, self.video.frames, self.video.fps, audio, rate)
        return target

    def save_record(self, directory: Union[str, Path], dialogue: Optional["Dialogue"] = None) -> Path:
        """Write ``response.json``, ``index.html`` and ``features.safetensors`` into an
        existing ``directory`` (the media files are :meth:`save_audio`'s and
        :meth:`save_video`'s)."""
        directory = Path(directory)
        write_text_atomic(directory / "response.json", json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n")
        write_text_atomic(directory / "index.html", response_page(self, dialogue))
        with atomic_path(directory / "features.safetensors") as temporary:
            save_file(self._features(), str(temporary))
        return directory

    def _features(self) -> dict:
        """What ``features.safetensors`` holds: the four generator signals (float32) and,
        when the speech has an alignment, ``speech_alignment`` ``(R, 3)`` int64 run-length
        rows ``[unit, start_sample, end_sample)`` (the rows of ``video_content`` the
        talking head spread over the frames)."""
        features = {name: getattr(self, name).detach().float().contiguous().cpu() for name in _FEATURES}
        if self.audio is not None and self.audio.alignment is not None:
            from empatheia.generators.base import alignment_runs

            features["speech_alignment"] = torch.from_numpy(alignment_runs(self.audio.alignment))
        return features


_FEATURES = ("speech_content", "speech_style", "video_content", "video_style")
