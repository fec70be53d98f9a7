"""Scoring predictions against references, and running a model over a dataset (``empatheia eval``).

Files
-----
Predictions (JSONL, one response a line)
    ``id`` (string), ``text`` (the response), ``emotion`` (the predicted emotion); optional
    ``chain_emotion`` (the Chain of Empathy's free-text ``speaker_emotion``, may be
    ``null``), ``emotion_probabilities`` (class -> probability),
    ``chain_emotion_probabilities`` (label -> probability at the chain's emotion step, for
    a model with ``language_model.chain_emotions``), ``audio`` and ``video``
    (the spoken response and the talking head: paths relative to the predictions file's
    folder, or absolute) and ``avatar`` (which avatar spoke it: the same string, the same
    face); ``speech_style`` / ``video_style`` (the style vectors S^s / S^v the model asked
    its generators for) and ``speech_style_realised`` / ``video_style_realised`` (the ones
    the same generators measure on the written audio / video), non-empty lists of finite
    numbers.
References (JSONL, one gold response a line)
    ``id``, ``response`` (the gold response text), ``emotion`` (the gold emotion); optional
    ``emotion_label`` (the dataset's raw label before folding), ``age`` and ``gender``,
    ``history`` (the dialogue's utterances, a list of strings; needed only for the polarity
    metrics), ``video`` (the gold response's talking-head clip, a path relative to the
    references file's folder or absolute; needed only for SSIM).

Other fields are allowed and ignored. Bad input is a :class:`~empatheia.errors.DataError`
naming the file, the line and the field. An id that is in one file and not in the other
is an error (:class:`MissingIdsError`) unless ``allow_missing`` is set; then only the ids
in both are scored and the rest are listed under ``missing`` in the metrics.

Emotions are compared as classes: both sides go through the label sets' fold (AvaMERG's
by default, so ``"anxious"`` and ``"fear"`` match); a label the fold does not know is
compared as written (lower case, normalised spacing), so a dataset with its own classes
still scores. A reference's gold class is its ``emotion_label`` folded when it has one,
else its ``emotion``: references written for one label set can then be scored under
another (e.g. EmpatheticDialogues' 32 labels, ``configs/labels/ed32.yaml``, against the
Chain of Empathy's ``chain_emotion``).

Age and gender
--------------
The paper's Figure 6 breaks emotion accuracy down by the *user's* age and gender. The
user is AvaMERG's ``speaker``: the person who shares an experience and whose emotion
(``chain_of_empathy.speaker_emotion``) the model recognises; the ``listener`` is the avatar
Empatheia plays. References written from a dataset therefore carry the speaker profile's
``age`` and ``gender`` (canonical spelling of the label sets); datasets without profiles
(EmpatheticDialogues) leave them ``null`` and the breakdown is left out.

Text metrics
------------
:class:`TextMetrics` picks the implementation of each text metric: the one in
:mod:`empatheia.evaluation.text` when that module defines it, else the minimal one here.
See its docstring for the contract.

Speech and video
----------------
With ``multimodal=True`` (``empatheia eval --multimodal``), :func:`score` also scores the
predictions' ``audio`` and ``video`` files: the ``speech``, ``video`` and
``consistency`` blocks of :mod:`empatheia.evaluation.multimodal` (Whisper WER/CER,
duration, loudness, speech style agreement; CPBD, lip sync, facial-emotion accuracy,
identity consistency, video style agreement, SSIM against the references' ``video``
clips; text-video emotion and text-speech content agreement; definitions there). It
loads Whisper, the FER network and MobileNetV2, so it is off by default; without it, the
number of predictions carrying media is still reported under ``media``.

Running a model
---------------
:func:`run_model` answers the dialogues batch by batch and appends each batch's
predictions to ``DIR/predictions.jsonl`` (flushed and synced), so a run that is stopped
resumes where it was: ids already in the file are skipped. ``DIR/run.json`` records the
model, data and generation settings; resuming with different ones is refused, so
predictions of two models never mix in one file.

With ``speak`` / ``animate`` the model also speaks / animates each response; its audio
and video are written to ``DIR/media/<id>.wav`` and ``.mp4`` (:func:`media_stem` makes
the id a safe file name; the MP4 carries the speech too) before its prediction line, which
records them relative to ``DIR`` (``"audio": "media/<id>.wav"``) with the ``avatar`` key.
The line also records the style vectors the model requested (``speech_style``, and
``video_style`` when animating) and those the model's own generators measure on the
files just written (``speech_style_realised``, ``video_style_realised``;
:func:`response_styles`), for the style agreement of ``--multimodal``. Animating implies
speaking. Both flags are part of ``run.json``.

References written from a dataset carry ``video`` (absolute) when the example's gold
response has a talking-head clip (:attr:`~empatheia.dialogue.Dialogue.response_video`:
avatar JSONL ``response.video``; AvaMERG with ``--media-root``).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ..errors import DataError
from ..labels import LabelSets, UnknownEmotionError, normalize_label

if TYPE_CHECKING:
    from ..dialogue import Dialogue
    from ..modeling import Empatheia

PathLike = Union[str, Path]
Record = Dict[str, Any]

PREDICTIONS_NAME = "predictions.jsonl"
REFERENCES_NAME = "references.jsonl"
METRICS_NAME = "metrics.json"
RUN_NAME = "run.json"
MEDIA_DIR = "media"
"""Subfolder of a model run's output that holds the responses' audio and video."""
RUN_DEFAULTS: Dict[str, Any] = {"speak": False, "animate": False}
"""Settings a ``run.json`` written before they existed is read as having."""
GROUP_FIELDS = ("age", "gender")
STYLE_FIELDS = ("speech_style", "speech_style_realised", "video_style", "video_style_realised")
"""Prediction fields holding a style vector: a non-empty list of finite numbers."""
STYLE_DIGITS = 6
"""Significant digits a style vector's values keep in a prediction line (float32 holds
about 7; the agreement metrics do not need more)."""
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
    "audio": ((str,), False),
    "video": ((str,), False),
    "avatar": ((str,), False),
    "speech_style": ((list,), False),
    "speech_style_realised": ((list,), False),
    "video_style": ((list,), False),
    "video_style_realised": ((list,), False),
}
REFERENCE_FIELDS: Dict[str, Tuple[tuple, bool]] = {
    "id": ((str,), True),
    "response": ((str,), True),
    "emotion": ((str,), True),
    "emotion_label": ((str,), False),
    "age": ((str,), False),
    "gender": ((str,), False),
    "history": ((list,), False),
    "video": ((str,), False),
}


class MissingIdsError(DataError):
    """Ids in the predictions without a reference, or references without a prediction."""

    def __init__(self, reason: str, file: Optional[PathLike], without_reference: List[str], without_prediction: List[str]):
        super().__init__(reason, file=file)
        self.without_reference = without_reference
        self.without_prediction = without_prediction


class RunMismatchError(ValueError):
    """An output folder holds predictions of another model, dataset or setting."""


# ====================================================================== reading
def read_jsonl(path: PathLike) -> List[Tuple[int, Any]]:
    """``(line number, parsed value)`` for every non-blank line; a line that is not JSON is a
    :class:`DataError` naming it."""
    path = Path(path)
    if not path.is_file():
        raise DataError("file not found", file=path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise DataError(f"not UTF-8 text: {error}", file=path) from None
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append((number, json.loads(line)))
        except json.JSONDecodeError as error:
            raise DataError(f"invalid JSON at column {error.colno}: {error.msg}", file=path, record=f"line {number}") from None
    return records


def validate_record(
    record: Any, spec: Mapping[str, Tuple[tuple, bool]], file: Optional[PathLike], where: str
) -> Record:
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
    probabilities = record.get("emotion_probabilities")
    if probabilities:
        for label, value in probabilities.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise DataError(f"should be a number, got {value!r:.40}", file=file, record=where, field=f"emotion_probabilities.{label}")
    for name in STYLE_FIELDS:
        vector = record.get(name) if name in spec else None
        if vector is None:
            continue
        if not vector:
            raise DataError("is empty (a style vector needs at least one value)", file=file, record=where, field=name)
        for position, value in enumerate(vector):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise DataError(f"should be a finite number, got {value!r:.40}", file=file, record=where, field=f"{name}[{position}]")
    return record


def _type_name(kind: type) -> str:
    return {str: "a string", dict: "an object", list: "a list", int: "an integer", float: "a number"}.get(kind, kind.__name__)


def _read_records(path: PathLike, spec: Mapping[str, Tuple[tuple, bool]], what: str) -> List[Record]:
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
        problems.append(f"{len(without_reference)} prediction id(s) not in {ref_name}: {_preview(without_reference)}")
    if without_prediction:
        problems.append(f"{len(without_prediction)} reference id(s) of {ref_name} without a prediction: {_preview(without_prediction)}")
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


def _preview(ids: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(repr(i) for i in ids[:limit])
    return f"[{shown}{', ...' if len(ids) > limit else ''}]"


# ====================================================================== text metrics
def tokenize(text: str) -> List[str]:
    """Lower-cased words (apostrophes inside a word kept) and single punctuation marks:
    ``"I'm fine!!"`` -> ``["i'm", "fine", "!", "!"]`` (the text module's convention)."""
    return re.findall(r"\w+(?:['\u2019]\w+)*|[^\w\s]", text.lower())


def distinct_n(responses: Sequence[str], n: int) -> float:
    """Dist-n (Appendix E.3.1, eqs. 24-25) over a corpus: distinct n-grams / all n-grams,
    counted over every response's :func:`tokenize` tokens (n-grams do not cross
    responses). A fraction in [0, 1]; 0.0 when there is no n-gram."""
    grams = [tuple(tokens[i : i + n]) for tokens in map(tokenize, responses) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def emotion_report(
    predicted: Sequence[str],
    gold: Sequence[str],
    labels: Sequence[str],
    groups: Optional[Mapping[str, Sequence[Optional[str]]]] = None,
) -> Dict[str, Any]:
    """Minimal emotion report (the fallback of :class:`TextMetrics`): ``accuracy``
    (Appendix E.3.1, eq. 23: correct / all), ``per_class`` accuracy (the recall of each
    gold class, Figure 6), the ``confusion`` matrix (rows gold, columns predicted, in
    ``labels`` order, which must hold every label) and ``by_group`` accuracy per value of
    each grouping (``None`` values left out). Same keys as
    :func:`empatheia.evaluation.text.emotion_report` except the precision/recall/F1 ones."""
    if len(predicted) != len(gold) or not gold:
        raise ValueError(f"need as many predicted as gold emotions, and some: got {len(predicted)} and {len(gold)}")
    index = {label: k for k, label in enumerate(labels)}
    confusion = [[0] * len(labels) for _ in labels]
    for p, g in zip(predicted, gold):
        confusion[index[g]][index[p]] += 1
    hits = [p == g for p, g in zip(predicted, gold)]
    per_class = {}
    for k, label in enumerate(labels):
        support = sum(confusion[k])
        per_class[label] = {
            "accuracy": confusion[k][k] / support if support else None,
            "support": support,
            "predicted": sum(row[k] for row in confusion),
        }
    by_group: Dict[str, Dict[str, Dict[str, Any]]] = {}
    for name, values in (groups or {}).items():
        table: Dict[str, List[int]] = {}
        for hit, value in zip(hits, values):
            if value is not None:
                counts = table.setdefault(str(value), [0, 0])
                counts[0] += int(hit)
                counts[1] += 1
        by_group[name] = {v: {"accuracy": c / n, "correct": c, "n": n} for v, (c, n) in sorted(table.items())}
    return {
        "labels": list(labels),
        "n": len(gold),
        "correct": sum(hits),
        "accuracy": sum(hits) / len(gold),
        "per_class": per_class,
        "confusion": confusion,
        "confusion_rows": list(labels),
        "confusion_columns": list(labels),
        "by_group": by_group,
    }


class TextMetrics:
    """Which implementation computes each text metric :func:`score` reports.

    :mod:`empatheia.evaluation.text` is preferred for every function it defines; this
    module's minimal versions stand in where it is absent (or lacks the function). Used
    from ``text``:

    * ``emotion_report(predicted, gold, labels=, groups=, view="exact")``: accuracy,
      macro-F1, per-class precision/recall/F1, confusion, accuracy by group. Fallback:
      :func:`emotion_report` here (no macro-F1 / precision / recall / F1).
    * ``distinct_n(responses, n)``: Dist-n as a fraction. Fallback: :func:`distinct_n`.
    * ``corpus_bleu(hypotheses, references)``: BLEU-1..4 (fractions). No fallback.
    * ``token_match_score(candidates, references)``: BERTScore-style P/R/F1 on a packaged
      encoder; only when asked (``similarity=True``: it loads a model). No fallback.
    * ``polarity_scores(histories, responses)``: emotion/sentiment/empathy polarity; only
      when asked (``polarity=True``) and the references carry ``history``. No fallback.

    ``implementations`` maps each metric to the module that computed it (written to
    metrics.json).
    """

    def __init__(self, module: Optional[Any] = None):
        self.module = module

    @classmethod
    def load(cls) -> "TextMetrics":
        """Use :mod:`empatheia.evaluation.text` if it exists."""
        name = f"{__package__}.text"
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name != name:
                raise  # text.py exists but needs something missing: say so
            module = None
        return cls(module)

    def function(self, name: str) -> Tuple[Optional[Callable], str]:
        """``(function, module name)``: ``text``'s when it has it, else this module's
        (``None`` when neither has one)."""
        found = getattr(self.module, name, None) if self.module is not None else None
        if callable(found):
            return found, self.module.__name__
        local = {"emotion_report": emotion_report, "distinct_n": distinct_n}.get(name)
        return local, __name__


# ====================================================================== scoring
def emotion_class(label: str, labels: LabelSets) -> str:
    """The class a free-text emotion folds to; an unknown label, normalised, as itself."""
    try:
        return labels.emotion_class(label)
    except UnknownEmotionError:
        return normalize_label(label)


def score(
    predictions: Sequence[Mapping[str, Any]],
    references: Sequence[Mapping[str, Any]],
    allow_missing: bool = False,
    labels: Optional[LabelSets] = None,
    text_metrics: Optional[TextMetrics] = None,
    similarity: bool = False,
    polarity: bool = False,
    predictions_file: Optional[PathLike] = None,
    references_file: Optional[PathLike] = None,
    multimodal: bool = False,
    media_dir: Optional[PathLike] = None,
    multimodal_models: Optional[Any] = None,
    progress: bool = False,
    reference_media_dir: Optional[PathLike] = None,
) -> Dict[str, Any]:
    """Score predictions against references (records as in the module docstring).

    Returns a JSON-ready dict:

    * ``count``: scored pairs; ``emotion_accuracy``, ``dist_1``, ``dist_2``: fractions;
      ``emotion_macro_f1`` where the text module computes it;
    * ``chain_emotion_accuracy``: when any prediction has a ``chain_emotion`` field (a
      ``null`` or unknown one counts as wrong);
    * ``bleu``: ``bleu_1`` .. ``bleu_4`` and ``brevity_penalty`` (text module);
      ``similarity`` (BERTScore-style mean ``precision``/``recall``/``f1``) and
      ``polarity`` (mean ``emotion``/``sentiment``/``empathy``) when asked;
    * ``emotion``: the emotion report: ``labels`` (class order), ``confusion`` (rows gold
      ``confusion_rows``, columns predicted ``confusion_columns``), ``per_class``
      (``accuracy`` = recall of the gold class, ``support``, ...), and ``by_group``:
      accuracy (``accuracy``, ``correct``, ``n``) per ``age`` and ``gender`` value where
      references give them, in the label sets' order;
    * ``media``: when any scored prediction has ``audio``/``video``: how many have each,
      and whether they were ``scored``;
    * ``speech``, ``video``, ``consistency``: with ``multimodal``, the blocks of
      :func:`empatheia.evaluation.multimodal.score_multimodal`, media paths read
      relative to ``media_dir`` (default: the predictions file's folder, else the working
      directory), with ``multimodal_models`` (default: the packaged models) and a
      progress bar if ``progress``; the references' ``video`` clips (for SSIM) are read
      relative to ``reference_media_dir`` (default: the references file's folder, else the
      working directory);
    * ``missing``: ``without_reference`` and ``without_prediction`` ids (with
      ``allow_missing``); ``implementations``: which module computed each metric.

    Records given directly are validated like file lines (their position is the "line").
    """
    labels = labels or LabelSets()
    text_metrics = text_metrics or TextMetrics.load()
    predictions = [validate_record(dict(p), PREDICTION_FIELDS, predictions_file, f"line {i}") for i, p in enumerate(predictions, 1)]
    references = [validate_record(dict(r), REFERENCE_FIELDS, references_file, f"line {i}") for i, r in enumerate(references, 1)]
    alignment = align(predictions, references, allow_missing, predictions_file, references_file)
    pairs = alignment.pairs
    hypotheses = [p["text"] for p, _ in pairs]
    gold_texts = [r["response"] for _, r in pairs]
    gold = [emotion_class(r.get("emotion_label") or r["emotion"], labels) for _, r in pairs]
    predicted = [emotion_class(p["emotion"], labels) for p, _ in pairs]
    implementations: Dict[str, str] = {}

    classes = list(labels.emotions) + sorted(set(gold + predicted) - set(labels.emotions))
    groups = {}
    for attribute in GROUP_FIELDS:
        values = [_group_value(r.get(attribute), attribute, labels) for _, r in pairs]
        if any(v is not None for v in values):
            groups[attribute] = values
    report_fn, implementations["emotion_report"] = text_metrics.function("emotion_report")
    if implementations["emotion_report"] == __name__:
        report = report_fn(predicted, gold, labels=classes, groups=groups)
    else:
        report = report_fn(predicted, gold, labels=classes, groups=groups, view="exact")
    report = _json_ready(report)
    for attribute, table in report.get("by_group", {}).items():
        order = [v for v in labels.profile.get(attribute, ()) if v in table]
        report["by_group"][attribute] = {v: table[v] for v in order + [v for v in table if v not in order]}

    dist_fn, implementations["distinct_n"] = text_metrics.function("distinct_n")
    metrics: Dict[str, Any] = {
        "count": len(pairs),
        "emotion_accuracy": report["accuracy"],
        "dist_1": dist_fn(hypotheses, 1),
        "dist_2": dist_fn(hypotheses, 2),
    }
    if report.get("macro_f1") is not None:
        metrics["emotion_macro_f1"] = report["macro_f1"]
    if any("chain_emotion" in p for p, _ in pairs):
        chain = [emotion_class(p["chain_emotion"], labels) if p.get("chain_emotion") else None for p, _ in pairs]
        metrics["chain_emotion_accuracy"] = sum(c == g for c, g in zip(chain, gold)) / len(gold)

    bleu_fn, where = text_metrics.function("corpus_bleu")
    if bleu_fn is not None:
        bleu = bleu_fn(hypotheses, gold_texts)
        metrics["bleu"] = {k: v for k, v in bleu.items() if k.startswith("bleu_") or k == "brevity_penalty"}
        implementations["corpus_bleu"] = where
    if similarity:
        similarity_fn, where = text_metrics.function("token_match_score")
        if similarity_fn is None:
            raise ValueError("the BERTScore-style similarity needs empatheia.evaluation.text.token_match_score")
        metrics["similarity"] = _json_ready(similarity_fn(hypotheses, gold_texts)["mean"])
        implementations["token_match_score"] = where
    if polarity:
        polarity_fn, where = text_metrics.function("polarity_scores")
        if polarity_fn is None:
            raise ValueError("the polarity metrics need empatheia.evaluation.text.polarity_scores")
        without = [r["id"] for _, r in pairs if not isinstance(r.get("history"), list)]
        if without:
            raise DataError(
                f"the polarity metrics need each reference's dialogue 'history' (a list of utterances); "
                f"{len(without)} lack it: {_preview(without)}", file=references_file, field="history",
            )
        metrics["polarity"] = _json_ready(polarity_fn([r["history"] for _, r in pairs], hypotheses)["mean"])
        implementations["polarity_scores"] = where

    with_audio = sum(bool(p.get("audio")) for p, _ in pairs)
    with_video = sum(bool(p.get("video")) for p, _ in pairs)
    if with_audio or with_video:
        metrics["media"] = {"audio": with_audio, "video": with_video, "scored": bool(multimodal)}
    if multimodal:
        from .multimodal import score_multimodal

        if media_dir is None and predictions_file is not None:
            media_dir = Path(predictions_file).parent
        if reference_media_dir is None and references_file is not None:
            reference_media_dir = Path(references_file).parent
        blocks = score_multimodal(
            [p for p, _ in pairs], gold, predicted, base_dir=media_dir, predictions_file=predictions_file,
            models=multimodal_models, progress=progress, references=[r for _, r in pairs],
            references_dir=reference_media_dir, references_file=references_file,
        )
        metrics.update(_json_ready(blocks))
        implementations["multimodal"] = f"{__package__}.multimodal"

    metrics["emotion"] = report
    metrics["missing"] = {"without_reference": alignment.without_reference, "without_prediction": alignment.without_prediction}
    metrics["implementations"] = implementations
    return metrics


def _json_ready(value: Any) -> Any:
    """NumPy arrays and numbers as lists and Python numbers, NaN as ``None``."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    return value


def _group_value(value: Optional[str], attribute: str, labels: LabelSets) -> Optional[str]:
    """A profile value in the label sets' spelling (``"Middle aged"`` -> ``"middle-aged"``),
    or as written when the label sets do not know it."""
    if value is None or not value.strip():
        return None
    try:
        return labels.profile_value(attribute, value)
    except ValueError:
        return value.strip()


def score_files(
    predictions_path: PathLike,
    references_path: PathLike,
    allow_missing: bool = False,
    labels: Optional[LabelSets] = None,
    keep_ids: Optional[Iterable[str]] = None,
    similarity: bool = False,
    polarity: bool = False,
    multimodal: bool = False,
    multimodal_models: Optional[Any] = None,
    progress: bool = False,
) -> Dict[str, Any]:
    """:func:`score` on two files, with their paths under ``sources``. ``keep_ids`` scores
    only the predictions with those ids (a run's current selection); how many others the
    file holds is under ``sources.predictions_outside_selection``. Media paths of the
    predictions are relative to the predictions file's folder."""
    predictions = read_predictions(predictions_path)
    outside = 0
    if keep_ids is not None:
        keep = set(keep_ids)
        outside = sum(p["id"] not in keep for p in predictions)
        predictions = [p for p in predictions if p["id"] in keep]
    references = read_references(references_path)
    metrics = score(
        predictions, references, allow_missing, labels, similarity=similarity, polarity=polarity,
        predictions_file=predictions_path, references_file=references_path, multimodal=multimodal,
        multimodal_models=multimodal_models, progress=progress,
    )
    metrics["sources"] = {"predictions": str(predictions_path), "references": str(references_path)}
    if keep_ids is not None:
        metrics["sources"]["predictions_outside_selection"] = outside
    return metrics


# ====================================================================== writing
def write_text_atomic(path: PathLike, text: str) -> Path:
    """Write a file whole or not at all: into ``.NAME.tmp`` beside it, then renamed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    return path


def write_json(path: PathLike, data: Any) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n")


def write_jsonl(path: PathLike, records: Iterable[Mapping[str, Any]]) -> Path:
    return write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def write_metrics(metrics: Mapping[str, Any], out_dir: PathLike) -> Path:
    """``DIR/metrics.json`` (a NaN is written as ``null``, never as invalid JSON)."""
    return write_json(Path(out_dir) / METRICS_NAME, _json_ready(metrics))


# ====================================================================== running a model
def references_from_dialogues(dialogues: Sequence["Dialogue"], labels: LabelSets, file: Optional[PathLike] = None) -> List[Record]:
    """Reference records of dataset examples: ``id``, ``response``, ``emotion`` (the folded
    class), ``emotion_label`` (the raw label), ``history`` (the turns' texts), the
    :data:`PROFILE_ROLE`'s ``age`` and ``gender``, and ``video`` (the gold response's
    talking-head clip as an absolute path, so the references file can be written
    anywhere) when the example has one. An example without id, gold response or emotion,
    or a repeated id, is a :class:`DataError`."""
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
        }
        for attribute in GROUP_FIELDS:
            value = profile.get(attribute)
            record[attribute] = _group_value(value, attribute, labels) if isinstance(value, str) else None
        video = getattr(dialogue, "response_video", None)
        if isinstance(video, (str, Path)) and str(video):
            record["video"] = str(Path(video).resolve())
        records.append(record)
    return records


def prediction_record(
    dialogue: "Dialogue", response: Any, media: Optional[Mapping[str, str]] = None, styles: Optional[Mapping[str, Any]] = None
) -> Record:
    """The predictions-file line of one :class:`~empatheia.response.EmpatheticResponse`;
    ``media`` (``audio``, ``video``, ``avatar``; from :func:`write_response_media`) and
    ``styles`` (requested and realised style vectors; from :func:`response_styles`) are
    added as they are."""
    record: Record = {
        "id": dialogue.id,
        "text": response.text or "",
        "emotion": response.emotion.label,
        "chain_emotion": response.chain.speaker_emotion,
        "emotion_probabilities": response.emotion.probabilities,
    }
    if response.chain_emotion is not None:
        record["chain_emotion_probabilities"] = response.chain_emotion.probabilities
    record.update(media or {})
    record.update(styles or {})
    return record


def style_values(vector: Any) -> List[float]:
    """A style vector (tensor, array or list) as the list of floats a prediction line
    stores, each rounded to :data:`STYLE_DIGITS` significant digits."""
    import torch

    values = torch.as_tensor(vector).detach().to(torch.float64).cpu().reshape(-1).tolist()
    return [float(f"{value:.{STYLE_DIGITS}g}") for value in values]


def response_styles(
    generators: Tuple[Any, Any], out_dir: PathLike, responses: Sequence[Any], media: Sequence[Optional[Mapping[str, str]]]
) -> List[Dict[str, List[float]]]:
    """The style fields of a batch's prediction lines: for each response whose ``audio``
    (``video``) file was written, ``speech_style`` (``video_style``): the S^s (S^v) the
    model requested, and ``speech_style_realised`` (``video_style_realised``): what the
    speech (talking-head) generator's ``style_features`` measures on that file.

    ``generators`` is the model's ``(speech, talking_head)`` (:meth:`Empatheia.generators`),
    the ones that rendered the files; ``media`` holds each response's fields from
    :func:`write_response_media` (paths relative to ``out_dir``). Each generator measures
    the whole batch in one ``style_features`` call."""
    out: List[Dict[str, List[float]]] = [{} for _ in responses]
    for generator, kind, name in ((generators[0], "audio", "speech_style"), (generators[1], "video", "video_style")):
        items = [i for i, fields in enumerate(media)
                 if fields and fields.get(kind) and getattr(responses[i], name, None) is not None]
        if not items:
            continue
        realised = generator.style_features([Path(out_dir) / media[i][kind] for i in items])
        if len(realised) != len(items):
            raise RuntimeError(f"{type(generator).__name__}.style_features gave {len(realised)} styles for {len(items)} files")
        for i, value in zip(items, realised):
            out[i][name] = style_values(getattr(responses[i], name))
            out[i][f"{name}_realised"] = style_values(value)
    return out


def media_stem(prediction_id: str, limit: int = 80) -> str:
    """A file name (without extension) for a prediction's media, unique per id.

    Characters other than letters, digits, ``-``, ``_`` and ``.`` become ``_`` and leading
    or trailing dots and underscores go; when that changed the id (or it is longer than
    ``limit``), the first ``limit`` characters get a hyphen and 8 hex digits of the id's
    SHA-1, so ids that read alike never share a file: ``"c1/3"`` ->
    ``"c1_3-<hash>"``, ``"c1_3"`` -> ``"c1_3"``.
    """
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", prediction_id).strip("._")
    if safe != prediction_id or len(safe) > limit:
        safe = f"{safe[:limit] or 'id'}-{hashlib.sha1(prediction_id.encode('utf-8')).hexdigest()[:8]}"
    return safe


def write_response_media(out_dir: PathLike, prediction_id: str, response: Any) -> Dict[str, str]:
    """Write a response's ``audio`` (16-bit WAV) and ``video`` (H.264 MP4 with the speech
    as AAC) to ``out_dir/media/<stem>.wav`` / ``.mp4`` (:func:`media_stem`); returns the
    prediction fields: paths relative to ``out_dir`` (``/``-separated) and ``avatar``.
    Files are written whole then renamed, so a kill leaves no half file under the name."""
    from ..media import write_mp4, write_wav

    folder = Path(out_dir) / MEDIA_DIR
    folder.mkdir(parents=True, exist_ok=True)
    stem = media_stem(prediction_id)
    fields: Dict[str, str] = {}
    audio, video = getattr(response, "audio", None), getattr(response, "video", None)
    if audio is not None:
        target = folder / f"{stem}.wav"
        os.replace(_synced(write_wav(folder / f".{stem}.tmp.wav", audio.samples, audio.sample_rate)), target)
        fields["audio"] = f"{MEDIA_DIR}/{target.name}"
    if video is not None:
        target = folder / f"{stem}.mp4"
        samples, rate = (audio.samples, audio.sample_rate) if audio is not None else (None, None)
        os.replace(_synced(write_mp4(folder / f".{stem}.tmp.mp4", video.frames, video.fps, samples, rate)), target)
        fields["video"] = f"{MEDIA_DIR}/{target.name}"
    if getattr(response, "avatar", None):
        fields["avatar"] = str(response.avatar)
    return fields


def _synced(path: Path) -> Path:
    """``path`` after its data reached the disk (as the prediction line naming it will)."""
    with open(path, "rb+") as handle:
        os.fsync(handle.fileno())
    return path


def recover_predictions(path: PathLike) -> List[Record]:
    """The predictions a previous run wrote to ``path`` (none if absent). A last line cut
    off by a kill (no newline at its end) is removed from the file; any other bad line is
    a :class:`DataError`."""
    path = Path(path)
    if not path.is_file():
        return []
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
        with open(path, "r+b") as handle:
            handle.truncate(keep)
        data = data[:keep]
    if not data.strip():
        return []
    return read_predictions(path)


@dataclass
class RunSummary:
    """What :func:`run_model` did."""

    selected: int
    """Examples in this run's selection."""
    resumed: int
    """Of those, already predicted by an earlier run and skipped."""
    generated: int
    """Newly predicted."""
    predictions_path: Path
    references_path: Path


def check_run_info(out_dir: PathLike, info: Mapping[str, Any]) -> None:
    """Record ``info`` (model, data, generation settings) in ``DIR/run.json``; when the
    folder already holds predictions, they must come from the same ``info``
    (:class:`RunMismatchError` otherwise)."""
    out_dir = Path(out_dir)
    run_path, predictions = out_dir / RUN_NAME, out_dir / PREDICTIONS_NAME
    has_predictions = predictions.is_file() and predictions.stat().st_size > 0
    info = json.loads(json.dumps(info))  # the form it has once read back
    if has_predictions:
        if not run_path.is_file():
            raise RunMismatchError(
                f"{predictions} exists but {run_path} does not, so which model wrote it is unknown; use another --out or remove it"
            )
        previous = dict(RUN_DEFAULTS, **json.loads(run_path.read_text(encoding="utf-8")))
        changed = {k: (previous.get(k), info.get(k)) for k in set(previous) | set(info) if previous.get(k) != info.get(k)}
        if changed:
            details = "; ".join(f"{k}: was {old!r}, now {new!r}" for k, (old, new) in sorted(changed.items()))
            raise RunMismatchError(
                f"{out_dir} holds predictions of another run ({details}); resume with the same settings, or use another --out"
            )
    write_json(run_path, info)


def run_model(
    model: "Empatheia",
    dialogues: Sequence["Dialogue"],
    out_dir: PathLike,
    batch_size: int = 8,
    max_new_tokens: Optional[int] = None,
    labels: Optional[LabelSets] = None,
    run_info: Optional[Mapping[str, Any]] = None,
    progress: bool = True,
    data_file: Optional[PathLike] = None,
    speak: bool = False,
    animate: bool = False,
) -> RunSummary:
    """Answer ``dialogues`` with ``model`` into ``DIR/predictions.jsonl`` (resumable) and
    write their references to ``DIR/references.jsonl``.

    Batches of ``batch_size`` go through ``model.respond``; each batch's lines are
    appended and flushed (and synced) before the next starts, so a stopped run loses at
    most the batch in flight. Ids already in the file are skipped. ``run_info`` (e.g. the
    model and data) is checked against the folder's ``run.json`` (:func:`check_run_info`).
    ``labels`` fold the gold emotions (default: the model's label sets).

    ``speak`` / ``animate`` (animating implies speaking) also render each response; its
    files are written (:func:`write_response_media`) before its line, whose ``audio``,
    ``video`` and ``avatar`` name them, and whose ``speech_style``/``video_style`` and
    ``*_realised`` give the requested styles and those the model's generators measure on
    the written files (:func:`response_styles`, one ``style_features`` call per generator
    and batch). Both flags go into ``run.json`` with the rest.
    """
    from tqdm.auto import tqdm

    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    labels = labels or model.label_sets()
    references = references_from_dialogues(dialogues, labels, file=data_file)
    speak = bool(speak or animate)
    check_run_info(out_dir, dict(run_info or {}, max_new_tokens=max_new_tokens, speak=speak, animate=bool(animate)))
    references_path = write_jsonl(out_dir / REFERENCES_NAME, references)
    predictions_path = out_dir / PREDICTIONS_NAME
    done = {p["id"] for p in recover_predictions(predictions_path)}
    todo = [d for d in dialogues if d.id not in done]
    resumed = len(dialogues) - len(todo)
    bar = tqdm(total=len(dialogues), initial=resumed, desc="responding", unit="dialogue", disable=not progress)
    try:
        with open(predictions_path, "a", encoding="utf-8") as handle:
            for start in range(0, len(todo), batch_size):
                batch = list(todo[start : start + batch_size])
                responses = model.respond(batch, max_new_tokens=max_new_tokens, speak=speak, animate=animate)
                media: List[Optional[Dict[str, str]]] = [None] * len(batch)
                styles: List[Optional[Dict[str, List[float]]]] = [None] * len(batch)
                if speak:
                    media = [write_response_media(out_dir, d.id, r) for d, r in zip(batch, responses)]
                    styles = list(response_styles(model.generators(), out_dir, responses, media))
                lines = [
                    json.dumps(prediction_record(dialogue, response, fields, style), ensure_ascii=False) + "\n"
                    for dialogue, response, fields, style in zip(batch, responses, media, styles)
                ]
                handle.write("".join(lines))
                handle.flush()
                os.fsync(handle.fileno())
                bar.update(len(batch))
    finally:
        bar.close()
    return RunSummary(len(dialogues), resumed, len(todo), predictions_path, references_path)


def evaluate_dataset(
    model: "Empatheia",
    data: PathLike,
    out_dir: PathLike,
    format: str = "auto",
    media_root: Optional[PathLike] = None,
    labels: Optional[LabelSets] = None,
    limit: Optional[int] = None,
    batch_size: int = 8,
    max_new_tokens: Optional[int] = None,
    run_info: Optional[Mapping[str, Any]] = None,
    progress: bool = True,
    similarity: bool = False,
    polarity: bool = False,
    speak: bool = False,
    animate: bool = False,
    multimodal: bool = False,
    multimodal_models: Optional[Any] = None,
) -> Tuple[Dict[str, Any], RunSummary]:
    """Read a dataset, answer its first ``limit`` examples (all by default) with
    :func:`run_model` (resumable), score them and write ``DIR/metrics.json``.

    Only this selection is scored: predictions an earlier, larger run left in the folder
    are kept in the file and counted under ``sources.predictions_outside_selection``.
    ``labels`` read and fold the dataset's labels (default: the model's label sets).
    ``speak`` / ``animate`` render the responses (:func:`run_model`); ``multimodal``
    scores their media (:func:`score`).
    """
    from ..data.readers import read_dataset

    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    labels = labels or model.label_sets()
    corpus = read_dataset(data, format=format, media_root=media_root, labels=labels)
    dialogues = list(corpus.dialogues)[:limit] if limit is not None else list(corpus.dialogues)
    if not dialogues:
        raise DataError("no examples to evaluate", file=data)
    summary = run_model(
        model, dialogues, out_dir, batch_size=batch_size, max_new_tokens=max_new_tokens, labels=labels,
        run_info=run_info, progress=progress, data_file=data, speak=speak, animate=animate,
    )
    metrics = score_files(
        summary.predictions_path, summary.references_path, labels=labels, keep_ids=[d.id for d in dialogues],
        similarity=similarity, polarity=polarity, multimodal=multimodal, multimodal_models=multimodal_models,
        progress=progress,
    )
    metrics["run"] = {
        "selected": summary.selected, "resumed": summary.resumed, "generated": summary.generated, **dict(run_info or {}),
        "speak": bool(speak or animate), "animate": bool(animate),
    }
    write_metrics(metrics, out_dir)
    return metrics, summary
