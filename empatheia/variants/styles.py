"""Emotion -> style tables: the voice and face styles the variants without a Style
Disentangler drive their generators with.

A :class:`StyleTable` holds, for each emotion class, one speech style S^s ``(D_ss,)`` and
one video style S^v ``(D_sv,)`` in the generators' own feature layout, each the mean of
styles *measured* on recordings by the generators' ``style_features`` (never numbers
picked by hand):

* :func:`measure_generator_styles`: recordings the generators themselves make of
  reference sentences in each emotion, as the data renderer asks for a listener showing
  it (``empatheia.data.render``); the pipeline baseline's table (Appendix E.2: the text's
  emotion chooses the style);
* :func:`measure_clip_styles`: real recordings of each emotion (E3RG's emotion-specific
  references), with a generator table filling the classes no clip shows.

A table names where each row came from (``sources``), so a report can say which styles
were real references and which were measured on generated speech.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Union

import torch

from ..io import write_json
from ..labels import EMOTION_LABELS

PathLike = Union[str, Path]

REFERENCE_SENTENCES = (
    "I hear you, and I am here with you.",
    "That sounds like a lot to take in.",
    "Tell me more about what happened.",
)
"""What the generators read when a table is measured on their own speech: short replies
of neutral wording, so the style comes from the emotion asked for, not from the words."""


@dataclass
class StyleTable:
    """Per emotion class, the speech style ``(D_ss,)`` and video style ``(D_sv,)``."""

    speech: Dict[str, torch.Tensor]
    video: Dict[str, torch.Tensor]
    sources: Dict[str, Dict[str, str]] = field(default_factory=dict)
    """``{class: {"speech": ..., "video": ...}}``: what each row was measured on."""
    generators: str = ""
    """The generators' fingerprints the styles belong to (another layout cannot read them)."""

    def __post_init__(self):
        if set(self.speech) != set(self.video):
            raise ValueError(f"speech and video styles cover different classes: {sorted(self.speech)} vs {sorted(self.video)}")
        if not self.speech:
            raise ValueError("a style table needs at least one class")

    @property
    def classes(self) -> List[str]:
        return [c for c in EMOTION_LABELS if c in self.speech] + sorted(set(self.speech) - set(EMOTION_LABELS))

    def styles(self, emotion: str) -> "tuple[torch.Tensor, torch.Tensor]":
        """``(S^s (D_ss,), S^v (D_sv,))`` of ``emotion`` (a class of the table)."""
        if emotion not in self.speech:
            raise KeyError(f"no style for emotion {emotion!r}; the table has {self.classes}")
        return self.speech[emotion].clone(), self.video[emotion].clone()

    def check_widths(self, speech_dim: int, video_dim: int, what: str = "the generators") -> None:
        first = self.classes[0]
        widths = (self.speech[first].numel(), self.video[first].numel())
        if widths != (speech_dim, video_dim):
            raise ValueError(
                f"style table has widths (speech {widths[0]}, video {widths[1]}) but {what} read "
                f"({speech_dim}, {video_dim}); measure it again for these generators"
            )

    def save(self, path: PathLike) -> Path:
        return write_json(path, {
            "generators": self.generators,
            "classes": self.classes,
            "speech_style": {c: [round(float(v), 6) for v in self.speech[c]] for c in self.classes},
            "video_style": {c: [round(float(v), 6) for v in self.video[c]] for c in self.classes},
            "sources": self.sources,
        })

    @classmethod
    def load(cls, path: PathLike) -> "StyleTable":
        path = Path(path)
        try:
            data = json.loads(path.read_text())
            return cls(
                speech={c: torch.tensor(v, dtype=torch.float32) for c, v in data["speech_style"].items()},
                video={c: torch.tensor(v, dtype=torch.float32) for c, v in data["video_style"].items()},
                sources=data.get("sources", {}),
                generators=data.get("generators", ""),
            )
        except FileNotFoundError:
            raise FileNotFoundError(f"no style table at {path}") from None
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{path}: not a style table ({error})") from None


def generators_fingerprint(speech, talking_head) -> str:
    return f"{speech.fingerprint()}|{talking_head.fingerprint()}"


def _mean(rows: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.stack([r.float() for r in rows]).mean(0)


def measure_generator_styles(
    speech,
    talking_head,
    avatars,
    classes: Sequence[str] = EMOTION_LABELS,
    sentences: Sequence[str] = REFERENCE_SENTENCES,
    profiles: Optional[Sequence[Mapping[str, str]]] = None,
    progress=None,
) -> StyleTable:
    """A table measured on the generators' own output: each of ``sentences`` spoken and
    animated by each avatar of ``profiles`` (default: the neutral avatar) in each class,
    with the request the data renderer makes of a listener showing that emotion
    (:data:`empatheia.data.render.LISTENER_EXPRESSION`), then measured back with the
    generators' ``style_features``; a row is the mean over those recordings."""
    from ..data.render import LISTENER_EXPRESSION, speech_style, video_style
    from ..media import write_mp4, write_wav

    profiles = list(profiles) if profiles else [{}]
    speech_rows: Dict[str, List[torch.Tensor]] = {c: [] for c in classes}
    video_rows: Dict[str, List[torch.Tensor]] = {c: [] for c in classes}
    with tempfile.TemporaryDirectory(prefix="empatheia-styles-") as folder:
        for c in classes:
            shown, intensity = LISTENER_EXPRESSION[c]
            for p, profile in enumerate(profiles):
                avatar = avatars.for_profile(dict(profile) or None)
                for s, sentence in enumerate(sentences):
                    wave = speech.synthesize(sentence, None, speech_style(shown, intensity, speech.features.style_dim, profile), avatar)
                    frames = talking_head.animate(wave, None, video_style(shown, intensity, talking_head.features.style_dim),
                                                  avatar.portrait)
                    stem = Path(folder) / f"{c}-{p}-{s}"
                    write_wav(stem.with_suffix(".wav"), wave.samples, wave.sample_rate)
                    write_mp4(stem.with_suffix(".mp4"), frames.frames, frames.fps, wave.samples, wave.sample_rate)
                    speech_rows[c] += speech.style_features([stem.with_suffix(".wav")])
                    video_rows[c] += talking_head.style_features([stem.with_suffix(".mp4")])
            if progress is not None:
                progress(c)
    count = len(profiles) * len(sentences)
    what = f"the generators' own speech and face, {count} recording(s)"
    return StyleTable(
        speech={c: _mean(speech_rows[c]) for c in classes},
        video={c: _mean(video_rows[c]) for c in classes},
        sources={c: {"speech": what, "video": what} for c in classes},
        generators=generators_fingerprint(speech, talking_head),
    )


def expression_face_styles(videos: Sequence[PathLike], style_dim: int, max_frames: int = 16) -> List[torch.Tensor]:
    """S^v in the avatar renderer's layout of real face recordings, read by the FER2013
    network (:mod:`empatheia.evaluation.fer`): its emotion mix (neutral left out,
    renormalised) with intensity ``1 - P(neutral)``, and the gaze and head motion those
    emotions have in the renderer (:func:`empatheia.data.render.mixed_video_style`).

    The renderer's own ``style_features`` reads expressions through a geometry readout
    fitted on its drawn faces; on real faces it misreads (on the 21 emotional MEAD clips
    of shared/data it named the clip's emotion for 1 of 7 classes), while the FER network
    was trained on real faces."""
    from ..data.render import mixed_video_style
    from ..evaluation.fer import FER_CLASSES, FacialExpressionClassifier
    from ..evaluation.video import read_frames

    classifier = FacialExpressionClassifier(max_frames=max_frames, labels=EMOTION_LABELS)
    out = []
    for video in videos:
        frames, _ = read_frames(video, max_frames)
        reading = classifier.read(frames)
        mix = {label: float(p) for label, p in zip(reading.labels, reading.probabilities)}
        intensity = 1.0 - float(reading.fer_probabilities[FER_CLASSES.index("neutral")])
        out.append(mixed_video_style(mix, intensity, style_dim))
    return out


def reference_face_measure(talking_head):
    """How the face clips of one class become its reference S^v for ``talking_head``:
    ``measure(videos, emotion) -> (S^v (D_sv,) or None, note)``.

    For the avatar renderer, whose own measure is fitted on drawn faces, the mean FER
    reading (:func:`expression_face_styles`); a class whose clips FER reads, on average,
    as another emotion gives ``None`` (a reference that shows something else would make
    the avatar show it too). For other talking heads (e.g. DreamTalk, whose style is made
    from real clips), the mean of their ``style_features``."""
    from empatheia.generators.avatar_renderer import EMOTIONS, AvatarRenderer

    if not isinstance(talking_head, AvatarRenderer):
        return lambda videos, emotion: (_mean(talking_head.style_features(videos)), "")

    def measure(videos, emotion):
        style = _mean(expression_face_styles(videos, talking_head.features.style_dim))
        read = EMOTIONS[int(style[: len(EMOTIONS)].argmax())]
        if read != emotion:
            return None, f"FER reads its clips as {read}"
        return style, "read by FER"

    return measure


def measure_clip_styles(
    speech,
    talking_head,
    speech_clips: Mapping[str, Iterable[PathLike]],
    face_clips: Mapping[str, Iterable[PathLike]],
    fallback: Optional[StyleTable] = None,
) -> StyleTable:
    """A table measured on real recordings: per class, the mean ``style_features`` of its
    speech clips, taken relative to the clips' mean (see below), and the mean reference
    style of its face clips (:func:`reference_face_measure`). A class without usable clips
    of a modality takes ``fallback``'s row (the generators' own table; its source says so).

    A speech row is ``clips_c - mean_real + mean_own``: its emotion's difference from the
    real clips' mean, on top of the fallback's mean over the same classes, so the avatar
    keeps its own register and level whoever recorded the references; each value is then
    kept within the range of the fallback's rows."""
    classes = sorted(set(speech_clips) | set(face_clips) | (set(fallback.speech) if fallback else set()),
                     key=lambda c: EMOTION_LABELS.index(c) if c in EMOTION_LABELS else len(EMOTION_LABELS))
    if fallback is None:
        raise ValueError("a bank from real clips needs a fallback table: the generators' own styles")
    tables = {"speech": {}, "video": {}}
    sources: Dict[str, Dict[str, str]] = {c: {} for c in classes}
    measures = {"speech": lambda files, emotion: (_mean(speech.style_features(files)), ""),
                "video": reference_face_measure(talking_head)}
    for modality, clips in (("speech", speech_clips), ("video", face_clips)):
        for c in classes:
            files = [Path(p) for p in clips.get(c, ())]
            row, note = measures[modality](files, c) if files else (None, "no real clip")
            if row is not None:
                tables[modality][c] = row
                sources[c][modality] = "real clips" + (f" ({note})" if note else "") + ": " + ", ".join(
                    sorted(f.name for f in files))
            elif fallback is not None and c in fallback.speech:
                tables[modality][c] = getattr(fallback, modality)[c].clone()
                sources[c][modality] = f"{note}; " + fallback.sources.get(c, {}).get(modality, "the fallback table")
            else:
                raise ValueError(f"{modality} of {c!r}: {note}, and no fallback table to take its style from")
    real_voices = [c for c in classes if sources[c]["speech"].startswith("real clips")]
    if real_voices:
        # A voice clip carries its speaker (register, vocal tract) and its recording's level
        # as much as its emotion, and the avatar must keep its own voice: each real row
        # keeps only its difference from the clips' mean, put onto the mean of the
        # generators' own rows of the same classes.
        # A clip of another recording's level or a speaker far from the others would
        # still ask for more than any emotion of the generators does: each value stays
        # within the range the generators' own rows span.
        real_mean = torch.stack([tables["speech"][c] for c in real_voices]).mean(0)
        own = torch.stack([fallback.speech[c] for c in fallback.classes])
        own_mean = torch.stack([fallback.speech[c] for c in real_voices]).mean(0)
        for c in real_voices:
            tables["speech"][c] = torch.minimum(torch.maximum(tables["speech"][c] - real_mean + own_mean, own.min(0).values),
                                                own.max(0).values)
            sources[c]["speech"] = sources[c]["speech"].replace("real clips", "real clips (relative to their mean)", 1)
    return StyleTable(tables["speech"], tables["video"], sources, generators_fingerprint(speech, talking_head))
