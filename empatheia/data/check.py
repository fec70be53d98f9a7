"""``empatheia data check``: what a dataset file holds and everything wrong with it.

The check reads the whole file without stopping at the first problem: every bad record,
every missing media file and (with ``decode_media``) every media file that does not
decode, is silent, has no face, ... is listed with its file, record and field.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

from ..config import MediaLimits, SpeechEncoderConfig, VideoEncoderConfig
from ..errors import DataError, SkippedSample
from ..labels import LabelSets
from .readers import LabelsLike, as_label_sets, read_dataset


@dataclass
class DatasetReport:
    path: Path
    format: str
    conversations: int
    examples: int
    """Dialogue turns to respond to (one training example each)."""
    utterances: int
    """Distinct utterances, responses included (histories repeat across turns)."""
    media_found: Dict[str, int] = field(default_factory=dict)
    missing_media: List[str] = field(default_factory=list)
    emotions: Counter = field(default_factory=Counter)
    """Folded emotion classes."""
    emotion_labels: Counter = field(default_factory=Counter)
    """Free-text emotion labels as written in the file."""
    profiles: Dict[str, Dict[str, Counter]] = field(default_factory=dict)
    """role -> attribute -> value counts, one count per example."""
    problems: List[SkippedSample] = field(default_factory=list)
    decoded: Optional[int] = None
    """Media files decoded and checked (``None``: not asked for)."""

    @property
    def ok(self) -> bool:
        return not self.problems and not self.missing_media

    def format_text(self, labels: Optional[LabelSets] = None) -> str:
        lines = [
            f"file: {self.path} ({self.format})",
            f"conversations: {self.conversations}",
            f"turns (training examples): {self.examples}",
            f"utterances: {self.utterances}",
        ]
        media = ", ".join(
            f"{kind} {self.media_found.get(kind, 0)} found, {sum(1 for m in self.missing_media if _kind(m) == kind)} missing"
            for kind in ("audio", "video")
        )
        lines.append(f"media files: {media}")
        if self.decoded is not None:
            lines.append(f"media files decoded and checked: {self.decoded}")
        total = sum(self.emotions.values())
        classes = list(labels.emotions) if labels else sorted(self.emotions)
        lines.append(f"emotions ({total} labelled):")
        lines.extend(f"  {name:<12} {self.emotions[name]:>7} {_share(self.emotions[name], total)}" for name in classes)
        if self.emotion_labels:
            common = ", ".join(f"{label} {count}" for label, count in self.emotion_labels.most_common(40))
            more = len(self.emotion_labels) - 40
            lines.append(f"emotion labels as written: {common}" + (f", ... ({more} more)" if more > 0 else ""))
        for role, attributes in self.profiles.items():
            for attribute, counts in attributes.items():
                values = ", ".join(f"{value} {count}" for value, count in sorted(counts.items()))
                lines.append(f"{role} {attribute}: {values}")
        for path in self.missing_media:
            lines.append(f"missing: {path}")
        for problem in self.problems:
            lines.append(f"problem: {problem}")
        lines.append(f"problems: {len(self.problems)}, missing media files: {len(self.missing_media)}")
        return "\n".join(lines)


def _kind(path: str) -> str:
    return "audio" if Path(path).suffix.lower() in (".wav", ".flac", ".mp3", ".ogg", ".m4a") else "video"


def _share(count: int, total: int) -> str:
    return f"({100 * count / total:5.1f}%)" if total else ""


def check_dataset(
    path: Union[str, Path],
    media_root: Optional[Union[str, Path]] = None,
    format: str = "auto",
    labels: Optional[LabelsLike] = None,
    decode_media: bool = False,
    speech: Optional[SpeechEncoderConfig] = None,
    video: Optional[VideoEncoderConfig] = None,
    progress: bool = True,
    limits: Optional[MediaLimits] = None,
) -> DatasetReport:
    """Read a dataset file completely and report its contents and problems.

    ``decode_media`` also decodes every media file the way training does (audio resampled
    to ``speech.sample_rate``; video frames taken and, with ``video.face_crop``, the face
    found), so a corrupt, silent or faceless file is found before training meets it.
    A clip longer than ``limits.max_seconds`` (default: :class:`MediaLimits`' 30 s) is
    a problem too, found from its header without decoding it; with ``limits.trim`` it is
    decoded up to the limit instead, as training with ``media.trim`` would.
    A file that cannot be read at all (not JSON, unknown format) raises ``DataError``.
    ``labels`` (label sets or a labels YAML path; default AvaMERG's) are the classes the
    labels are checked against and counted in.
    """
    labels = as_label_sets(labels) or LabelSets()
    corpus = read_dataset(path, format=format, media_root=media_root, labels=labels, require_media=False, on_error="skip")
    report = DatasetReport(
        path=corpus.path,
        format=corpus.format,
        conversations=corpus.conversations,
        examples=len(corpus),
        utterances=0,
        problems=list(corpus.skipped.skipped),
    )
    utterances = set()
    media: Dict[Path, Tuple[str, str, str]] = {}  # file -> (kind, first record, field)
    missing = set()
    profiles: Dict[str, Dict[str, Counter]] = {}
    for dialogue in corpus:
        conversation = dialogue.id.rsplit("/", 1)[0] if dialogue.id and "/" in dialogue.id else dialogue.id
        utterances.update((conversation, i) for i in range(len(dialogue.turns) + (dialogue.response is not None)))
        for i, turn in enumerate(dialogue.turns):
            for kind in ("audio", "video"):
                source = getattr(turn, kind)
                if isinstance(source, Path):
                    media.setdefault(source, (kind, dialogue.id, f"turns[{i}].{kind}"))
        for kind in ("audio", "video"):
            source = getattr(dialogue, f"response_{kind}")
            if source is not None:
                media.setdefault(source, (kind, dialogue.id, f"response.{kind}"))
        missing.update(dialogue.missing_media)
        if dialogue.emotion is not None:
            report.emotion_labels[dialogue.emotion] += 1
            report.emotions[labels.emotion_class(dialogue.emotion)] += 1
        for role in ("speaker", "listener"):
            profile = getattr(dialogue, f"{role}_profile") or {}
            for attribute in labels.profile:
                if attribute in profile:
                    value = labels.profile_value(attribute, profile[attribute])
                    profiles.setdefault(f"{role} profile", {}).setdefault(attribute, Counter())[value] += 1
    report.utterances = len(utterances)
    report.profiles = profiles
    report.missing_media = sorted(missing)
    report.media_found = dict(Counter(kind for kind, _, _ in media.values()))
    if decode_media:
        report.problems.extend(
            _decode_all(media, speech or SpeechEncoderConfig(), video or VideoEncoderConfig(), limits or MediaLimits(), progress)
        )
        report.decoded = len(media)
    return report


def _decode_all(
    media: Dict[Path, Tuple[str, str, str]],
    speech: SpeechEncoderConfig,
    video: VideoEncoderConfig,
    limits: MediaLimits,
    progress: bool,
) -> List[SkippedSample]:
    from tqdm.auto import tqdm

    from ..faces import FaceCropper
    from ..media import load_audio, load_video_frames

    cropper = FaceCropper()
    problems = []
    for path, (kind, record, field_name) in tqdm(media.items(), desc="checking media", unit="file", disable=not progress):
        try:
            if kind == "audio":
                load_audio(path, speech.sample_rate, limits)
            else:
                frames = load_video_frames(path, video.num_frames, video.frame_rate, limits)
                if video.face_crop:
                    cropper.box(frames, source=path)
        except DataError as error:
            problems.append(SkippedSample(str(path), record, field_name, error.reason))
    return problems
