"""Scoring predictions against references (``empatheia eval --predictions P --references R``).

:func:`score` pairs the records of :mod:`empatheia.evaluation.records` by id and reports
the text metrics of :mod:`empatheia.evaluation.text` (emotion accuracy and its
breakdowns, Dist-1/2, BLEU; on request the BERTScore-style similarity and the polarity
metrics). What it computes is set by :class:`ScoreOptions`; where the records came from
(for error messages and relative media paths) by :class:`RecordFiles`.

Speech and video
----------------
With ``multimodal`` (``empatheia eval --multimodal``), :func:`score` also scores the
predictions' ``audio`` and ``video`` files: the ``speech``, ``video`` and
``consistency`` blocks of :mod:`empatheia.evaluation.multimodal` (Whisper WER/CER,
duration, loudness, speech style agreement; CPBD, lip sync, facial-emotion accuracy,
identity consistency, video style agreement, SSIM against the references' ``video``
clips; text-video emotion and text-speech content agreement; definitions there). It
loads Whisper, the FER network and MobileNetV2, so it is off by default; without it, the
number of predictions carrying media is still reported under ``media``.

Unknown emotions
----------------
The classes are the label sets' emotions, and nothing else. A predicted emotion the label
sets do not know is wrong (the ``<unk>`` column, counted in ``unknown_predictions``). A
gold emotion they do not know is a :class:`~empatheia.errors.DataError` naming the
references file, the record and the field: scoring it as a class of its own would change
every score (accuracy, macro-F1 over one more class). With ``unknown_gold="skip"``
(``--skip-unknown-gold``) those references are left out of every metric instead, counted in
``skipped_unknown_gold`` and listed under ``missing.unknown_gold``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Union

from ..errors import DataError
from ..io import write_json
from ..labels import ED_EMOTIONS, EMOTION_LABELS, LabelSets, UnknownEmotionError, normalize_label
from . import text
from .records import (
    GROUP_FIELDS,
    PREDICTION_FIELDS,
    REFERENCE_FIELDS,
    align,
    emotion_class,
    group_value,
    json_ready,
    preview,
    read_predictions,
    read_references,
    validate_records,
)

PathLike = Union[str, Path]

METRICS_NAME = "metrics.json"


@dataclass
class ScoreOptions:
    """What :func:`score` computes."""

    allow_missing: bool = False
    """Score the ids in both predictions and references and list the others under
    ``missing`` (otherwise ids on one side only are a
    :class:`~empatheia.evaluation.records.MissingIdsError`)."""
    labels: Optional[Union[LabelSets, str, Path]] = None
    """The label sets that fold emotions and spell profile values, or the path of a labels
    YAML file (default: AvaMERG's; then predictions whose ``emotion_probabilities`` name
    other classes are an error asking for them, see :func:`score`)."""
    similarity: bool = False
    """Also the BERTScore-style similarity to the gold responses (loads a small encoder)."""
    polarity: bool = False
    """Also the emotion/sentiment/empathy polarity (references need ``history``)."""
    multimodal: bool = False
    """Also score the predictions' ``audio`` / ``video`` files (see the module docstring)."""
    multimodal_models: Optional[Any] = None
    """The models of the multimodal metrics (default: the packaged ones)."""
    progress: bool = False
    """A progress bar over the media."""
    unknown_gold: str = "error"
    """A reference whose gold emotion the label sets do not know: ``"error"`` (a
    :class:`~empatheia.errors.DataError`), or ``"skip"`` (left out of every metric and
    counted; see the module docstring)."""

    def __post_init__(self):
        if self.unknown_gold not in ("error", "skip"):
            raise ValueError(f"unknown_gold must be 'error' or 'skip', got {self.unknown_gold!r}")


@dataclass
class RecordFiles:
    """Where the records came from: named in errors, and the folders their media paths
    are relative to."""

    predictions: Optional[PathLike] = None
    references: Optional[PathLike] = None
    predictions_media: Optional[PathLike] = None
    """Folder of the predictions' relative ``audio`` / ``video`` (default: the predictions
    file's folder, else the working directory)."""
    references_media: Optional[PathLike] = None
    """Folder of the references' relative ``video`` (default: the references file's folder,
    else the working directory)."""


def score(
    predictions: Sequence[Mapping[str, Any]],
    references: Sequence[Mapping[str, Any]],
    options: Optional[ScoreOptions] = None,
    files: Optional[RecordFiles] = None,
) -> Dict[str, Any]:
    """Score predictions against references (records as in
    :mod:`empatheia.evaluation.records`; given directly, they are validated like file
    lines, their position being the "line").

    Returns a JSON-ready dict:

    * ``count``: scored pairs; ``emotion_accuracy``, ``emotion_macro_f1``, ``dist_1``,
      ``dist_2``: fractions; ``repeated_sentence_share`` and ``repeated_sentence_count``:
      the answers that say one sentence twice (:func:`~empatheia.evaluation.text.repeated_sentences`);
    * ``listener_echo_share``, ``listener_echo_count`` and ``listener_echo_answers``: when
      references give ``history_roles``, the answers that repeat a run of words of an
      earlier listener turn (:func:`~empatheia.evaluation.text.listener_echoes`);
    * ``chain_complete_share``: when any prediction has a ``chain_of_empathy`` field, the
      share of answers whose chain names all four steps (a ``null`` one names none);
    * ``chain_emotion_accuracy``: when any prediction has a ``chain_emotion`` field (a
      ``null`` or unknown one counts as wrong); ``null`` when it cannot apply: no chain
      names an emotion, or none names one the label sets know (a chain trained on ED's
      labels, scored under a model's own classes);
    * ``profile``: when predictions have a ``profile``, per attribute the ``accuracy``,
      ``correct`` and ``n`` of the predicted value against the reference's
      ``listener_profile`` (the avatar that answers), over the pairs that have both;
      ``accuracy`` ``null`` for an attribute no reference gives;
    * ``not_applicable``: for every metric that is ``null`` because it cannot apply here,
      its dotted key (``"chain_emotion_accuracy"``, ``"profile.accent.accuracy"``,
      ``"video.facial_emotion_accuracy"``) -> why; absent when there is none;
    * ``bleu``: ``bleu_1`` .. ``bleu_4`` and ``brevity_penalty``; ``similarity``
      (BERTScore-style mean ``precision``/``recall``/``f1``) and ``polarity`` (mean
      ``emotion``/``sentiment``/``empathy``) when asked;
    * ``emotion``: the emotion report: ``labels`` (class order), ``confusion`` (rows gold
      ``confusion_rows``, columns predicted ``confusion_columns``), ``per_class``
      (``accuracy`` = recall of the gold class, ``support``, ...), and ``by_group``:
      accuracy (``accuracy``, ``correct``, ``n``) per ``age`` and ``gender`` value where
      references give them, in the label sets' order;
    * ``media``: when any scored prediction has ``audio``/``video``: how many have each,
      and whether they were ``scored``;
    * ``latency``: when any scored prediction has ``seconds`` (a model run's time per
      answer): ``answers`` (how many have it), ``seconds_mean`` and ``seconds_median``
      over them;
    * ``speech``, ``video``, ``consistency``: with ``multimodal``, the blocks of
      :func:`empatheia.evaluation.multimodal.score_multimodal`;
    * ``missing``: ``without_reference`` and ``without_prediction`` ids (with
      ``allow_missing``), and with ``unknown_gold="skip"`` ``unknown_gold``: the ids whose
      gold emotion the label sets do not know, left out; their number is
      ``skipped_unknown_gold`` (also in the ``emotion`` report).

    A gold emotion the label sets do not know is a :class:`~empatheia.errors.DataError`
    naming the references file, the record (its id) and the field, unless
    ``unknown_gold="skip"`` (module docstring). Without ``options.labels``, a prediction
    whose ``emotion_probabilities`` name classes that AvaMERG's label sets lack comes from
    a model with its own labels, which the files do not say: a ``DataError`` asking for
    them (``--labels``), rather than scores folded onto the wrong classes.
    """
    from ..data.readers import as_label_sets

    options, files = options or ScoreOptions(), files or RecordFiles()
    labels = as_label_sets(options.labels) or LabelSets()
    alignment = align(
        validate_records(predictions, PREDICTION_FIELDS, files.predictions),
        validate_records(references, REFERENCE_FIELDS, files.references),
        options.allow_missing, files.predictions, files.references,
    )
    if options.labels is None:
        _check_default_classes([p for p, _ in alignment.pairs], labels, files.predictions)
    pairs, gold, unknown_gold = [], [], []
    for prediction, reference in alignment.pairs:
        gold_class = _gold_class(reference, labels, options.unknown_gold, files.references)
        if gold_class is None:
            unknown_gold.append(reference["id"])
        else:
            pairs.append((prediction, reference))
            gold.append(gold_class)
    if not pairs:
        raise DataError(f"no reference left to score: the gold emotion of all {len(unknown_gold)} is unknown to the "
                        f"label sets {list(labels.emotions)}", file=files.references, field="emotion")
    hypotheses = [p["text"] for p, _ in pairs]
    predicted = [emotion_class(p["emotion"], labels) for p, _ in pairs]

    report = _emotion_report(predicted, gold, [r for _, r in pairs], labels)
    report["skipped_unknown_gold"] = len(unknown_gold)
    metrics: Dict[str, Any] = {
        "count": len(pairs),
        "emotion_accuracy": report["accuracy"],
        "dist_1": text.distinct_n(hypotheses, 1),
        "dist_2": text.distinct_n(hypotheses, 2),
        **text.repeated_sentences(hypotheses),
    }
    if report.get("macro_f1") is not None:
        metrics["emotion_macro_f1"] = report["macro_f1"]
    not_applicable: Dict[str, str] = {}
    if any("chain_emotion" in p for p, _ in pairs):
        named = [p.get("chain_emotion") for p, _ in pairs]
        chain = [emotion_class(n, labels) if n else None for n in named]
        reason = _chain_not_applicable(named, chain, labels)
        metrics["chain_emotion_accuracy"] = None if reason else sum(c == g for c, g in zip(chain, gold)) / len(gold)
        if reason:
            not_applicable["chain_emotion_accuracy"] = reason
    with_roles = [(p, r) for p, r in pairs if r.get("history_roles") is not None]
    if with_roles:
        metrics.update(text.listener_echoes([r["history"] for _, r in with_roles], [r["history_roles"] for _, r in with_roles],
                                            [p["text"] for p, _ in with_roles]))
    if any("chain_of_empathy" in p for p, _ in pairs):
        metrics["chain_complete_share"] = text.chain_complete_share([p.get("chain_of_empathy") for p, _ in pairs])
    metrics.update(_text_similarity(pairs, options, files))
    metrics.update(_latency(pairs))
    metrics.update(_profile(pairs, labels, not_applicable))
    metrics.update(_media(pairs, gold, predicted, options, files, not_applicable))
    if not_applicable:
        metrics["not_applicable"] = not_applicable
    metrics["emotion"] = report
    metrics["missing"] = {"without_reference": alignment.without_reference, "without_prediction": alignment.without_prediction}
    if options.unknown_gold == "skip":
        metrics["skipped_unknown_gold"] = len(unknown_gold)
        metrics["missing"]["unknown_gold"] = unknown_gold
    return metrics


def _check_default_classes(predictions: Sequence[Mapping[str, Any]], labels: LabelSets, file: Optional[PathLike]) -> None:
    """Predictions scored under the default label sets must have been made in their
    classes: a model fine-tuned to others writes its own in ``emotion_probabilities``, and
    AvaMERG's fold would read its gold labels as other classes without a word."""
    known = set(labels.emotions)
    for prediction in predictions:
        classes = list(prediction.get("emotion_probabilities") or ())
        if not set(classes) <= known:
            raise DataError(
                f"the predictions' emotion classes {preview(classes, 8)} are not the default label sets' "
                f"{preview(list(labels.emotions), 8)} (AvaMERG's): the model that wrote them has its own labels; "
                "score with the labels file it was fine-tuned with: --labels LABELS.yaml",
                file=file, record=f"id {prediction['id']!r}", field="emotion_probabilities",
            )


def _chain_not_applicable(named: Sequence[Optional[str]], classes: Sequence[Optional[str]], labels: LabelSets) -> Optional[str]:
    """Why the chain's emotion cannot be scored against the label sets' classes (``None``
    when it can): it names none, or none that the label sets know, as when a chain that
    names ED's labels is scored under a fine-tuned model's own classes. Where some are
    known, the unknown ones are simply wrong."""
    written = [n for n in named if n]
    if not written:
        return "no prediction's Chain of Empathy names an emotion"
    if any(c in labels.emotions for c in classes):
        return None
    return (f"the Chain of Empathy names emotions the label sets do not know ({preview(list(dict.fromkeys(written)))}): "
            f"none is one of their emotions {preview(list(labels.emotions), 8)} nor in their emotion_fold "
            "(map them there to score the chain)")


def _profile(pairs, labels: LabelSets, not_applicable: Dict[str, str]) -> Dict[str, Any]:
    """Accuracy of each predicted profile attribute against the references'
    ``listener_profile``, over the pairs that have both; an attribute no reference gives
    is ``null`` in ``not_applicable``. Values compare in the label sets' spelling."""
    attributes = list(dict.fromkeys(name for p, _ in pairs for name in (p.get("profile") or {})))
    if not attributes:
        return {}

    def spelled(value: str, attribute: str) -> str:
        return normalize_label(group_value(value, attribute, labels) or "")

    out: Dict[str, Any] = {}
    for attribute in attributes:
        both = [(p["profile"][attribute], r["listener_profile"][attribute]) for p, r in pairs
                if (p.get("profile") or {}).get(attribute) and (r.get("listener_profile") or {}).get(attribute)]
        correct = sum(spelled(guess, attribute) == spelled(value, attribute) for guess, value in both)
        out[attribute] = {"accuracy": correct / len(both) if both else None, "correct": correct, "n": len(both)}
        if not both:
            not_applicable[f"profile.{attribute}.accuracy"] = (
                f"no gold values: no scored reference's listener_profile gives the avatar's {attribute}")
    return {"profile": out}


def _gold_class(reference: Mapping[str, Any], labels: LabelSets, unknown_gold: str, file: Optional[PathLike]) -> Optional[str]:
    """A reference's gold class: its ``emotion_label`` folded when it has one, else its
    ``emotion``; ``None`` for an unknown one when ``unknown_gold`` is ``"skip"``."""
    name = "emotion_label" if reference.get("emotion_label") else "emotion"
    try:
        return labels.emotion_class(reference[name])
    except UnknownEmotionError:
        if unknown_gold == "skip":
            return None
        raise DataError(
            f"unknown gold emotion {reference[name]!r}: not one of the label sets' {len(labels.emotions)} emotions "
            f"{preview(list(labels.emotions), 8)} nor in their fold; "
            "give label sets that know it (--labels), or leave such references out with --skip-unknown-gold "
            "(they are counted in skipped_unknown_gold)",
            file=file, record=f"id {reference['id']!r}", field=name,
        ) from None


def _emotion_report(predicted, gold, references, labels: LabelSets) -> Dict[str, Any]:
    """The emotion report over the label sets' classes (every gold class is one of them; a
    prediction outside them is the ``<unk>`` column), grouped by the references' age and
    gender (in the label sets' order)."""
    classes = list(labels.emotions)
    groups = {}
    for attribute in GROUP_FIELDS:
        values = [group_value(r.get(attribute), attribute, labels) for r in references]
        if any(v is not None for v in values):
            groups[attribute] = values
    report = json_ready(text.emotion_report(predicted, gold, labels=classes, groups=groups, view="exact"))
    for attribute, table in report.get("by_group", {}).items():
        order = [v for v in labels.profile.get(attribute, ()) if v in table]
        report["by_group"][attribute] = {v: table[v] for v in order + [v for v in table if v not in order]}
    return report


def _text_similarity(pairs, options: ScoreOptions, files: RecordFiles) -> Dict[str, Any]:
    """BLEU, and the similarity and polarity blocks when asked."""
    hypotheses = [p["text"] for p, _ in pairs]
    gold_texts = [r["response"] for _, r in pairs]
    bleu = text.corpus_bleu(hypotheses, gold_texts)
    out: Dict[str, Any] = {"bleu": {k: v for k, v in bleu.items() if k.startswith("bleu_") or k == "brevity_penalty"}}
    if options.similarity:
        out["similarity"] = json_ready(text.token_match_score(hypotheses, gold_texts)["mean"])
    if options.polarity:
        without = [r["id"] for _, r in pairs if not isinstance(r.get("history"), list)]
        if without:
            raise DataError(
                f"the polarity metrics need each reference's dialogue 'history' (a list of utterances); "
                f"{len(without)} lack it: {preview(without)}", file=files.references, field="history",
            )
        out["polarity"] = json_ready(text.polarity_scores([r["history"] for _, r in pairs], hypotheses)["mean"])
    return out


def _latency(pairs) -> Dict[str, Any]:
    """Mean and median seconds per answer over the predictions that were timed; nothing
    for files written before predictions carried ``seconds``."""
    seconds = [float(p["seconds"]) for p, _ in pairs if p.get("seconds") is not None]
    if not seconds:
        return {}
    return {"latency": {"answers": len(seconds), "seconds_mean": statistics.fmean(seconds),
                        "seconds_median": statistics.median(seconds)}}


def _media(pairs, gold, predicted, options: ScoreOptions, files: RecordFiles,
           not_applicable: Dict[str, str]) -> Dict[str, Any]:
    """How many predictions carry media, and with ``multimodal`` the blocks scoring it (the
    FER metrics that cannot apply named in ``not_applicable``)."""
    with_audio = sum(bool(p.get("audio")) for p, _ in pairs)
    with_video = sum(bool(p.get("video")) for p, _ in pairs)
    out: Dict[str, Any] = {}
    if with_audio or with_video:
        out["media"] = {"audio": with_audio, "video": with_video, "scored": bool(options.multimodal)}
    if options.multimodal:
        from .multimodal import score_multimodal

        def folder(given, file):
            return given if given is not None or file is None else Path(file).parent

        # FER reads AvaMERG's classes, and ED's labels fold onto them by design; a model's own
        # class ('calm') is not read through that fold (as happy), it is left out.
        faces_gold = [g if g in EMOTION_LABELS or g in ED_EMOTIONS else None for g in gold]
        blocks = score_multimodal(
            [p for p, _ in pairs], faces_gold, predicted, base_dir=folder(files.predictions_media, files.predictions),
            predictions_file=files.predictions, models=options.multimodal_models, progress=options.progress,
            references=[r for _, r in pairs], references_dir=folder(files.references_media, files.references),
            references_file=files.references,
        )
        out.update(json_ready(blocks))
        not_applicable.update(_fer_not_applicable(out, gold, predicted))
    return out


def _fer_not_applicable(blocks: Mapping[str, Any], gold: Sequence[str], predicted: Sequence[str]) -> Dict[str, str]:
    """Why the FER metrics of the multimodal blocks are ``null`` where no clip has an
    emotion FER reads (a model's own classes)."""
    from .fer import FER_TO_EMPATHEIA

    readable = preview(sorted(FER_TO_EMPATHEIA.values()), 8)
    video, consistency = blocks.get("video") or {}, blocks.get("consistency") or {}
    out = {}
    if video.get("count") and not video.get("facial_emotion_scored"):
        out["video.facial_emotion_accuracy"] = (
            f"no clip's gold emotion is one FER reads ({readable}, or an EmpatheticDialogues label): "
            f"the gold emotions are {preview(sorted(set(gold)), 8)}")
    if "text_video_count" in consistency and not consistency["text_video_count"]:
        out["consistency.text_video_emotion_agreement"] = (
            f"no clip's predicted emotion is one FER reads ({readable}): the predicted emotions are "
            f"{preview(sorted(set(predicted)), 8)}")
    return out


def score_files(
    predictions_path: PathLike,
    references_path: PathLike,
    options: Optional[ScoreOptions] = None,
    keep_ids: Optional[Iterable[str]] = None,
) -> Dict[str, Any]:
    """:func:`score` on two files, with their paths under ``sources``. ``keep_ids`` scores
    only the predictions with those ids (a run's current selection); how many others the
    file holds is under ``sources.predictions_outside_selection``. Media paths are relative
    to each file's folder."""
    predictions = read_predictions(predictions_path)
    outside = 0
    if keep_ids is not None:
        keep = set(keep_ids)
        outside = sum(p["id"] not in keep for p in predictions)
        predictions = [p for p in predictions if p["id"] in keep]
    references = read_references(references_path)
    metrics = score(predictions, references, options, RecordFiles(predictions_path, references_path))
    metrics["sources"] = {"predictions": str(predictions_path), "references": str(references_path)}
    if keep_ids is not None:
        metrics["sources"]["predictions_outside_selection"] = outside
    return metrics


def write_metrics(metrics: Mapping[str, Any], out_dir: PathLike) -> Path:
    """``DIR/metrics.json`` (a NaN is written as ``null``, never as invalid JSON)."""
    return write_json(Path(out_dir) / METRICS_NAME, json_ready(metrics))
