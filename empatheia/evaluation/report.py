"""The evaluation report: ``report.md`` and ``report.html`` with SVG plots.

:func:`write_report` turns the metrics of :func:`~empatheia.evaluation.scoring.score` into

* ``confusion_matrix.svg``: gold emotion (rows) by predicted emotion (columns), each cell
  the count, shaded by its share of the row (the recall of the gold class);
* ``per_emotion_accuracy.svg``: accuracy per gold emotion (Figure 6, left);
* ``accuracy_by_age.svg``, ``accuracy_by_gender.svg``: accuracy per value of the user's
  (speaker's) age and gender, when the references give them (Figure 6, middle and right);
* ``report.md``, which includes those files by relative link, and ``report.html``, which
  embeds the same SVGs inline (one self-contained file).

When the metrics have the multimodal blocks (``speech``, ``video``, ``consistency``; see
:mod:`empatheia.evaluation.multimodal`), each is a table of its own, with identity
consistency per avatar as one more table; the profile scores (``profile``) are one too. A
metric that cannot apply reads "n/a (reason)", the reason from the metrics'
``not_applicable``.

The SVGs are drawn here (no plotting library): plain SVG 1.1, valid XML, every label
escaped. All files are written whole or not at all.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..io import write_text_atomic

PathLike = Union[str, Path]

CONFUSION_SVG = "confusion_matrix.svg"
PER_EMOTION_SVG = "per_emotion_accuracy.svg"
GROUP_SVG = "accuracy_by_{attribute}.svg"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"

_FONT = "font-family='Helvetica, Arial, sans-serif'"
_BAR_COLOR = "#4C72B0"
_FRACTIONS = ("emotion_accuracy", "emotion_macro_f1", "chain_emotion_accuracy", "chain_complete_share", "dist_1", "dist_2", "repeated_sentence_share", "listener_echo_share", "bleu_1", "bleu_2", "bleu_3", "bleu_4")
_NAMES = {
    "count": "Scored responses",
    "emotion_accuracy": "Emotion accuracy (Acc)",
    "emotion_macro_f1": "Emotion macro-F1",
    "chain_emotion_accuracy": "Chain-of-Empathy emotion accuracy",
    "chain_complete_share": "Chains naming all four steps",
    "dist_1": "Dist-1",
    "dist_2": "Dist-2",
    "repeated_sentence_share": "Answers that repeat a sentence",
    "repeated_sentence_count": "Answers that repeat a sentence (count)",
    "listener_echo_share": "Answers that repeat the listener's earlier words",
    "listener_echo_count": "Answers that repeat the listener's earlier words (count)",
    "listener_echo_answers": "Answers after a listener turn",
}


def _e(text: Any) -> str:
    """Text escaped for XML/HTML content and attribute values."""
    return html.escape(str(text), quote=True)


# ====================================================================== SVG
def heatmap_svg(
    matrix: Sequence[Sequence[float]],
    row_labels: Sequence[str],
    column_labels: Sequence[str],
    title: str,
    row_title: str = "gold",
    column_title: str = "predicted",
    cell: int = 46,
) -> str:
    """A heatmap as an SVG document: each cell shows its value and is shaded by its share
    of its row (white = 0, dark blue = the whole row)."""
    rows, cols = len(row_labels), len(column_labels)
    left, top = 130, 150
    width, height = left + cols * cell + 70, top + rows * cell + 30
    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' viewBox='0 0 {width} {height}' {_FONT} font-size='12'>",
        f"<title>{_e(title)}</title>",
        f"<rect width='{width}' height='{height}' fill='white'/>",
        f"<text x='{width / 2:.1f}' y='22' text-anchor='middle' font-size='15' font-weight='bold'>{_e(title)}</text>",
        f"<text x='{left + cols * cell / 2:.1f}' y='44' text-anchor='middle' font-style='italic'>{_e(column_title)}</text>",
        f"<text x='16' y='{top + rows * cell / 2:.1f}' text-anchor='middle' font-style='italic' "
        f"transform='rotate(-90 16 {top + rows * cell / 2:.1f})'>{_e(row_title)}</text>",
    ]
    for j, label in enumerate(column_labels):
        x, y = left + j * cell + cell / 2, top - 8
        parts.append(f"<text x='{x:.1f}' y='{y}' transform='rotate(-45 {x:.1f} {y})'>{_e(label)}</text>")
    for i, label in enumerate(row_labels):
        total = sum(matrix[i]) if i < len(matrix) else 0
        y = top + i * cell
        parts.append(f"<text x='{left - 8}' y='{y + cell / 2 + 4:.1f}' text-anchor='end'>{_e(label)}</text>")
        for j in range(cols):
            value = matrix[i][j]
            share = value / total if total else 0.0
            text_color = "white" if share > 0.55 else "black"
            parts.append(
                f"<rect x='{left + j * cell}' y='{y}' width='{cell}' height='{cell}' fill='{_blue(share)}' stroke='#cccccc'>"
                f"<title>{_e(label)} -> {_e(column_labels[j])}: {_e(_number(value))}</title></rect>"
            )
            parts.append(
                f"<text x='{left + j * cell + cell / 2:.1f}' y='{y + cell / 2 + 4:.1f}' text-anchor='middle' "
                f"fill='{text_color}'>{_e(_number(value))}</text>"
            )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def bar_chart_svg(
    bars: Sequence[Tuple[str, Optional[float], int]],
    title: str,
    value_title: str = "accuracy",
    bar_width: int = 54,
    maximum: Optional[float] = None,
) -> str:
    """A bar chart as an SVG document. ``bars`` are ``(label, value or None, count)``; a
    ``None`` value (no example) has no bar and reads "n/a"; each bar shows its value and
    its count below the label.

    Without ``maximum`` the values are fractions in [0, 1], shown as percentages; with it,
    plain numbers on an axis from 0 to ``maximum`` (seconds, error rates above 1). Values
    outside the axis are drawn at its end but labelled as they are."""
    scale = 1.0 if maximum is None else float(maximum)
    if not scale > 0:
        raise ValueError(f"maximum must be positive, got {maximum}")

    def shown(value: float, digits: int) -> str:
        return f"{value:.{max(digits - 2, 0)}%}" if maximum is None else f"{value:.{digits + 1}g}"

    plot_height, left, top, gap = 220, 60, 50, 18
    width = max(left + max(1, len(bars)) * (bar_width + gap) + 20, int(len(title) * 8.5) + 40)  # room for the title
    height = top + plot_height + 90
    base = top + plot_height
    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' viewBox='0 0 {width} {height}' {_FONT} font-size='12'>",
        f"<title>{_e(title)}</title>",
        f"<rect width='{width}' height='{height}' fill='white'/>",
        f"<text x='{width / 2:.1f}' y='22' text-anchor='middle' font-size='15' font-weight='bold'>{_e(title)}</text>",
        f"<text x='14' y='{top + plot_height / 2:.1f}' text-anchor='middle' font-style='italic' "
        f"transform='rotate(-90 14 {top + plot_height / 2:.1f})'>{_e(value_title)}</text>",
    ]
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = base - tick * plot_height
        parts.append(f"<line x1='{left}' y1='{y:.1f}' x2='{width - 10}' y2='{y:.1f}' stroke='#e0e0e0'/>")
        parts.append(f"<text x='{left - 6}' y='{y + 4:.1f}' text-anchor='end'>{shown(tick * scale, 2)}</text>")
    parts.append(f"<line x1='{left}' y1='{top}' x2='{left}' y2='{base}' stroke='black'/>")
    parts.append(f"<line x1='{left}' y1='{base}' x2='{width - 10}' y2='{base}' stroke='black'/>")
    for k, (label, value, count) in enumerate(bars):
        x = left + gap / 2 + k * (bar_width + gap)
        middle = x + bar_width / 2
        if value is None:
            parts.append(f"<text x='{middle:.1f}' y='{base - 6}' text-anchor='middle' fill='#888888'>n/a</text>")
        else:
            clipped = min(max(value / scale, 0.0), 1.0)
            bar_height = clipped * plot_height
            parts.append(
                f"<rect x='{x:.1f}' y='{base - bar_height:.1f}' width='{bar_width}' height='{bar_height:.1f}' fill='{_BAR_COLOR}'>"
                f"<title>{_e(label)}: {shown(value, 4)} of {count}</title></rect>"
            )
            parts.append(f"<text x='{middle:.1f}' y='{base - bar_height - 5:.1f}' text-anchor='middle'>{shown(value, 3)}</text>")
        parts.append(f"<text x='{middle:.1f}' y='{base + 16}' text-anchor='middle'>{_e(label)}</text>")
        parts.append(f"<text x='{middle:.1f}' y='{base + 31}' text-anchor='middle' fill='#666666' font-size='10'>n={count}</text>")
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _blue(share: float) -> str:
    """White (0) to dark blue (1)."""
    share = min(max(share, 0.0), 1.0)
    low, high = (255, 255, 255), (8, 48, 107)
    r, g, b = (round(a + (b - a) * share) for a, b in zip(low, high))
    return f"#{r:02x}{g:02x}{b:02x}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"


# ====================================================================== report
def _value(key: str, value: Any, reasons: Optional[Mapping[str, str]] = None) -> str:
    if isinstance(value, float):
        return f"{value:.4f} ({value:.2%})" if key.split(".")[-1] in _FRACTIONS else f"{value:.4f}"
    if value is None:
        return _not_available(key, reasons)
    return str(value)


def _not_available(key: str, reasons: Optional[Mapping[str, str]]) -> str:
    """"n/a", with the reason the metrics give for ``key`` (``not_applicable``) when any."""
    reason = (reasons or {}).get(key)
    return f"n/a ({reason})" if reason else "n/a"


_MULTIMODAL = ("media", "speech", "video", "consistency")

# (key, name, kind) per row of the multimodal tables; kind: fraction, number, count, seconds, dbfs.
_SPEECH_ROWS = (
    ("count", "Clips", "count"),
    ("wer_mean", "WER (mean over clips)", "fraction"),
    ("cer_mean", "CER (mean over clips)", "fraction"),
    ("wer_corpus", "WER (corpus)", "fraction"),
    ("cer_corpus", "CER (corpus)", "fraction"),
    ("duration_mean_seconds", "Duration (mean)", "seconds"),
    ("loudness_mean_dbfs", "Loudness (mean of non-silent clips)", "dbfs"),
    ("silent_clips", "Silent clips", "count"),
    ("style_cosine_mean", "Style agreement: cosine, requested vs realised S^s (mean)", "number"),
    ("style_mse_mean", "Style agreement: MSE, requested vs realised S^s (mean)", "number"),
    ("style_count", "Style agreement: responses scored", "count"),
)
_VIDEO_ROWS = (
    ("count", "Clips", "count"),
    ("cpbd_mean", "CPBD sharpness (mean)", "number"),
    ("lip_sync_count", "Clips scored for lip sync", "count"),
    ("lip_sync_confidence_mean", "Lip-sync confidence (mean, peak - median correlation)", "number"),
    ("lip_sync_in_sync_share", "Clips in sync (|offset| <= 1 frame)", "fraction"),
    ("lip_sync_offset_abs_mean", "Mean |offset| (frames)", "number"),
    ("lip_sync_unscored", "Clips too short for lip sync", "count"),
    ("facial_emotion_accuracy", "Facial-emotion accuracy (FER vs gold)", "fraction"),
    ("facial_emotion_correct", "Facial emotion: correct", "count"),
    ("facial_emotion_scored", "Facial emotion: scored clips", "count"),
    ("facial_emotion_excluded", "Facial emotion: excluded (gold FER cannot read)", "count"),
    ("identity_consistency_mean", "Identity consistency (mean same-avatar similarity)", "number"),
    ("identity_pairs", "Same-avatar pairs", "count"),
    ("identity_avatars", "Avatars with >= 2 clips", "count"),
    ("ssim_mean", "SSIM against the gold clip (mean)", "number"),
    ("ssim_count", "SSIM: clips with a gold clip", "count"),
    ("style_cosine_mean", "Style agreement: cosine, requested vs realised S^v (mean)", "number"),
    ("style_mse_mean", "Style agreement: MSE, requested vs realised S^v (mean)", "number"),
    ("style_count", "Style agreement: responses scored", "count"),
)
_CONSISTENCY_ROWS = (
    ("text_video_emotion_agreement", "Text-video emotion agreement (the Style Disentangler's emotion vs FER)", "fraction"),
    ("text_video_count", "Text-video: clips scored", "count"),
    ("text_video_excluded", "Text-video: excluded (text emotion FER cannot read)", "count"),
    ("chain_video_emotion_agreement", "Chain-video emotion agreement (the chain's emotion vs FER)", "fraction"),
    ("chain_video_count", "Chain-video: clips scored", "count"),
    ("chain_video_excluded", "Chain-video: excluded (no chain, or a class FER cannot read)", "count"),
    ("text_speech_word_agreement", "Text-speech word agreement (mean max(0, 1 - WER))", "fraction"),
    ("text_speech_char_similarity", "Text-speech character similarity (mean)", "fraction"),
    ("text_speech_count", "Text-speech: clips scored", "count"),
)


def _formatted(value: Any, kind: str) -> str:
    if value is None:
        return "n/a"
    if kind == "count" or not _is_number(value):
        return str(value)
    if kind == "fraction":
        return f"{value:.4f} ({value:.2%})"
    if kind == "seconds":
        return f"{value:.2f} s"
    if kind == "dbfs":
        return f"{value:.2f} dBFS"
    return f"{value:.4f}"


def _block_rows(block: Mapping[str, Any], spec: Sequence[Tuple[str, str, str]], name: str = "",
                reasons: Optional[Mapping[str, str]] = None) -> List[List[str]]:
    """Rows ``[name, value]`` of the multimodal block ``name``, in ``spec``'s order, then
    any other numbers it holds under their keys; a value that cannot apply says why
    (``reasons``: the metrics' ``not_applicable``)."""

    def cell(key: str, value: Any, kind: str) -> str:
        return _not_available(f"{name}.{key}", reasons) if value is None else _formatted(value, kind)

    known = {key for key, _, _ in spec}
    rows = [[title, cell(key, block[key], kind)] for key, title, kind in spec if key in block]
    rows += [[key, cell(key, value, "number")] for key, value in block.items()
             if key not in known and (_is_number(value) or value is None)]
    return rows


def _multimodal_sections(metrics: Mapping[str, Any]) -> List[Tuple[str, List[str], List[List[str]], Optional[str], List[str]]]:
    sections = []
    speech, video, consistency = metrics.get("speech"), metrics.get("video"), metrics.get("consistency")
    reasons = metrics.get("not_applicable") or {}
    if speech:
        notes = []
        if "count" in speech:
            notes.append("Each clip is transcribed by Whisper tiny.en and compared with the response's own text "
                         "(normalised: case, punctuation and spelled-out numbers); a rate can exceed 1 with insertions. "
                         "Loudness: gated RMS of the speaking frames.")
        if "style_count" in speech:
            notes.append("Style agreement: the speech style S^s the model requested against the one its speech "
                         "generator measures on the written audio (cosine in [-1, 1], 1 = same direction; MSE per "
                         "dimension, 0 = identical).")
        sections.append(("Speech", ["metric", "value"], _block_rows(speech, _SPEECH_ROWS, "speech", reasons), None, notes))
    if video:
        notes = []
        if "count" in video:
            notes.append("CPBD: no-reference sharpness in [0, 1]. Lip sync: mouth motion against the speech envelope "
                         "over frame offsets (a correlation scale, 0 to 2, not SyncNet's). Facial emotion: the FER "
                         "mini-Xception's reading against the gold emotion; FER has no contempt, so clips whose gold "
                         "emotion is contempt (or outside Empatheia's seven) are left out.")
        if "ssim_count" in video:
            notes.append("SSIM: luma structural similarity (1 = identical) of each clip against its reference's gold "
                         "clip, frame pairs from the start at the reference's frame rate over the shorter length, "
                         "generated frames resized to the reference's size.")
        if "style_count" in video:
            notes.append("Style agreement: the video style S^v the model requested against the one its talking-head "
                         "generator measures on the written video.")
        sections.append(("Video", ["metric", "value"], _block_rows(
            {k: v for k, v in video.items() if k != "identity_per_avatar"}, _VIDEO_ROWS, "video", reasons), None, notes))
        per_avatar = video.get("identity_per_avatar") or {}
        if per_avatar:
            rows = [[key, str(entry.get("clips")), _formatted(entry.get("mean_similarity"), "number"),
                     _formatted(entry.get("min_similarity"), "number")] for key, entry in per_avatar.items()]
            sections.append(("Identity consistency per avatar", ["avatar", "clips", "mean similarity", "min similarity"],
                             rows, None, ["Cosine similarity of MobileNetV2 face embeddings over the pairs of an "
                                          "avatar's clips (n/a for an avatar with one clip)."]))
    if consistency:
        sections.append(("Cross-modal consistency", ["metric", "value"], _block_rows(consistency, _CONSISTENCY_ROWS, "consistency", reasons), None, [
            "Text-video: the predicted text emotion against the FER reading of the face. Text-speech: the response "
            "text against the transcript of its speech."]))
    return sections


def _scalars(metrics: Mapping[str, Any]) -> List[Tuple[str, Any]]:
    """The headline numbers: top-level numbers, and the numbers of top-level dicts added
    by the text metrics (``bleu.bleu_4``), in the order they come. The multimodal blocks
    have tables of their own."""
    rows = []
    for key, value in metrics.items():
        if key in ("emotion", "by_group", "missing", "sources", "run", "profile", "not_applicable") + _MULTIMODAL:
            continue
        if _is_number(value) or value is None:
            rows.append((key, value))
        elif isinstance(value, dict):
            rows.extend((f"{key}.{k}", v) for k, v in value.items() if _is_number(v) or v is None)
    return rows


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _accuracy_table(counts: Sequence[Tuple[str, Optional[float], int, int]]) -> List[List[str]]:
    return [[name, str(correct), str(n), "n/a" if accuracy is None else f"{accuracy:.2%}"] for name, accuracy, correct, n in counts]


def _per_class(emotion: Mapping[str, Any]) -> List[Tuple[str, Optional[float], int, int]]:
    """``(gold class, accuracy, correct, support)`` from an emotion report."""
    rows = emotion.get("confusion_rows", emotion["labels"])
    columns = emotion.get("confusion_columns", rows)
    out = []
    for k, label in enumerate(rows):
        entry = emotion["per_class"][label]
        correct = emotion["confusion"][k][columns.index(label)] if label in columns else 0
        out.append((label, entry.get("accuracy"), int(correct), int(entry.get("support", sum(emotion["confusion"][k])))))
    return out


def _groups(table: Mapping[str, Mapping[str, Any]]) -> List[Tuple[str, Optional[float], int, int]]:
    return [(value, row["accuracy"], int(row["correct"]), int(row["n"])) for value, row in table.items()]


def _bars(counts: Sequence[Tuple[str, Optional[float], int, int]]) -> List[Tuple[str, Optional[float], int]]:
    return [(name, accuracy, n) for name, accuracy, _, n in counts]


def build_plots(metrics: Mapping[str, Any]) -> Dict[str, str]:
    """SVG documents by file name, for what the metrics hold."""
    plots: Dict[str, str] = {}
    emotion = metrics.get("emotion")
    if emotion:
        rows = emotion.get("confusion_rows", emotion["labels"])
        columns = emotion.get("confusion_columns", rows)
        plots[CONFUSION_SVG] = heatmap_svg(emotion["confusion"], rows, columns, "Emotion confusion matrix")
        plots[PER_EMOTION_SVG] = bar_chart_svg(_bars(_per_class(emotion)), "Accuracy per emotion")
        for attribute, table in (emotion.get("by_group") or {}).items():
            plots[GROUP_SVG.format(attribute=attribute)] = bar_chart_svg(_bars(_groups(table)), f"Accuracy by the user's {attribute}")
    return plots


def _sections(metrics: Mapping[str, Any], plots: Mapping[str, str]) -> List[Tuple[str, List[str], List[List[str]], Optional[str], List[str]]]:
    """``(heading, table header, table rows, plot file or None, notes)`` per section."""
    sections = []
    reasons = metrics.get("not_applicable") or {}
    scalars = [[_NAMES.get(k, k), _value(k, v, reasons)] for k, v in _scalars(metrics)]
    notes = []
    sources = metrics.get("sources") or {}
    for name in ("predictions", "references"):
        if name in sources:
            notes.append(f"{name.capitalize()}: {sources[name]}")
    if sources.get("predictions_outside_selection"):
        notes.append(f"{sources['predictions_outside_selection']} prediction(s) of ids outside this run's selection were not scored.")
    run = metrics.get("run") or {}
    if run:
        notes.append(f"Model run: {run.get('model', '?')} on {run.get('data', '?')}; {run.get('selected', '?')} example(s), "
                     f"{run.get('resumed', 0)} predicted by an earlier run.")
    media = metrics.get("media") or {}
    if media:
        notes.append(f"{media.get('audio', 0)} response(s) have audio and {media.get('video', 0)} video; "
                     + ("scored below." if media.get("scored") else "not scored (add --multimodal)."))
    notes.append("Accuracies, Dist-n and BLEU are fractions (in brackets as percentages); the paper's tables print "
                 "them x100.")
    sections.append(("Summary", ["metric", "value"], scalars, None, notes))
    emotion = metrics.get("emotion")
    if emotion:
        sections.append(("Emotion confusion matrix", [], [], CONFUSION_SVG,
                         ["Rows: gold emotion; columns: predicted emotion; shading: share of the row."]))
        sections.append(("Accuracy per emotion", ["gold emotion", "correct", "total", "accuracy"],
                         _accuracy_table(_per_class(emotion)), PER_EMOTION_SVG,
                         ["Accuracy of a gold emotion: the share of its examples predicted as it (its recall)."]))
        for attribute, table in (emotion.get("by_group") or {}).items():
            sections.append((f"Accuracy by the user's {attribute}", [attribute, "correct", "total", "accuracy"],
                             _accuracy_table(_groups(table)), GROUP_SVG.format(attribute=attribute),
                             ["The user is the speaker of the dialogue (the person whose emotion is recognised)."]))
    profile = metrics.get("profile") or {}
    if profile:
        rows = [[attribute, str(entry["correct"]), str(entry["n"]),
                 _not_available(f"profile.{attribute}.accuracy", reasons) if entry["accuracy"] is None
                 else f"{entry['accuracy']:.2%}"] for attribute, entry in profile.items()]
        sections.append(("Profile accuracy", ["attribute", "correct", "total", "accuracy"], rows, None,
                         ["The profile of the avatar that answers (the dataset's listener), as the Style Disentangler "
                          "reads it, against the references' listener_profile."]))
    sections += _multimodal_sections(metrics)
    missing = metrics.get("missing") or {}
    if missing.get("without_reference") or missing.get("without_prediction") or missing.get("unknown_gold"):
        kinds = [("prediction without reference", "without_reference"), ("reference without prediction", "without_prediction"),
                 ("reference with an unknown gold emotion", "unknown_gold")]
        rows = [[kind, str(len(missing.get(key, []))), ", ".join(missing.get(key, [])[:20])]
                for kind, key in kinds if key != "unknown_gold" or missing.get(key)]
        sections.append(("Ids left out", ["kind", "count", "ids (first 20; all in metrics.json)"], rows, None, []))
    return sections


def _markdown_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    """The lines of a Markdown table (cells escaped), without a blank line after it."""
    lines = ["| " + " | ".join(_markdown_cell(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(_markdown_cell(c) for c in row) + " |" for row in rows]


def html_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """An HTML table, every cell escaped."""
    return "\n".join(
        ["<table><thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr></thead><tbody>"]
        + ["<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows]
        + ["</tbody></table>"]
    )


def html_document(title: str, body: Sequence[str]) -> str:
    """A self-contained HTML page in the reports' style around ``body`` (HTML fragments)."""
    style = (
        "body{font-family:Helvetica,Arial,sans-serif;max-width:960px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;margin:0.5em 0}th,td{border:1px solid #ccc;padding:4px 10px;text-align:left}"
        "th{background:#f3f3f3}.note{color:#555;font-size:0.9em}figure{margin:1em 0}"
    )
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{_e(title)}</title><style>{style}</style></head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def render_markdown(metrics: Mapping[str, Any], plots: Mapping[str, str], title: str) -> str:
    lines = [f"# {title}", ""]
    for heading, header, rows, plot, notes in _sections(metrics, plots):
        lines += [f"## {heading}", ""]
        if rows:
            lines += markdown_table(header, rows)
            lines.append("")
        if plot:
            lines += [f"![{heading}]({plot})", ""]
        lines += [f"{note}  " for note in notes]
        if notes:
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def render_html(metrics: Mapping[str, Any], plots: Mapping[str, str], title: str) -> str:
    body = [f"<h1>{_e(title)}</h1>"]
    for heading, header, rows, plot, notes in _sections(metrics, plots):
        body.append(f"<h2>{_e(heading)}</h2>")
        if rows:
            body.append(html_table(header, rows))
        if plot:
            body.append(f"<figure>{plots[plot]}</figure>")
        body += [f"<p class='note'>{_e(note)}</p>" for note in notes]
    return html_document(title, body)


def write_report(metrics: Mapping[str, Any], out_dir: PathLike, title: str = "Empatheia evaluation") -> Dict[str, Path]:
    """Write the SVG plots, ``report.md`` and ``report.html`` into ``out_dir``; returns
    the written paths by file name."""
    out_dir = Path(out_dir)
    plots = build_plots(metrics)
    written = {name: write_text_atomic(out_dir / name, svg) for name, svg in plots.items()}
    written[REPORT_MD] = write_text_atomic(out_dir / REPORT_MD, render_markdown(metrics, plots, title))
    written[REPORT_HTML] = write_text_atomic(out_dir / REPORT_HTML, render_html(metrics, plots, title))
    return written
