"""The Multimodal Chain of Empathy (M-CoE) of the MERIA variant: its data, its text and its targets.

MERIA (§3.3) fine-tunes an "M-CoE LLM" to write, for each dialogue, a structured chain
"(visual observation, emotion, confidence), (audio observation, emotion, confidence) and a
Chain-of-Empathy (CoE)", and feeds what it writes to the response LLM. This module holds:

* :class:`ModalityObservation` and :class:`MultimodalChain` -- one M-CoE as data, with a
  JSON-friendly :meth:`~MultimodalChain.to_dict` / :meth:`~MultimodalChain.from_dict`;
* :func:`mcoe_text` and :func:`parse_mcoe` -- the M-CoE as the LLM's target text, one line
  per part under fixed labels, and back. The CoE lines are exactly those of
  :func:`empatheia.prompts.chain_text` (same step labels, same ordinals), so one parser
  style serves the text-only chain and this one;
* :func:`build_mcoe_target`, :func:`build_mcoe_targets`, :func:`save_mcoe_targets` and
  :func:`load_mcoe_targets` -- the training targets, by dialogue id, in a JSONL file.

Where the targets come from
---------------------------
MERIA's authors annotated their M-CoE with GPT-4o and Qwen2.5-Omni. We have no such
annotations, and the targets here are **not** human or GPT annotations: they are built
from what the data and our own models give.

* The visual part is the reading of :class:`~empatheia.variants.readers.FaceEmotionReader`
  (the FER2013 mini-Xception on the last speaker video), the audio part that of
  :class:`~empatheia.variants.readers.ProsodyEmotionReader` (a prosody classifier on the
  last speaker audio). The emotion is the reader's most probable class, the confidence its
  probability, and the observation a short plain-English phrase made from the two most
  probable classes (:func:`observation_from_distribution`). These are the readers' guesses,
  with their errors: FER2013 has no *contempt*, so the face never reads it, and the
  prosody reader is a small linear model.
* The Chain-of-Empathy part is the dialogue's own gold chain (:attr:`Dialogue.chain
  <empatheia.dialogue.Dialogue.chain>`), when the data has one.

A modality the dialogue lacks (no speaker video or audio, or a reader that reads nothing,
such as a purely neutral face) is written ``none``; the M-CoE LLM thus also learns to say
when there is nothing to observe.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from ..errors import DataError
from ..io import atomic_path, json_line, read_jsonl
from ..labels import EMOTION_LABELS, UnknownEmotionError, fold_emotion
from ..prompts import CHAIN_STEPS, RESPONSE_LABEL, ChainOfEmpathy, chain_text

if TYPE_CHECKING:
    from ..dialogue import Dialogue
    from .readers import EmotionReader

PathLike = Union[str, Path]

OBSERVATION_LINES: Dict[str, Tuple[str, str]] = {
    "visual": ("Visual observation", "the face looks"),
    "audio": ("Audio observation", "the voice sounds"),
}
"""modality -> (the label of its line in :func:`mcoe_text`, the opening of its observation)."""

NONE_TEXT = "none"
"""What :func:`mcoe_text` writes for a missing modality (and for nothing else)."""

EMOTION_WORDS: Dict[str, Tuple[str, str]] = {
    "sad": ("sad", "sadness"),
    "happy": ("happy", "happiness"),
    "angry": ("angry", "anger"),
    "fear": ("fearful", "fear"),
    "surprised": ("surprised", "surprise"),
    "contempt": ("contemptuous", "contempt"),
    "disgusted": ("disgusted", "disgust"),
}
"""class -> (adjective, noun): "the face looks *sad*, with some *anger*"."""

CLEAR_THRESHOLD = 0.7
"""From this top probability on (and no strong second class) the observation says "clearly"."""
MIXED_THRESHOLD = 0.2
"""From this probability on the second class is named ("with some anger"); it takes precedence
over "clearly", since a second class that strong is worth saying."""

_FIELD_PATTERN = re.compile(r"(?:[;,]\s*|\s+|^)(emotion|confidence)\s*:", re.IGNORECASE)
"""The ``; emotion:`` and ``; confidence:`` fields of an observation line (a comma or bare
space before them is accepted too: generated text is not always tidy)."""


# ---------------------------------------------------------------------- data
@dataclass
class ModalityObservation:
    """What one modality (the speaker's face or voice) shows.

    ``emotion`` is one of :data:`~empatheia.labels.EMOTION_LABELS` and ``confidence`` a
    probability in [0, 1]; either is ``None`` when unknown (e.g. generated text left it out).
    """

    observation: str
    """A short phrase, e.g. ``"the face looks sad, with some anger"``."""
    emotion: Optional[str] = None
    confidence: Optional[float] = None

    def __post_init__(self):
        # Checked here so that from_dict (and so load_mcoe_targets) rejects bad records.
        if not isinstance(self.observation, str):
            raise ValueError(f"observation must be a string, got {type(self.observation).__name__}")
        if self.emotion is not None and self.emotion not in EMOTION_LABELS:
            raise ValueError(f"emotion {self.emotion!r} is not one of the classes {list(EMOTION_LABELS)}")
        if self.confidence is not None:
            if isinstance(self.confidence, bool) or not isinstance(self.confidence, numbers.Real):
                raise ValueError(f"confidence must be a number, got {type(self.confidence).__name__}")
            if not 0.0 <= float(self.confidence) <= 1.0:
                raise ValueError(f"confidence must be in [0, 1], got {self.confidence}")
            self.confidence = float(self.confidence)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModalityObservation":
        allowed = ("observation", "emotion", "confidence")
        _check_keys(data, required=("observation",), allowed=allowed, what="observation")
        return cls(data["observation"], data.get("emotion"), data.get("confidence"))


@dataclass
class MultimodalChain:
    """One M-CoE: what the face shows, what the voice shows, and the Chain of Empathy.

    A part is ``None`` when the dialogue (or the generated text) does not have it. For
    parsed text, ``raw`` keeps the text and ``parsed`` is False when none of the parts'
    labels was found in it.
    """

    visual: Optional[ModalityObservation]
    audio: Optional[ModalityObservation]
    chain: Optional[ChainOfEmpathy]
    raw: Optional[str] = None
    parsed: bool = True

    def to_dict(self) -> dict:
        """Plain JSON types; :meth:`from_dict` gives back an equal object."""
        return {
            "visual": None if self.visual is None else self.visual.to_dict(),
            "audio": None if self.audio is None else self.audio.to_dict(),
            "chain": None if self.chain is None else self.chain.to_dict(),
            "raw": self.raw,
            "parsed": self.parsed,
        }

    @classmethod
    def from_dict(cls, data: dict) -> "MultimodalChain":
        """The inverse of :meth:`to_dict`; a malformed dictionary is a ``ValueError`` that
        says what is wrong."""
        _check_keys(data, required=("visual", "audio", "chain"),
                    allowed=("visual", "audio", "chain", "raw", "parsed"), what="M-CoE")
        parts = {}
        for name in ("visual", "audio"):
            value = data[name]
            parts[name] = None if value is None else ModalityObservation.from_dict(_as_dict(value, name))
        chain = data["chain"]
        if chain is not None:
            names = [f.name for f in fields(ChainOfEmpathy)]
            chain = _as_dict(chain, "chain")
            _check_keys(chain, required=(), allowed=names, what="chain")
            for key, value in chain.items():
                expected = bool if key == "parsed" else (str, type(None))
                if not isinstance(value, expected):
                    raise ValueError(f"chain field {key!r} has type {type(value).__name__}")
            chain = ChainOfEmpathy(**chain)
        raw, parsed = data.get("raw"), data.get("parsed", True)
        if raw is not None and not isinstance(raw, str):
            raise ValueError(f"raw must be a string or null, got {type(raw).__name__}")
        if not isinstance(parsed, bool):
            raise ValueError(f"parsed must be true or false, got {parsed!r}")
        return cls(parts["visual"], parts["audio"], chain, raw, parsed)


def _as_dict(value, name: str) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be an object or null, got {type(value).__name__}")
    return value


def _check_keys(data, required: Sequence[str], allowed: Sequence[str], what: str) -> None:
    if not isinstance(data, dict):
        raise ValueError(f"{what} must be an object, got {type(data).__name__}")
    missing = [key for key in required if key not in data]
    unknown = sorted(set(data) - set(allowed))
    if missing:
        raise ValueError(f"{what} lacks {', '.join(map(repr, missing))}")
    if unknown:
        raise ValueError(f"{what} has unknown keys {', '.join(map(repr, unknown))}")


# ---------------------------------------------------------------------- observations
def observation_from_distribution(
    distribution: Optional[Dict[str, float]], modality: str
) -> Optional[ModalityObservation]:
    """A reader's distribution over :data:`~empatheia.labels.EMOTION_LABELS` as an
    observation of ``modality`` (``"visual"`` or ``"audio"``); ``None`` stays ``None``.

    The emotion is the most probable class (ties go to the class listed first in
    ``EMOTION_LABELS``, so the result is deterministic) and the confidence its probability
    rounded to two decimals. The phrase names the top two classes: "the face looks sad,
    with some anger" when the second has at least :data:`MIXED_THRESHOLD`, "the face looks
    clearly sad" when the top has at least :data:`CLEAR_THRESHOLD`, otherwise "the face
    looks sad" (audio: "the voice sounds ..."). Classes left out of ``distribution`` count
    as 0; one that is not a class is a ``ValueError``. A distribution with no positive
    probability says nothing and gives ``None``.
    """
    if modality not in OBSERVATION_LINES:
        raise ValueError(f"modality must be one of {list(OBSERVATION_LINES)}, got {modality!r}")
    if distribution is None:
        return None
    unknown = [label for label in distribution if label not in EMOTION_LABELS]
    if unknown:
        raise ValueError(f"{unknown} are not emotion classes {list(EMOTION_LABELS)}")
    order = {label: i for i, label in enumerate(EMOTION_LABELS)}
    ranked = sorted(EMOTION_LABELS, key=lambda label: (-float(distribution.get(label, 0.0)), order[label]))
    top, second = ranked[0], ranked[1]
    p_top, p_second = float(distribution.get(top, 0.0)), float(distribution.get(second, 0.0))
    if not p_top > 0:
        return None
    opening = OBSERVATION_LINES[modality][1]
    adjective = EMOTION_WORDS[top][0]
    if p_second >= MIXED_THRESHOLD:
        phrase = f"{opening} {adjective}, with some {EMOTION_WORDS[second][1]}"
    elif p_top >= CLEAR_THRESHOLD:
        phrase = f"{opening} clearly {adjective}"
    else:
        phrase = f"{opening} {adjective}"
    # min(): a distribution summing a hair over 1 must not make an invalid confidence.
    return ModalityObservation(phrase, top, min(round(p_top, 2), 1.0))


# ---------------------------------------------------------------------- text
def chain_steps_text(chain: Optional[ChainOfEmpathy]) -> str:
    """The Chain-of-Empathy lines of :func:`~empatheia.prompts.chain_text` without its
    final response lead-in (``""`` when the chain has no step).

    Taken from ``chain_text`` itself so the two can never drift apart: its last line is
    always the lead-in, and everything before it is the steps."""
    steps, _, _lead = chain_text(chain).rpartition("\n")
    return steps


def _observation_line(modality: str, part: Optional[ModalityObservation]) -> str:
    label = OBSERVATION_LINES[modality][0]
    if part is None:
        return f"{label}: {NONE_TEXT}"
    # One line per part, and ";" separates the fields: neither may occur inside the phrase.
    phrase = " ".join(part.observation.replace(";", ",").split())
    fields_ = [phrase]
    if part.emotion is not None:
        fields_.append(f"emotion: {part.emotion}")
    if part.confidence is not None:
        fields_.append(f"confidence: {part.confidence:.2f}")
    return f"{label}: " + "; ".join(fields_)


def mcoe_text(chain: MultimodalChain) -> str:
    """The M-CoE as target text, one line per part under fixed labels::

        Visual observation: the face looks sad, with some anger; emotion: sad; confidence: 0.62
        Audio observation: none
        Firstly, the event scenario of this conversation is: ...
        Secondly, the emotion of the speaker is: ...

    A missing modality is ``none``; a missing emotion or confidence is left out of its
    line; the CoE lines are those of :func:`chain_steps_text` (none without a chain). The
    confidence is written with two decimals, so :func:`parse_mcoe` gives back exactly what
    :func:`observation_from_distribution` made; a ";" or line break inside an observation
    phrase is written as "," or a space.
    """
    lines = [_observation_line("visual", chain.visual), _observation_line("audio", chain.audio)]
    steps = chain_steps_text(chain.chain)
    if steps:
        lines.append(steps)
    return "\n".join(lines)


def _words(label: str) -> str:
    # Any run of spaces or tabs between a label's words (not line breaks: a label is on one line).
    return r"[ \t]+".join(re.escape(word) for word in label.split())


_PART_LABELS = {
    **{" ".join(label.lower().split()): modality for modality, (label, _) in OBSERVATION_LINES.items()},
    **{label: name for name, label in CHAIN_STEPS},
    RESPONSE_LABEL: None,  # ends the last step when a response follows; not a part itself
}
_PART_PATTERN = re.compile(
    # A label at the start of a line, optionally after an ordinal ("Firstly,"), as in parse_chain.
    r"(?:^|\n)[ \t]*(?:\w+[ \t]*,[ \t]*)?(" + "|".join(_words(label) for label in _PART_LABELS) + r")[ \t]*:",
    re.IGNORECASE,
)


def _parse_emotion(value: str) -> Optional[str]:
    """A written emotion as its class: any spelling the emotion fold knows ("sadness",
    "Fearful"); ``None`` when missing, ``none`` or unknown (the raw text keeps it)."""
    value = value.strip().rstrip(".").strip()
    if not value or value.lower() == NONE_TEXT:
        return None
    try:
        return fold_emotion(value)
    except UnknownEmotionError:
        return None


def _parse_confidence(value: str) -> Optional[float]:
    """A written confidence: ``0.62`` or ``62%``; ``None`` when it is not a number in [0, 1]."""
    value = value.strip().rstrip(".").strip()
    scale = 1.0
    if value.endswith("%"):
        value, scale = value[:-1].strip(), 0.01
    try:
        number = float(value) * scale
    except ValueError:
        return None
    return number if math.isfinite(number) and 0.0 <= number <= 1.0 else None


def _parse_observation(value: str) -> Optional[ModalityObservation]:
    """The text after ``Visual observation:`` (or audio) as an observation, or ``None``."""
    line = next((line.strip() for line in value.split("\n") if line.strip()), "")
    matches = list(_FIELD_PATTERN.finditer(line))
    head = line[: matches[0].start()] if matches else line
    # mcoe_text never writes ";" in a phrase, so one here starts a field cut off midway.
    phrase = head.split(";")[0].strip().rstrip(",").strip()
    values: Dict[str, str] = {}
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        values.setdefault(match.group(1).lower(), line[match.end() : end])
    emotion = _parse_emotion(values["emotion"]) if "emotion" in values else None
    confidence = _parse_confidence(values["confidence"]) if "confidence" in values else None
    if phrase.rstrip(".").strip().lower() in ("", NONE_TEXT) and emotion is None and confidence is None:
        return None
    return ModalityObservation(phrase, emotion, confidence)


def parse_mcoe(text: str) -> MultimodalChain:
    """Read generated (or :func:`mcoe_text`) text back into a :class:`MultimodalChain`.

    Labels are found at line starts whatever their case and spacing; each part runs to the
    next label. An observation is read from the first line after its label; an emotion is
    folded onto its class (``None`` when unknown), and a confidence that is not a number in
    [0, 1] is ``None``. The CoE steps use the step labels of
    :data:`~empatheia.prompts.CHAIN_STEPS` and need no response line (a ``the response is:``
    line, if any, only ends the last step); the chain is ``None`` when no step label occurs.
    When a label occurs twice the first wins. Text cut off midway keeps whatever parts were
    written. ``parsed`` is False when no observation line and no CoE step was found; ``raw``
    always keeps the text (the chain's own ``raw`` stays ``None``, so that gold chains
    round-trip exactly).
    """
    matches = list(_PART_PATTERN.finditer(text))
    found: Dict[str, str] = {}
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        part = _PART_LABELS[" ".join(match.group(1).lower().split())]
        if part is not None:
            found.setdefault(part, text[match.end() : end])
    visual = _parse_observation(found["visual"]) if "visual" in found else None
    audio = _parse_observation(found["audio"]) if "audio" in found else None
    steps = {name: found[name].strip() or None for name, _ in CHAIN_STEPS if name in found}
    chain = ChainOfEmpathy(**steps) if steps else None
    parsed = bool(steps) or "visual" in found or "audio" in found
    return MultimodalChain(visual, audio, chain, raw=text, parsed=parsed)


# ---------------------------------------------------------------------- targets
def build_mcoe_target(
    dialogue: "Dialogue",
    face_reader: Optional["EmotionReader"] = None,
    prosody_reader: Optional["EmotionReader"] = None,
) -> MultimodalChain:
    """The M-CoE target of one dialogue: the visual part read by ``face_reader`` (last
    speaker video), the audio part by ``prosody_reader`` (last speaker audio), the chain the
    dialogue's gold chain. A reader that is ``None`` or reads nothing leaves its part
    ``None``; so does a dialogue without a chain. The chain is a copy, with the gold
    chain's fields, so editing the target leaves the dialogue alone."""
    visual = observation_from_distribution(face_reader.read(dialogue), "visual") if face_reader else None
    audio = observation_from_distribution(prosody_reader.read(dialogue), "audio") if prosody_reader else None
    chain = replace(dialogue.chain) if dialogue.chain is not None else None
    return MultimodalChain(visual, audio, chain)


def _pick_reader(readers: Sequence["EmotionReader"], name: str) -> Optional["EmotionReader"]:
    chosen = [reader for reader in readers if getattr(reader, "name", None) == name]
    if len(chosen) > 1:
        raise ValueError(f"{len(chosen)} readers are named {name!r}; give one")
    return chosen[0] if chosen else None


def _check_ids(dialogues: Sequence["Dialogue"]) -> None:
    # Before any reading: a bad id found after an hour of video reading wastes the hour.
    first: Dict[str, int] = {}
    for position, dialogue in enumerate(dialogues):
        if not isinstance(dialogue.id, str) or not dialogue.id.strip():
            raise ValueError(f"dialogue {position} has no id ({dialogue.id!r}); M-CoE targets are kept by id")
        if dialogue.id in first:
            raise ValueError(f"duplicate dialogue id {dialogue.id!r} (dialogues {first[dialogue.id]} and {position})")
        first[dialogue.id] = position


def build_mcoe_targets(
    dialogues: Iterable["Dialogue"],
    readers: Optional[Sequence["EmotionReader"]] = None,
    progress: bool = True,
) -> Dict[str, MultimodalChain]:
    """:func:`build_mcoe_target` of every dialogue, by dialogue id (in the dialogues' order).

    ``readers`` are emotion readers, of which the ones named ``"face"`` and ``"prosody"``
    are used (others, such as the text reader, are ignored; a missing one leaves its part
    ``None`` everywhere); by default the readers the ``small`` preset ships
    (:func:`~empatheia.variants.readers.load_small_readers`). Every id must be a non-empty
    string and unique, else a ``ValueError`` names it. ``progress`` shows a progress bar.
    An error while reading a dialogue is raised with a note naming its id.
    """
    from tqdm.auto import tqdm

    dialogues = list(dialogues)
    _check_ids(dialogues)
    if readers is None:
        # Imported here: the readers pull in torch and the classifiers, which the text
        # functions above do not need.
        from .readers import load_small_readers

        readers = load_small_readers()
    face, prosody = _pick_reader(readers, "face"), _pick_reader(readers, "prosody")
    targets: Dict[str, MultimodalChain] = {}
    for dialogue in tqdm(dialogues, desc="M-CoE targets", unit="dialogue", disable=not progress):
        try:
            targets[dialogue.id] = build_mcoe_target(dialogue, face, prosody)
        except Exception as error:
            if hasattr(error, "add_note"):  # Python 3.11+; on 3.10 the error goes as it is
                error.add_note(f"while building the M-CoE target of dialogue {dialogue.id!r}")
            raise
    return targets


def save_mcoe_targets(targets: Dict[str, MultimodalChain], path: PathLike) -> Path:
    """Write ``targets`` as JSONL, one ``{"id": ..., "mcoe": {...}}`` per line, whole or not
    at all (:func:`~empatheia.io.atomic_path`). Returns the path."""
    lines: List[str] = []
    for key, chain in targets.items():
        if not isinstance(key, str) or not key.strip():
            raise ValueError(f"M-CoE target ids must be non-empty strings, got {key!r}")
        lines.append(json_line({"id": key, "mcoe": chain.to_dict()}))
    path = Path(path)
    with atomic_path(path) as temporary:
        temporary.write_text("".join(lines), encoding="utf-8")
    return path


def load_mcoe_targets(path: PathLike) -> Dict[str, MultimodalChain]:
    """What :func:`save_mcoe_targets` wrote. A line that is not JSON, not an ``{"id",
    "mcoe"}`` record, a malformed M-CoE or a repeated id is a
    :class:`~empatheia.errors.DataError` naming the file and the line."""
    targets: Dict[str, MultimodalChain] = {}
    for number, record in read_jsonl(path):
        where = {"file": path, "record": f"line {number}"}
        if not isinstance(record, dict) or set(record) != {"id", "mcoe"}:
            shown = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise DataError(f'expected an object with keys "id" and "mcoe", got {shown}', **where)
        key = record["id"]
        if not isinstance(key, str) or not key.strip():
            raise DataError(f"id must be a non-empty string, got {json.dumps(key)}", field="id", **where)
        if key in targets:
            raise DataError(f"duplicate id {key!r}", field="id", **where)
        try:
            targets[key] = MultimodalChain.from_dict(record["mcoe"])
        except (ValueError, TypeError) as error:
            raise DataError(str(error), field="mcoe", **where) from None
    return targets
