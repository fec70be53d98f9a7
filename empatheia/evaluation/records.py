"""The files ``empatheia eval`` reads and writes: their fields, validation and pairing.

Files
-----
Predictions (JSONL, one response a line)
    ``id`` (string), ``text`` (the response), ``emotion`` (the predicted emotion); optional
    ``chain_emotion`` (the Chain of Empathy's free-text ``speaker_emotion``, may be
    ``null``), ``emotion_probabilities`` (class -> probability),
    ``chain_emotion_probabilities`` (label -> probability at the chain's emotion step, for
    a model with ``language_model.chain_emotions``; the probabilities of both are finite,
    non-negative numbers: NaN, infinity, a negative value or a string is an error),
    ``chain_of_empathy`` (the chain the answer wrote: ``event_scenario``,
    ``speaker_emotion``, ``emotion_cause``, ``goal_to_response``, each a string or ``null``),
    ``audio`` and ``video``
    (the spoken response and the talking head: paths relative to the predictions file's
    folder, or absolute) and ``avatar`` (which avatar spoke it: the same string, the same
    face); ``speech_style`` / ``video_style`` (the style vectors S^s / S^v the model asked
    its generators for) and ``speech_style_realised`` / ``video_style_realised`` (the ones
    the same generators measure on the written audio / video), non-empty lists of finite
    numbers; ``seconds`` (how long the system took per answer: its ``respond`` batch's
    time over the batch's size, a non-negative number); ``profile`` (attribute -> value:
    the profile of the avatar that answers, as the Style Disentangler reads it, e.g.
    ``{"gender": "female", "accent": "uk"}``) and ``profile_probabilities`` (attribute ->
    value -> probability, finite and non-negative).
References (JSONL, one gold response a line)
    ``id``, ``response`` (the gold response text), ``emotion`` (the gold emotion); optional
    ``emotion_label`` (the dataset's raw label before folding), ``age`` and ``gender``,
    ``history`` (the dialogue's utterances, a list of strings; needed only for the polarity
    metrics), ``history_roles`` (each utterance's role, ``speaker`` or ``listener``; needed
    only for the listener-echo metric), ``video`` (the gold response's talking-head clip, a path relative to the
    references file's folder or absolute; needed only for SSIM), ``listener_profile``
    (attribute -> gold value of the answering avatar's profile, the dataset's listener:
    what the predictions' ``profile`` is scored against).

Other fields are allowed and ignored. Bad input is a :class:`~empatheia.errors.DataError`
naming the file, the line and the field. An id that is in one file and not in the other
is an error (:class:`MissingIdsError`) unless missing ids are allowed; then only the ids
in both are scored and the rest are listed (:func:`align`).

Emotions are compared as classes (:func:`emotion_class`): a label goes through the label
sets' fold (AvaMERG's by default, so ``"anxious"`` and ``"fear"`` match). A predicted label
the fold does not know is wrong; a gold label it does not know is an error unless the
scoring skips it (and counts it): :mod:`empatheia.evaluation.scoring`. A dataset with its
own classes scores under its own label sets (``--labels``). A reference's gold class is its
``emotion_label`` folded when it has one, else its ``emotion``: references written for one
label set can then be scored under another (e.g. EmpatheticDialogues' 32 labels,
``configs/labels/ed32.yaml``, against the Chain of Empathy's ``chain_emotion``).

Age and gender
--------------
The paper's Figure 6 breaks emotion accuracy down by the *user's* age and gender. The
user is AvaMERG's ``speaker``: the person who shares an experience and whose emotion
(``chain_of_empathy.speaker_emotion``) the model recognises; the ``listener`` is the avatar
Empatheia plays. References written from a dataset (:func:`references_from_dialogues`)
therefore carry the speaker profile's ``age`` and ``gender`` (canonical spelling of the
label sets); datasets without profiles (EmpatheticDialogues) leave them ``null`` and the
breakdown is left out. They also carry ``video`` (absolute) when the example's gold
response has a talking-head clip (:attr:`~empatheia.dialogue.Dialogue.response_video`:
avatar JSONL ``response.video``; AvaMERG with ``--media-root``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..errors import DataError
from ..io import read_jsonl
from ..labels import LabelSets, UnknownEmotionError, normalize_label
from ..prompts import CHAIN_STEPS

if TYPE_CHECKING:
    from ..data.readers import LabelsLike
    from ..dialogue import Dialogue

PathLike = Union[str, Path]
Record = Dict[str, Any]
FieldSpec = Mapping[str, Tuple[tuple, bool]]

PREDICTIONS_NAME = "predictions.jsonl"
REFERENCES_NAME = "references.jsonl"
GROUP_FIELDS = ("age", "gender")
PROBABILITY_FIELDS = ("emotion_probabilities", "chain_emotion_probabilities")
"""Prediction fields holding label -> probability: finite, non-negative numbers."""
PROFILE_FIELDS = ("profile", "listener_profile")
"""Fields holding attribute -> value (a string, or ``null`` for none)."""
STYLE_FIELDS = ("speech_style", "speech_style_realised", "video_style", "video_style_realised")
"""Prediction fields holding a style vector: a non-empty list of finite numbers."""
STYLE_DIGITS = 6
"""Significant digits a style vector's values keep in a prediction line (float32 holds
about 7; the agreement metrics do not need more)."""
SECONDS_DECIMALS = 3
"""Decimals a prediction's ``seconds`` keeps (a millisecond is finer than the spread
between runs on a shared machine)."""
PROFILE_ROLE = "speaker"
"""Whose profile gives a reference's ``age`` and ``gender`` (see the module docstring)."""

# field -> (accepted types, required). ``None`` is accepted for every optional field.
PREDICTION_FIELDS: Dict[str, Tuple[tuple, bool]] = {
    "id": ((str,), True),
    "text": ((str,), True),
    "emotion": ((str,), True),
    "chain_emotion": ((str,), False),
    "emotion_probabilities": ((dict,), False),
    "chain_emotion_probabilities": ((dict,), False),
    "profile": ((dict,), False),
    "profile_probabilities": ((dict,), False),
    "chain_of_empathy": ((dict,), False),
    "audio": ((str,), False),
    "video": ((str,), False),
    "avatar": ((str,), False),
    "speech_style": ((list,), False),
    "speech_style_realised": ((list,), False),
    "video_style": ((list,), False),
    "video_style_realised": ((list,), False),
    "seconds": ((int, float), False),
}
REFERENCE_FIELDS: Dict[str, Tuple[tuple, bool]] = {
    "id": ((str,), True),
    "response": ((str,), True),
    "emotion": ((str,), True),
    "emotion_label": ((str,), False),
    "listener_profile": ((dict,), False),
    "age": ((str,), False),
    "gender": ((str,), False),
    "history": ((list,), False),
    "history_roles": ((list,), False),
    "video": ((str,), False),
}


class MissingIdsError(DataError):
    """Ids in the predictions without a reference, or references without a prediction."""

    def __init__(self, reason: str, file: Optional[PathLike], without_reference: List[str], without_prediction: List[str]):
        super().__init__(reason, file=file)
        self.without_reference = without_reference
        self.without_prediction = without_prediction


# ====================================================================== validation
def validate_record(record: Any, spec: FieldSpec, file: Optional[PathLike], where: str) -> Record:
    """Check one record against a field spec (see :data:`PREDICTION_FIELDS`) and return it.
    ``where`` names the record in errors (``"line 3"``)."""
    if not isinstance(record, dict):
        raise DataError(f"should be a JSON object, got {type(record).__name__}", file=file, record=where)
    for name, (kinds, required) in spec.items():
        if name not in record or record[name] is None:
            if required:
                raise DataError("missing" if name not in record else "is null", file=file, record=where, field=name)
            continue
        value = record[name]
        if not isinstance(value, kinds) or isinstance(value, bool):
            raise DataError(
                f"should be {'/'.join(_type_name(k) for k in kinds)}, got {_type_name(type(value))} {value!r:.40}",
                file=file,
                record=where,
                field=name,
            )
    if not record["id"].strip():
        raise DataError("is empty", file=file, record=where, field="id")
    history = record.get("history")
    if history is not None:
        for position, utterance in enumerate(history):
            if not isinstance(utterance, str):
                raise DataError(f"should be a string, got {_type_name(type(utterance))}", file=file, record=where, field=f"history[{position}]")
    roles = record.get("history_roles") if "history_roles" in spec else None
    if roles is not None:
        if history is None or len(roles) != len(history):
            raise DataError(f"has {len(roles)} roles for {'no' if history is None else len(history)} history turns",
                            file=file, record=where, field="history_roles")
        for position, role in enumerate(roles):
            if not isinstance(role, str):
                raise DataError(f"should be a string, got {_type_name(type(role))}", file=file, record=where,
                                field=f"history_roles[{position}]")
    for name in PROFILE_FIELDS:
        for attribute, value in ((record.get(name) if name in spec else None) or {}).items():
            if value is not None and not isinstance(value, str):
                raise DataError(f"should be a string, got {_type_name(type(value))}", file=file, record=where,
                                field=f"{name}.{attribute}")
    tables = [(name, record.get(name)) for name in PROBABILITY_FIELDS if name in spec]
    if "profile_probabilities" in spec:
        for attribute, table in (record.get("profile_probabilities") or {}).items():
            if not isinstance(table, dict):
                raise DataError(f"should be an object (value -> probability), got {_type_name(type(table))}",
                                file=file, record=where, field=f"profile_probabilities.{attribute}")
            tables.append((f"profile_probabilities.{attribute}", table))
    for name, probabilities in tables:
        for label, value in (probabilities or {}).items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not (math.isfinite(value) and value >= 0):
                raise DataError(f"should be a finite, non-negative probability, got {value!r:.40}",
                                file=file, record=where, field=f"{name}.{label}")
    for name in STYLE_FIELDS:
        vector = record.get(name) if name in spec else None
        if vector is None:
            continue
        if not vector:
            raise DataError("is empty (a style vector needs at least one value)", file=file, record=where, field=name)
        for position, value in enumerate(vector):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise DataError(f"should be a finite number, got {value!r:.40}", file=file, record=where, field=f"{name}[{position}]")
    seconds = record.get("seconds") if "seconds" in spec else None
    if seconds is not None and not (math.isfinite(seconds) and seconds >= 0):
        raise DataError(f"should be a non-negative number of seconds, got {seconds!r:.40}", file=file, record=where, field="seconds")
    return record


def validate_records(records: Sequence[Any], spec: FieldSpec, file: Optional[PathLike] = None) -> List[Record]:
    """:func:`validate_record` on records given directly (a copy of each); their position
    is their "line"."""
    return [validate_record(dict(r) if isinstance(r, Mapping) else r, spec, file, f"line {i}") for i, r in enumerate(records, 1)]


def _type_name(kind: type) -> str:
    return {str: "a string", dict: "an object", list: "a list", int: "an integer", float: "a number"}.get(kind, kind.__name__)


# ====================================================================== reading
def _read_records(path: PathLike, spec: FieldSpec, what: str) -> List[Record]:
    path = Path(path)
    rows = read_jsonl(path)
    if not rows:
        raise DataError(f"no {what} (the file is empty)", file=path)
    records: List[Record] = []
    first_line: Dict[str, int] = {}
    for number, raw in rows:
        record = validate_record(raw, spec, path, f"line {number}")
        if record["id"] in first_line:
            raise DataError(
                f"duplicate id {record['id']!r} (first at line {first_line[record['id']]})", file=path, record=f"line {number}", field="id"
            )
        first_line[record["id"]] = number
        records.append(record)
    return records


def read_predictions(path: PathLike) -> List[Record]:
    """The validated records of a predictions file (see the module docstring)."""
    return _read_records(path, PREDICTION_FIELDS, "predictions")


def read_references(path: PathLike) -> List[Record]:
    """The validated records of a references file (see the module docstring)."""
    return _read_records(path, REFERENCE_FIELDS, "references")


# ====================================================================== matching ids
@dataclass
class Alignment:
    """Predictions paired with references by id, in the references' order."""

    pairs: List[Tuple[Record, Record]]
    without_reference: List[str] = field(default_factory=list)
    """Prediction ids that no reference has."""
    without_prediction: List[str] = field(default_factory=list)
    """Reference ids that no prediction has."""


def align(
    predictions: Sequence[Record],
    references: Sequence[Record],
    allow_missing: bool = False,
    predictions_file: Optional[PathLike] = None,
    references_file: Optional[PathLike] = None,
) -> Alignment:
    """Pair predictions with references by ``id``.

    Raises :class:`MissingIdsError` listing the ids found on one side only, unless
    ``allow_missing``; then those ids are returned in the alignment (never silently
    dropped). No id in common is an error either way.
    """
    by_id = {p["id"]: p for p in predictions}
    reference_ids = {r["id"] for r in references}
    without_reference = [p["id"] for p in predictions if p["id"] not in reference_ids]
    without_prediction = [r["id"] for r in references if r["id"] not in by_id]
    pairs = [(by_id[r["id"]], r) for r in references if r["id"] in by_id]
    ref_name = str(references_file) if references_file else "the references"
    problems = []
    if without_reference:
        problems.append(f"{len(without_reference)} prediction id(s) not in {ref_name}: {preview(without_reference)}")
    if without_prediction:
        problems.append(f"{len(without_prediction)} reference id(s) of {ref_name} without a prediction: {preview(without_prediction)}")
    if not pairs:
        raise MissingIdsError(
            "no id is in both the predictions and the references; " + "; ".join(problems),
            predictions_file, without_reference, without_prediction,
        )
    if problems and not allow_missing:
        raise MissingIdsError(
            "; ".join(problems) + f" (pass --allow-missing / allow_missing=True to score the {len(pairs)} id(s) in both and list the rest)",
            predictions_file, without_reference, without_prediction,
        )
    return Alignment(pairs, without_reference, without_prediction)


def pair_runs(first: PathLike, second: PathLike) -> List[Tuple[Record, Record, Record]]:
    """Two ``empatheia eval`` output folders' answers to the same examples, matched by
    ``id`` in the order of the first folder's references: ``(A's prediction, B's
    prediction, reference)``. :class:`MissingIdsError` names the run (``run A``/``run B``)
    that lacks an example or answers one the references do not hold."""
    references_file = Path(first) / REFERENCES_NAME
    references = read_references(references_file)
    runs = []
    for name, folder in (("A", first), ("B", second)):
        path = Path(folder) / PREDICTIONS_NAME
        try:
            alignment = align(read_predictions(path), references, predictions_file=path, references_file=references_file)
        except MissingIdsError as error:
            raise MissingIdsError(f"run {name}: {error.reason}", path, error.without_reference,
                                  error.without_prediction) from None
        runs.append([prediction for prediction, _ in alignment.pairs])
    return list(zip(runs[0], runs[1], references))


def preview(ids: Sequence[str], limit: int = 5) -> str:
    """The first ``limit`` ids for a message: ``['a', 'b', ...]``."""
    shown = ", ".join(repr(i) for i in ids[:limit])
    return f"[{shown}{', ...' if len(ids) > limit else ''}]"


# ====================================================================== labels
def emotion_class(label: str, labels: LabelSets) -> str:
    """The class a free-text emotion folds to; an unknown label, normalised, as itself
    (which is none of the classes, so a prediction with it is wrong)."""
    try:
        return labels.emotion_class(label)
    except UnknownEmotionError:
        return normalize_label(label)


def group_value(value: Optional[str], attribute: str, labels: LabelSets) -> Optional[str]:
    """A profile value in the label sets' spelling (``"Middle aged"`` -> ``"middle-aged"``),
    or as written when the label sets do not know it."""
    if value is None or not value.strip():
        return None
    try:
        return labels.profile_value(attribute, value)
    except ValueError:
        return value.strip()


# ====================================================================== writing records
def references_from_dialogues(dialogues: Sequence["Dialogue"], labels: "LabelsLike",
                              file: Optional[PathLike] = None) -> List[Record]:
    """Reference records of dataset examples: ``id``, ``response``, ``emotion`` (the folded
    class), ``emotion_label`` (the raw label), ``history`` (the turns' texts) and
    ``history_roles`` (their roles), the
    :data:`PROFILE_ROLE`'s ``age`` and ``gender``, ``listener_profile`` (the listener's
    values of the label sets' profile attributes, when it has any) and ``video`` (the gold
    response's talking-head clip as an absolute path, so the references file can be
    written anywhere) when the example has one. ``labels`` are label sets or a labels YAML
    path. An example without id, gold response or emotion, or a repeated id, is a
    :class:`DataError`."""
    from ..data.readers import as_label_sets

    labels = as_label_sets(labels)
    records, seen = [], set()
    for dialogue in dialogues:
        where = dialogue.id or "?"
        if not dialogue.id:
            raise DataError("an example has no id; evaluation pairs predictions and references by id", file=file)
        if dialogue.id in seen:
            raise DataError("repeated example id; evaluation pairs predictions and references by id", file=file, record=where)
        seen.add(dialogue.id)
        if not dialogue.response:
            raise DataError("no gold response to evaluate against", file=file, record=where, field="response")
        if not dialogue.emotion:
            raise DataError("no gold emotion to evaluate against", file=file, record=where, field="emotion")
        profile = getattr(dialogue, f"{PROFILE_ROLE}_profile") or {}
        record = {
            "id": dialogue.id,
            "response": dialogue.response,
            "emotion": emotion_class(dialogue.emotion, labels),
            "emotion_label": dialogue.emotion,
            "history": [turn.text for turn in dialogue.turns],
            "history_roles": [turn.role for turn in dialogue.turns],
        }
        for attribute in GROUP_FIELDS:
            value = profile.get(attribute)
            record[attribute] = group_value(value, attribute, labels) if isinstance(value, str) else None
        # The avatar that answers is the listener: its profile is what the Style
        # Disentangler's profile classifiers learn, and are scored against.
        listener = dialogue.listener_profile or {}
        gold_profile = {attribute: group_value(listener[attribute], attribute, labels) for attribute in labels.profile
                        if isinstance(listener.get(attribute), str) and listener[attribute].strip()}
        if gold_profile:
            record["listener_profile"] = gold_profile
        video = getattr(dialogue, "response_video", None)
        if isinstance(video, (str, Path)) and str(video):
            record["video"] = str(Path(video).resolve())
        records.append(record)
    return records


def prediction_record(
    dialogue: "Dialogue",
    response: Any,
    media: Optional[Mapping[str, str]] = None,
    styles: Optional[Mapping[str, Any]] = None,
    seconds: Optional[float] = None,
) -> Record:
    """The predictions-file line of one :class:`~empatheia.response.EmpatheticResponse`;
    ``media`` (``audio``, ``video``, ``avatar``) and ``styles`` (requested and realised
    style vectors, :func:`style_values`) are added as they are, ``seconds`` (the time the
    system took for this answer) rounded to :data:`SECONDS_DECIMALS` decimals."""
    record: Record = {
        "id": dialogue.id,
        "text": response.text or "",
        "emotion": response.emotion.label,
        "chain_emotion": response.chain.speaker_emotion,
        # A system without a chain step (a baseline's emotion-only chain) leaves it null.
        "chain_of_empathy": {name: getattr(response.chain, name, None) for name, _ in CHAIN_STEPS},
        "emotion_probabilities": response.emotion.probabilities,
    }
    if response.chain_emotion is not None:
        record["chain_emotion_probabilities"] = response.chain_emotion.probabilities
    profile = getattr(response, "profile", None) or {}  # a system that reads no profile has none
    if profile:
        record["profile"] = {name: prediction.label for name, prediction in profile.items()}
        record["profile_probabilities"] = {name: prediction.probabilities for name, prediction in profile.items()}
    record.update(media or {})
    record.update(styles or {})
    if seconds is not None:
        record["seconds"] = round(float(seconds), SECONDS_DECIMALS)
    return record


def style_values(vector: Any) -> List[float]:
    """A style vector (tensor, array or list) as the list of floats a prediction line
    stores, each rounded to :data:`STYLE_DIGITS` significant digits."""
    import torch

    values = torch.as_tensor(vector).detach().to(torch.float64).cpu().reshape(-1).tolist()
    return [float(f"{value:.{STYLE_DIGITS}g}") for value in values]


def json_ready(value: Any) -> Any:
    """NumPy arrays and numbers as lists and Python numbers, NaN as ``None``."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value
