"""Running a model over a dataset, resumably (``empatheia eval --checkpoint/--preset``).

:func:`run_model` answers the dialogues batch by batch and appends each batch's
predictions to ``DIR/predictions.jsonl`` (flushed and synced), so a run that is stopped
resumes where it was: ids already in the file are skipped. ``DIR/run.json`` records the
model, data and generation settings; resuming with different ones is refused, so
predictions of two models never mix in one file. :func:`evaluate_dataset` reads the
dataset, runs the model and scores the run (:func:`~empatheia.evaluation.scoring.score`).
One run at a time writes a folder (:func:`~empatheia.io.folder_lock`): a second one
started on it meanwhile stops at once with a
:class:`~empatheia.io.FolderLockedError`, leaving the folder to the first, so it
stays resumable.

With ``speak`` / ``animate`` (:class:`RunOptions`) the model also speaks / animates each
response; its audio and video are written to ``DIR/media/<id>.wav`` and ``.mp4``
(:func:`media_stem` makes the id a safe file name; the MP4 carries the speech too) before
its prediction line, which records them relative to ``DIR`` (``"audio":
"media/<id>.wav"``) with the ``avatar`` key. The line also records the style vectors the
model requested (``speech_style``, and ``video_style`` when animating) and those the
model's own generators measure on the files just written (``speech_style_realised``,
``video_style_realised``; :func:`response_styles`), for the style agreement of
``--multimodal``. Animating implies speaking. Both flags are part of ``run.json``.

Each line also records ``seconds``: the time its batch's ``model.respond`` took (speaking
and animating included, as they happen inside it), divided by the batch's size; the
scoring reports their mean and median (``latency``). Comparable only between runs with
the same batch size, device and settings.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..decoding import GREEDY_RECORD, Decoding
from ..data.readers import as_label_sets
from ..errors import DataError
from ..io import atomic_path, folder_lock, json_line, write_json, write_jsonl
from ..labels import LabelSets
from .records import (
    PREDICTIONS_NAME,
    REFERENCES_NAME,
    Record,
    prediction_record,
    read_predictions,
    references_from_dialogues,
    style_values,
)
from .scoring import ScoreOptions, score_files, write_metrics

if TYPE_CHECKING:
    from ..dialogue import Dialogue
    from ..modeling import Empatheia

PathLike = Union[str, Path]

RUN_NAME = "run.json"
MEDIA_DIR = "media"
"""Subfolder of a model run's output that holds the responses' audio and video."""
RUN_DEFAULTS: Dict[str, Any] = {"speak": False, "animate": False, "decoding": GREEDY_RECORD,
                                "chain_emotion_prior_weight": 0.0}
"""Settings a ``run.json`` written before they existed is read as having."""


class RunMismatchError(ValueError):
    """An output folder holds predictions of another model, dataset or setting."""


@dataclass
class RunOptions:
    """How :func:`run_model` answers a dataset."""

    batch_size: int = 8
    """Dialogues per ``model.respond`` call (and per appended, synced block of lines)."""
    max_new_tokens: Optional[int] = None
    speak: bool = False
    """Also speak each response into ``DIR/media``."""
    animate: bool = False
    """Also speak and animate each response (implies ``speak``)."""
    progress: bool = True
    decoding: Decoding = field(default_factory=Decoding)
    """How the answers are written (greedy with the config's repetition control by
    default). Seeded sampling gives the same answers again only in the same batches: a
    run resumed at another example, or with another ``batch_size``, draws differently."""
    info: Mapping[str, Any] = field(default_factory=dict)
    """What identifies the run besides the settings above (e.g. the model and the data);
    checked against ``run.json`` (:func:`check_run_info`)."""

    def run_info(self, language_model: Any = None, style_disentangler: Any = None) -> Dict[str, Any]:
        """What ``run.json`` records: :attr:`info` with the generation settings, the
        decoding's with ``language_model``'s (the model config's section) defaults filled
        in, and ``style_disentangler``'s (its section) weight of the chain's emotion."""
        decoding = self.decoding.resolved(language_model) if language_model is not None else self.decoding
        record = decoding.record()
        if language_model is not None and record.get("generic_reply_penalty"):
            # How many of the reply's tokens the penalty reaches is the config's: a preset
            # whose count changes must not resume a run written with the old one.
            record["generic_reply_tokens"] = int(language_model.generic_reply_tokens)
            if getattr(language_model, "generic_reply_context", "none") != "none":
                record["generic_reply_context"] = language_model.generic_reply_context
        if language_model is not None:
            # The config's ways of writing an echoing answer again, its block on the
            # listener's words and the reply's least length change answers too;
            # recorded only when on, so runs written before they existed still resume.
            if getattr(language_model, "listener_echo_restarts", 0):
                record["listener_echo_restarts"] = int(language_model.listener_echo_restarts)
            if getattr(language_model, "listener_echo_reanswer", False):
                record["listener_echo_reanswer"] = True
            for name in ("no_repeat_listener_ngram_size", "min_reply_tokens"):
                if getattr(language_model, name, 0):
                    record[name] = int(getattr(language_model, name))
        info = dict(self.info, max_new_tokens=self.max_new_tokens, speak=bool(self.speak or self.animate),
                    animate=bool(self.animate), decoding=record)
        if style_disentangler is not None:
            # It decides the emotion, voice and face of every answer, as the decoding
            # decides its words: a run resumed under another weight would mix the two.
            info["chain_emotion_prior_weight"] = float(style_disentangler.chain_emotion_prior_weight)
        return info


def model_run_info(options: RunOptions, model: Any) -> Dict[str, Any]:
    """:meth:`RunOptions.run_info` with ``model``'s config sections; a system whose config
    has no Style Disentangler section (a variant without one) records no style weight."""
    return options.run_info(model.config.language_model, getattr(model.config, "style_disentangler", None))


# ====================================================================== media
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
    stem = media_stem(prediction_id)
    fields: Dict[str, str] = {}
    audio, video = getattr(response, "audio", None), getattr(response, "video", None)
    if audio is not None:
        with atomic_path(folder / f"{stem}.wav") as temporary:
            write_wav(temporary, audio.samples, audio.sample_rate)
        fields["audio"] = f"{MEDIA_DIR}/{stem}.wav"
    if video is not None:
        samples, rate = (audio.samples, audio.sample_rate) if audio is not None else (None, None)
        with atomic_path(folder / f"{stem}.mp4") as temporary:
            write_mp4(temporary, video.frames, video.fps, samples, rate)
        fields["video"] = f"{MEDIA_DIR}/{stem}.mp4"
    if getattr(response, "avatar", None):
        fields["avatar"] = str(response.avatar)
    return fields


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


# ====================================================================== resuming
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


def _with_defaults(info: Mapping[str, Any]) -> Dict[str, Any]:
    """``info`` with :data:`RUN_DEFAULTS` for what it lacks, within its decoding record too."""
    out = dict(RUN_DEFAULTS, **info)
    if isinstance(out["decoding"], dict):
        decoding = dict(GREEDY_RECORD, **out["decoding"])
        if decoding["generic_reply_penalty"]:
            decoding.setdefault("generic_reply_tokens", 4)  # the only count before it was recorded
        if decoding["do_sample"]:
            decoding.setdefault("sample_chain", True)  # sampling drew the chain too before it could be left out
        out["decoding"] = decoding
    return out


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
        # Settings added since either side was written read as their defaults on both.
        previous = _with_defaults(json.loads(run_path.read_text(encoding="utf-8")))
        current = _with_defaults(info)
        changed = {k: (previous.get(k), current.get(k)) for k in set(previous) | set(current)
                   if previous.get(k) != current.get(k)}
        if changed:
            details = "; ".join(f"{k}: was {old!r}, now {new!r}" for k, (old, new) in sorted(changed.items()))
            raise RunMismatchError(
                f"{out_dir} holds predictions of another run ({details}); resume with the same settings, or use another --out"
            )
    write_json(run_path, info)


# ====================================================================== running
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


def run_model(
    model: "Empatheia",
    dialogues: Sequence["Dialogue"],
    out_dir: PathLike,
    options: Optional[RunOptions] = None,
    labels: Optional[Union[LabelSets, str, Path]] = None,
    data_file: Optional[PathLike] = None,
) -> RunSummary:
    """Answer ``dialogues`` with ``model`` into ``DIR/predictions.jsonl`` (resumable) and
    write their references to ``DIR/references.jsonl``.

    Batches of ``options.batch_size`` go through ``model.respond``; each batch's lines are
    appended and flushed (and synced) before the next starts, so a stopped run loses at
    most the batch in flight. Ids already in the file are skipped. The run's settings
    (:meth:`RunOptions.run_info`) are checked against the folder's ``run.json``
    (:func:`check_run_info`). ``labels`` (label sets or a labels YAML path) fold the gold
    emotions (default: the model's label sets, with the fold it was fine-tuned with);
    ``data_file`` names the dataset in errors. The folder is locked for the
    run (:func:`~empatheia.io.folder_lock`): a second run on it meanwhile is a
    :class:`~empatheia.io.FolderLockedError`.

    ``speak`` / ``animate`` (animating implies speaking) also render each response; its
    files are written (:func:`write_response_media`) before its line, whose ``audio``,
    ``video`` and ``avatar`` name them, and whose ``speech_style``/``video_style`` and
    ``*_realised`` give the requested styles and those the model's generators measure on
    the written files (:func:`response_styles`, one ``style_features`` call per generator
    and batch). Every line's ``seconds`` is its batch's ``respond`` time over the batch's
    size.
    """
    from tqdm.auto import tqdm

    options = options or RunOptions()
    if options.batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {options.batch_size}")
    out_dir = Path(out_dir)
    # Two runs appending to one predictions file would both answer the ids neither had
    # yet and write them twice; the second run is refused before it reads anything.
    with folder_lock(out_dir):
        labels = as_label_sets(labels) or model.label_sets()
        references = references_from_dialogues(dialogues, labels, file=data_file)
        speak = bool(options.speak or options.animate)
        check_run_info(out_dir, model_run_info(options, model))
        references_path = write_jsonl(out_dir / REFERENCES_NAME, references)
        predictions_path = out_dir / PREDICTIONS_NAME
        done = {p["id"] for p in recover_predictions(predictions_path)}
        todo = [d for d in dialogues if d.id not in done]
        resumed = len(dialogues) - len(todo)
        bar = tqdm(total=len(dialogues), initial=resumed, desc="responding", unit="dialogue", disable=not options.progress)
        try:
            with open(predictions_path, "a", encoding="utf-8") as handle:
                for start in range(0, len(todo), options.batch_size):
                    batch = list(todo[start : start + options.batch_size])
                    # Only the answering is timed: writing the files and measuring their styles
                    # is the evaluation's work, which a user of the system never waits for.
                    began = time.perf_counter()
                    responses = model.respond(batch, max_new_tokens=options.max_new_tokens, speak=speak,
                                              animate=options.animate, **options.decoding.kwargs())
                    seconds = (time.perf_counter() - began) / len(batch)
                    media: List[Optional[Dict[str, str]]] = [None] * len(batch)
                    styles: List[Optional[Dict[str, List[float]]]] = [None] * len(batch)
                    if speak:
                        media = [write_response_media(out_dir, d.id, r) for d, r in zip(batch, responses)]
                        styles = list(response_styles(model.generators(), out_dir, responses, media))
                    handle.write("".join(
                        json_line(prediction_record(dialogue, response, fields, style, seconds))
                        for dialogue, response, fields, style in zip(batch, responses, media, styles)
                    ))
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
    run: Optional[RunOptions] = None,
    scoring: Optional[ScoreOptions] = None,
    format: str = "auto",
    media_root: Optional[PathLike] = None,
    limit: Optional[int] = None,
) -> Tuple[Dict[str, Any], RunSummary]:
    """Read a dataset (``format``, ``media_root``: as for
    :func:`~empatheia.data.readers.read_dataset`), answer its first ``limit`` examples (all
    by default) with :func:`run_model` (resumable), score them (:func:`score_files`) and
    write ``DIR/metrics.json``.

    Only this selection is scored: predictions an earlier, larger run left in the folder
    are kept in the file and counted under ``sources.predictions_outside_selection``.
    ``scoring.labels`` read and fold the dataset's labels (default: the model's label
    sets, so a model fine-tuned to its own labels needs no labels file).
    """
    from ..data.readers import read_dataset

    run, scoring = run or RunOptions(), scoring or ScoreOptions()
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    scoring = replace(scoring, labels=as_label_sets(scoring.labels) or model.label_sets())
    corpus = read_dataset(data, format=format, media_root=media_root, labels=scoring.labels)
    dialogues = list(corpus.dialogues)[:limit] if limit is not None else list(corpus.dialogues)
    if not dialogues:
        raise DataError("no examples to evaluate", file=data)
    # One lock from the first answer to metrics.json, so the metrics score the file this
    # run left (the lock is shared with run_model's own).
    with folder_lock(out_dir):
        summary = run_model(model, dialogues, out_dir, run, labels=scoring.labels, data_file=data)
        metrics = score_files(summary.predictions_path, summary.references_path, scoring, keep_ids=[d.id for d in dialogues])
        info = model_run_info(run, model)
        metrics["run"] = {"selected": summary.selected, "resumed": summary.resumed, "generated": summary.generated,
                          **dict(run.info), "speak": info["speak"], "animate": info["animate"],
                          "decoding": info["decoding"],
                          "chain_emotion_prior_weight": info.get("chain_emotion_prior_weight", 0.0)}
        write_metrics(metrics, out_dir)
    return metrics, summary
