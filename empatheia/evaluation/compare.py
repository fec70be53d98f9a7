"""Comparing systems on one dataset (``empatheia compare``).

``empatheia compare --systems empatheia pipeline e3rg (--preset P | --checkpoint DIR)
--data FILE --out DIR`` (its command line is in :mod:`empatheia.evaluation.cli`) runs each
system in turn exactly as ``empatheia eval --system S --out DIR/S`` would (the same
``run.json``, so a rerun, of either command, resumes each folder; E3RG's memory is
``DIR/e3rg/e3rg_memory`` unless ``--memory`` names one). :func:`compare_systems` loads one
system at a time and frees it before the next, so the largest of them, not their sum, has
to fit.

Besides its run, each system's predictions are scored once more under the *fine* emotion
labels (``DIR/S/fine_labels/metrics.json``): the Chain of Empathy names a dataset label
(one of ED's 32), which the run's own scoring folds onto the 7 classes. The fine labels
are ``--fine-labels`` (e.g. ``configs/labels/ed32.yaml``), or else the labels the
references name, compared as written (no folding): on EmpatheticDialogues the same
numbers as ed32.yaml.

Then ``DIR/comparison.json`` (every value as it is in the system's ``metrics.json``),
``DIR/comparison.md`` (one table, a row per system; "–" where a run lacks a metric, with
the reason under the table) and ``DIR/comparison.html`` (the table and one SVG bar chart
per metric). :data:`COLUMNS` maps each column to its ``metrics.json`` key: the one place
to change when a key moves.
"""

from __future__ import annotations

import gc
import html
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..errors import DataError
from ..io import write_json, write_text_atomic
from ..labels import LabelSets, normalize_label
from .model_runs import RunMismatchError
from .records import PREDICTIONS_NAME, REFERENCES_NAME, read_references
from .report import bar_chart_svg, html_document, html_table, markdown_table
from .scoring import METRICS_NAME, ScoreOptions, score_files, write_metrics

if TYPE_CHECKING:
    from .model_runs import RunSummary

PathLike = Union[str, Path]

COMPARISON_JSON = "comparison.json"
COMPARISON_MD = "comparison.md"
COMPARISON_HTML = "comparison.html"
FINE_DIR = "fine_labels"
"""Subfolder of a system's folder holding its scoring under the fine labels."""
MISSING = "–"


@dataclass(frozen=True)
class Column:
    """One column of the comparison and where its value is in ``metrics.json``."""

    name: str
    """The column's key in ``comparison.json``."""
    header: str
    key: str
    """Dotted path in ``metrics.json`` (``"bleu.bleu_4"``: ``metrics["bleu"]["bleu_4"]``)."""
    kind: str
    """How it is printed and charted: ``count``, ``percent`` (a share), ``ratio`` (a
    fraction printed as one: Dist-n, BLEU, WER), ``number`` or ``seconds``."""
    better: Optional[str]
    """``"higher"`` or ``"lower"``; ``None`` for what is no metric (the example count)."""
    count: str = "count"
    """Dotted path of how many answers or clips the value is over (under each bar)."""
    source: str = "run"
    """``"run"``: ``DIR/S/metrics.json``; ``"fine"``: ``DIR/S/fine_labels/metrics.json``."""
    needs: Optional[str] = None
    """The rendering the metric scores (``"speak"`` or ``"animate"``), with ``--multimodal``."""
    absent: str = "not in its metrics.json"
    """Why the value is missing when the run had all it needs."""


COLUMNS: Tuple[Column, ...] = (
    Column("examples", "Examples", "count", "count", None),
    Column("fine_emotion_accuracy", "Chain emotion acc. (fine labels)", "chain_emotion_accuracy", "percent", "higher",
           source="fine", absent="its predictions name no chain emotion"),
    Column("chain_emotion_accuracy", "Chain emotion acc. (7 classes)", "chain_emotion_accuracy", "percent", "higher",
           absent="its predictions name no chain emotion"),
    # The emotion that styles the voice and the face: Empatheia's Style Disentangler, the
    # pipeline's written emotion, E3RG's vote.
    Column("emotion_accuracy", "Voice/face emotion acc. (7 classes)", "emotion_accuracy", "percent", "higher"),
    Column("dist_1", "Dist-1", "dist_1", "ratio", "higher"),
    Column("dist_2", "Dist-2", "dist_2", "ratio", "higher"),
    Column("bleu_1", "BLEU-1", "bleu.bleu_1", "ratio", "higher"),
    Column("bleu_4", "BLEU-4", "bleu.bleu_4", "ratio", "higher"),
    Column("speech_wer", "Speech WER", "speech.wer_mean", "ratio", "lower", count="speech.count", needs="speak",
           absent="no prediction has audio"),
    Column("lip_sync_in_sync", "Lip sync within ±1 frame", "video.lip_sync_in_sync_share", "percent", "higher",
           count="video.lip_sync_count", needs="animate", absent="no clip long enough for lip sync"),
    Column("lip_sync_confidence", "Lip-sync confidence", "video.lip_sync_confidence_mean", "number", "higher",
           count="video.lip_sync_count", needs="animate", absent="no clip long enough for lip sync"),
    Column("text_video_emotion", "Text–video emotion agreement", "consistency.text_video_emotion_agreement", "percent",
           "higher", count="consistency.text_video_count", needs="animate", absent="no clip's text emotion is one FER reads"),
    Column("speech_style_cosine", "Speech style cosine", "speech.style_cosine_mean", "number", "higher",
           count="speech.style_count", needs="speak", absent="no prediction carries both speech style vectors"),
    Column("video_style_cosine", "Video style cosine", "video.style_cosine_mean", "number", "higher",
           count="video.style_count", needs="animate", absent="no prediction carries both video style vectors"),
    Column("seconds_per_answer", "Seconds per answer", "latency.seconds_mean", "seconds", "lower", count="latency.answers",
           absent="its predictions were written before answers were timed"),
)


# ====================================================================== values
def metric_value(metrics: Mapping[str, Any], key: str) -> Optional[float]:
    """The number at a dotted path of ``metrics``, or ``None`` when absent or not a number."""
    value: Any = metrics
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


def why_missing(column: Column, metrics: Mapping[str, Any], multimodal: bool) -> str:
    """Why a run's ``metrics.json`` lacks a column's value, in terms of what to add."""
    run = metrics.get("run") or {}
    if column.needs == "speak" and not run.get("speak"):
        return "needs --speak (or --animate) and --multimodal"
    if column.needs == "animate" and not run.get("animate"):
        return "needs --animate and --multimodal"
    if column.needs and not multimodal:
        return "needs --multimodal"
    return column.absent


def reference_labels(references: Sequence[Mapping[str, Any]]) -> LabelSets:
    """The label sets of the labels the references name (their raw ``emotion_label``, else
    ``emotion``), each its own class: a prediction matches only the label as written."""
    names = sorted({normalize_label(r.get("emotion_label") or r["emotion"]) for r in references})
    return LabelSets(emotions=names, profile={}, emotion_fold={}, emotion_fold_replace=True)


def score_fine_labels(folder: PathLike, labels: Optional[Union[LabelSets, str, Path]] = None,
                      unknown_gold: str = "error") -> Dict[str, Any]:
    """Score a run's predictions under the fine ``labels`` (label sets or a labels YAML
    path; default: :func:`reference_labels`) into ``folder/fine_labels/metrics.json``, over the run's
    selection (its ``references.jsonl``); returns the metrics. ``unknown_gold`` is
    :attr:`~empatheia.evaluation.scoring.ScoreOptions.unknown_gold`: a gold label the fine
    labels do not know is an error, or skipped and counted."""
    from ..data.readers import as_label_sets

    folder = Path(folder)
    labels = as_label_sets(labels)
    references = read_references(folder / REFERENCES_NAME)
    metrics = score_files(folder / PREDICTIONS_NAME, folder / REFERENCES_NAME,
                          ScoreOptions(labels=labels or reference_labels(references), unknown_gold=unknown_gold),
                          keep_ids=[r["id"] for r in references])
    write_metrics(metrics, folder / FINE_DIR)
    return metrics


def system_row(system: str, metrics: Mapping[str, Any], fine: Mapping[str, Any], multimodal: bool,
               folder: Optional[str] = None) -> Dict[str, Any]:
    """A system's row of ``comparison.json``: per column its ``value`` (``None`` when
    missing), ``count`` and, when missing, ``missing`` (why: the metrics' own reason when
    the metric cannot apply, see ``not_applicable`` in
    :func:`~empatheia.evaluation.scoring.score`)."""
    folder = folder or system
    values: Dict[str, Optional[float]] = {}
    counts: Dict[str, Optional[float]] = {}
    missing: Dict[str, str] = {}
    for column in COLUMNS:
        source = fine if column.source == "fine" else metrics
        values[column.name] = metric_value(source, column.key)
        counts[column.name] = metric_value(source, column.count)
        if values[column.name] is None:
            reason = (source.get("not_applicable") or {}).get(column.key)
            missing[column.name] = reason or why_missing(column, metrics, multimodal)
    run = metrics.get("run") or {}
    return {
        "system": system,
        "folder": folder,
        "metrics": f"{folder}/{METRICS_NAME}",
        "fine_metrics": f"{folder}/{FINE_DIR}/{METRICS_NAME}",
        "run": {k: run.get(k) for k in ("selected", "resumed", "generated")},
        "values": values,
        "counts": counts,
        "missing": missing,
    }


# ====================================================================== rendering
def _formatted(value: Optional[float], kind: str) -> str:
    if value is None:
        return MISSING
    if kind == "count":
        return str(int(value)) if float(value).is_integer() else str(value)
    if kind == "percent":
        return f"{value:.1%}"
    return f"{value:.3f}"


def _header(column: Column) -> str:
    arrow = {"higher": " ↑", "lower": " ↓"}.get(column.better or "", "")
    return column.header + arrow


def table(comparison: Mapping[str, Any]) -> Tuple[List[str], List[List[str]]]:
    """The comparison table: header and a row of formatted cells per system."""
    header = ["System"] + [_header(c) for c in COLUMNS]
    rows = [[row["system"]] + [_formatted(row["values"][c.name], c.kind) for c in COLUMNS] for row in comparison["rows"]]
    return header, rows


def notes(comparison: Mapping[str, Any]) -> List[str]:
    """The lines under the table: why each "–", grouped by reason, and how to read it."""
    systems = [row["system"] for row in comparison["rows"]]
    reasons: Dict[Tuple[str, Tuple[str, ...]], List[str]] = {}
    for column in COLUMNS:
        by_reason: Dict[str, List[str]] = {}
        for row in comparison["rows"]:
            if column.name in row["missing"]:
                by_reason.setdefault(row["missing"][column.name], []).append(row["system"])
        for reason, which in by_reason.items():
            reasons.setdefault((reason, tuple(which)), []).append(column.header)
    lines = []
    for (reason, which), headers in reasons.items():
        whom = "all systems" if list(which) == systems else ", ".join(which)
        lines.append(f"{MISSING} {', '.join(headers)} ({whom}): {reason}.")
    lines.append(f"Fine labels: {comparison['fine_labels']}.")
    lines.append("↑ higher is better, ↓ lower. Accuracies, agreements and the lip-sync share are percentages; Dist-n, "
                 "BLEU and WER fractions (the paper prints them x100); style cosines are in [-1, 1]; seconds per answer "
                 "is the mean over answers of the respond batch's time over its size (medians in each metrics.json).")
    lines.append("Each system's run, metrics.json and report are in its own folder.")
    return lines


def _nice_maximum(values: Sequence[float]) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten at or above the largest value."""
    top = max([v for v in values if v is not None and v > 0], default=0.0)
    if top <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(top))
    return next(power * step for step in (1, 2, 2.5, 5, 10) if power * step >= top * (1 - 1e-12))


def charts(comparison: Mapping[str, Any]) -> List[Tuple[Column, str]]:
    """One bar chart per metric that at least one system has: ``(column, svg)``."""
    out = []
    for column in COLUMNS:
        if column.better is None:
            continue
        bars = [(row["system"], row["values"][column.name], int(row["counts"][column.name] or 0))
                for row in comparison["rows"]]
        present = [value for _, value, _ in bars if value is not None]
        if not present:
            continue
        # A share above 1 cannot happen, but an axis that hid it would mislead.
        fraction_axis = column.kind == "percent" and all(0 <= v <= 1 for v in present)
        svg = bar_chart_svg(
            bars, f"{column.header} ({column.better} is better)",
            value_title={"percent": "share", "seconds": "seconds per answer"}.get(column.kind, column.header),
            maximum=None if fraction_axis else _nice_maximum(present),
        )
        out.append((column, svg))
    return out


def render_markdown(comparison: Mapping[str, Any]) -> str:
    header, rows = table(comparison)
    lines = ["# System comparison", "", _settings_line(comparison), ""]
    lines += markdown_table(header, rows)
    lines.append("")
    lines += [f"{line}  " for line in notes(comparison)]
    return "\n".join(lines).rstrip() + "\n"


def render_html(comparison: Mapping[str, Any]) -> str:
    header, rows = table(comparison)
    body = ["<h1>System comparison</h1>", f"<p>{html.escape(_settings_line(comparison))}</p>", html_table(header, rows)]
    body += [f"<p class='note'>{html.escape(line)}</p>" for line in notes(comparison)]
    drawn = charts(comparison)
    if drawn:
        body.append("<h2>Per metric</h2>")
        body += [f"<figure>{svg}</figure>" for _, svg in drawn]
    return html_document("System comparison", body)


def _settings_line(comparison: Mapping[str, Any]) -> str:
    settings = comparison["settings"]
    rendering = "animated" if settings["animate"] else "spoken" if settings["speak"] else "text only"
    return (f"{len(comparison['rows'])} system(s) on {settings['data']} ({settings['model']}; {rendering}; "
            f"{'multimodal metrics' if settings['multimodal'] else 'no multimodal metrics'}).")


def write_comparison(comparison: Mapping[str, Any], out_dir: PathLike) -> Dict[str, Path]:
    """``comparison.json``, ``.md`` and ``.html`` in ``out_dir``; the paths by file name."""
    out_dir = Path(out_dir)
    return {
        COMPARISON_JSON: write_json(out_dir / COMPARISON_JSON, comparison),
        COMPARISON_MD: write_text_atomic(out_dir / COMPARISON_MD, render_markdown(comparison)),
        COMPARISON_HTML: write_text_atomic(out_dir / COMPARISON_HTML, render_html(comparison)),
    }


# ====================================================================== running
RunSystem = Callable[[str, Path], Tuple[Mapping[str, Any], "RunSummary"]]
"""Runs one system into its folder as ``empatheia eval`` does (loading it, answering,
scoring, writing the report) and returns ``(metrics, summary)``; holds no reference to the
system afterwards."""


class SystemRunError(RuntimeError):
    """A system of the comparison could not be run; the ones before it are complete."""

    def __init__(self, system: str, reason: str, finished: Sequence[str], out_dir: PathLike):
        kept = f"; the finished ones ({', '.join(finished)}) keep their folders in {out_dir}" if finished else ""
        super().__init__(f"system {system!r} failed: {reason}{kept} (rerun the same command to resume)")
        self.system = system
        self.finished = list(finished)


@dataclass(frozen=True)
class SystemEntry:
    """One row of a comparison: ``SYSTEM[:TAG][=DIR]`` on the command line."""

    label: str
    """The row's name (``meria:wo_pdr``); its folder is :attr:`folder`."""
    system: str
    """One of :data:`~empatheia.variants.SYSTEMS`."""
    checkpoint: Optional[Path] = None
    """This row's trained model (MERIA's, early fusion's, an ablation's) instead of the
    comparison's ``--checkpoint``/``--preset``."""

    @property
    def folder(self) -> str:
        return self.label.replace(":", "-")


def check_systems(names: Sequence[str]) -> List[SystemEntry]:
    """``--systems`` checked: each ``SYSTEM``, ``SYSTEM:TAG`` (a second row of one system,
    such as an ablation) or either with ``=DIR`` (that row's own checkpoint), each
    ``SYSTEM`` one of :data:`~empatheia.variants.SYSTEMS` and each row named once
    (``ValueError`` listing the known ones otherwise)."""
    from ..variants import SYSTEMS

    entries = []
    for name in names:
        label, _, checkpoint = name.partition("=")
        system, _, tag = label.partition(":")
        if system not in SYSTEMS or (":" in label and not tag):
            raise ValueError(f"unknown system {system!r} in {name!r}; known: {', '.join(SYSTEMS)} "
                             "(a row is SYSTEM, SYSTEM:TAG, and either with =CHECKPOINT_DIR)")
        entries.append(SystemEntry(label, system, Path(checkpoint) if checkpoint else None))
    labels = [entry.label for entry in entries]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ValueError(f"{', '.join(map(repr, repeated))} named more than once (tell rows of one system apart "
                         "with SYSTEM:TAG)")
    return entries


def _free_memory() -> None:
    # The finished system is unreferenced by now; collecting returns its memory (and the
    # accelerator's cache) before the next one loads, so two never have to fit at once.
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def compare_systems(
    systems: Sequence[Union[str, SystemEntry]],
    run_system: RunSystem,
    out_dir: PathLike,
    settings: Mapping[str, Any],
    fine_labels: Optional[Union[LabelSets, str, Path]] = None,
    fine_labels_name: Optional[str] = None,
    unknown_gold: str = "error",
) -> Tuple[Dict[str, Any], Dict[str, Path]]:
    """Run each of ``systems`` (names or :class:`SystemEntry` rows) in turn into
    ``out_dir/<folder>`` with ``run_system(entry, folder)``,
    freeing each before the next, score each under the fine labels
    (:func:`score_fine_labels`) and write the comparison files (:func:`write_comparison`).

    ``settings`` describe the runs (``data``, ``model``, ``speak``, ``animate``,
    ``multimodal``, ...) in ``comparison.json`` and its page; ``fine_labels_name`` names
    ``fine_labels`` there, and ``unknown_gold`` says what their scoring does with a gold
    label they do not know (:func:`score_fine_labels`). The first system that fails stops the comparison with a
    :class:`SystemRunError` naming it (a system that cannot be built raises
    ``SystemExit``, as :func:`~empatheia.loading.load_system` does); the finished ones keep
    their folders. Returns the comparison and the written paths by file name."""
    out_dir = Path(out_dir)
    rows: List[Dict[str, Any]] = []
    for entry in systems:
        if isinstance(entry, str):
            entry = SystemEntry(entry, entry)
        system = entry.label
        folder = out_dir / entry.folder
        failure: Optional[str] = None
        try:
            metrics, _ = run_system(entry, folder)
            fine = score_fine_labels(folder, fine_labels, unknown_gold)
        except SystemExit as error:
            failure = str(error.code).removeprefix("error: ")
        except (DataError, RunMismatchError, ImportError, OSError, ValueError, KeyError, RuntimeError) as error:
            failure = str(error) or type(error).__name__
        finally:
            _free_memory()
        if failure is not None:
            raise SystemRunError(system, failure, [row["system"] for row in rows], out_dir)
        row = system_row(system, metrics, fine, bool(settings.get("multimodal")), entry.folder)
        if entry.checkpoint is not None:
            row["checkpoint"] = str(entry.checkpoint)
        rows.append(row)
    comparison = {
        "settings": dict(settings),
        "fine_labels": fine_labels_name or "the labels the references name, each its own class (no folding)",
        "columns": [{"name": c.name, "header": c.header, "metrics_key": c.key, "count_key": c.count,
                     "file": f"{FINE_DIR}/{METRICS_NAME}" if c.source == "fine" else METRICS_NAME, "better": c.better}
                    for c in COLUMNS],
        "rows": rows,
    }
    return comparison, write_comparison(comparison, out_dir)
