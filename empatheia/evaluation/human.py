"""Human evaluation kit: rating sheets out, filled sheets in, means and agreement back.

The paper (§6.1, Appendix E.3.4) has annotators rate 200 sampled test dialogues on a 1-5
scale against four text criteria (Empathy, Coherence, Informativity, Fluency; Table 4)
and six multimodal ones (Speech/Video Content Accuracy, Speech/Video Style Accuracy,
Multimodal Content/Style Consistency; Table 5, where SSA/VSA are printed as SEA/VEA).

Design
------
* **One CSV sheet per annotator** (``sheets/<annotator>.csv``): annotators rate
  independently and never see each other's scores; each sheet still carries an
  ``annotator`` column so a renamed file stays attributable. Concatenating sheets is not
  needed: :func:`aggregate` reads any number of them.
* **Blind**: a sheet shows an opaque ``item`` number, the dialogue, the response and its
  media file names, never the system; ``key.csv`` (kept by the organiser) maps each item
  to its ``dialogue_id`` and ``system``. Items of all systems are shuffled together.
* **Sampling** is seeded: the same dialogues, data and seed give the same sheets. Only
  dialogues that every system answered are sampled.
* Sheet columns: ``annotator, item, dialogue, response, response_audio, response_video``,
  then one column per criterion (its full name, e.g. ``Empathy``), then ``comment``.
  ``dialogue`` is one ``Speaker: ...``/``Listener: ...`` line per turn, with the turn's
  media file names in brackets.
* **Criteria**: ``text`` (4), ``multimodal`` (6) or ``all`` (10); ``auto`` takes all of
  them when every response to rate has media, else the text ones. ``include_gold`` adds
  the dataset's gold responses as the system ``gold`` (a ground-truth row).
* The kit folder: ``key.csv``, ``sheets/<annotator>.csv``, ``instructions.md`` (criteria
  and scale for the annotators). Exporting into a folder that has a kit is refused.
* Ratings are whole numbers 1-5 (``4``, ``4.0``). Sheets may be saved back with ``,``,
  ``;`` or tab separators, with or without a byte-order mark. A missing or bad rating, an unknown or
  repeated item, or an item left out is an error (:class:`SheetError`) naming the file,
  the row (as a spreadsheet shows it: the header is row 1) and the column.

Aggregation gives, per system and criterion, the mean of all ratings (``mean``, the
tables' number), its standard deviation, and ``majority_mean``: the mean over items of the
annotators' majority rating (the paper's "majority voting"; a tie takes the lower median
of the ratings). Agreement per criterion (and pooled over criteria) is Fleiss' kappa over
the five categories for any number of annotators, plus Cohen's kappa when there are two.
"""

from __future__ import annotations

import csv
import io
import math
import random
import re
import statistics
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ..io import write_json, write_text_atomic
from .records import read_predictions

if TYPE_CHECKING:
    from ..dialogue import Dialogue

PathLike = Union[str, Path]

SCALE = (1, 2, 3, 4, 5)
KEY_NAME = "key.csv"
SHEETS_DIR = "sheets"
INSTRUCTIONS_NAME = "instructions.md"
RESULTS_JSON = "human_scores.json"
RESULTS_MD = "human_scores.md"
GOLD_SYSTEM = "gold"
SHEET_COLUMNS = ("annotator", "item", "dialogue", "response", "response_audio", "response_video")
COMMENT_COLUMN = "comment"
KEY_COLUMNS = ("item", "dialogue_id", "system")


@dataclass(frozen=True)
class Criterion:
    abbreviation: str
    name: str
    """The sheet's column header."""
    question: str


TEXT_CRITERIA: Tuple[Criterion, ...] = (
    Criterion("Emp", "Empathy", "Does the response show an understanding of the user's emotions and experiences, and respond appropriately?"),
    Criterion("Coh", "Coherence", "Is the response logically consistent and relevant to the context?"),
    Criterion("Inf", "Informativity", "Does the response provide useful and meaningful information?"),
    Criterion("Flu", "Fluency", "Is the response grammatically well formed and easy to read?"),
)
"""Appendix E.3.1, human evaluation of textual ERG (Table 4)."""

MULTIMODAL_CRITERIA: Tuple[Criterion, ...] = (
    Criterion("SCA", "Speech Content Accuracy", "Is the content of the generated speech complete and consistent with the response text?"),
    Criterion("VCA", "Video Content Accuracy", "Does the face in the generated video read out the response text accurately and fluently?"),
    Criterion("SSA", "Speech Style Accuracy", "Does the speech convey the intended emotion, and does the voice match the responder's profile?"),
    Criterion("VSA", "Video Style Accuracy", "Does the avatar express the intended emotion, and do its appearance and behaviour match its profile?"),
    Criterion("MCC", "Multimodal Content Consistency", "Is the content consistent across speech, video and text?"),
    Criterion("MSC", "Multimodal Style Consistency", "Is the style (emotion, profile) consistent across speech, video and text?"),
)
"""Appendix E.3.4, human evaluation of MERG (Table 5 prints SSA/VSA as SEA/VEA)."""

CRITERIA_SETS: Dict[str, Tuple[Criterion, ...]] = {
    "text": TEXT_CRITERIA,
    "multimodal": MULTIMODAL_CRITERIA,
    "all": TEXT_CRITERIA + MULTIMODAL_CRITERIA,
}
ALL_CRITERIA = {c.name: c for c in CRITERIA_SETS["all"]}

SCALE_WORDS = {
    "text": "1: not at all, 3: adequate, 5: excellent",
    "multimodal": "1: extremely poor, 5: excellent",
}


class SheetError(ValueError):
    """A problem in a rating sheet or key; the message starts with the file, and where
    known the row (spreadsheet numbering, header = row 1) and the column."""

    def __init__(self, reason: str, file: PathLike, row: Optional[int] = None, column: Optional[str] = None):
        self.reason, self.file, self.row, self.column = reason, str(file), row, column
        where = [self.file] + ([f"row {row}"] if row is not None else []) + ([f"column {column!r}"] if column else [])
        super().__init__(f"{', '.join(where)}: {reason}")


# ====================================================================== agreement
# Our own: of the well-kept libraries only statsmodels has Fleiss' kappa, and it would bring pandas and patsy for it.
def fleiss_kappa(table: Sequence[Sequence[int]]) -> Optional[float]:
    """Fleiss' kappa of a subjects-by-categories count table.

    ``table[i][j]`` is how many raters put subject ``i`` in category ``j``; every subject
    has the same number of ratings ``n >= 2``. With ``N`` subjects::

        P_i  = (sum_j n_ij^2 - n) / (n (n - 1))      agreement on subject i
        P    = (1 / N) sum_i P_i                     mean observed agreement
        p_j  = (1 / (N n)) sum_i n_ij                share of category j
        P_e  = sum_j p_j^2                           agreement expected by chance
        kappa = (P - P_e) / (1 - P_e)

    Returns ``None`` when ``P_e = 1`` (every rating in one category: kappa is 0/0).
    """
    rows = [list(map(int, row)) for row in table]
    if not rows:
        raise ValueError("fleiss_kappa needs at least one subject")
    totals = {sum(row) for row in rows}
    if len(totals) != 1:
        raise ValueError(f"every subject needs the same number of ratings, got {sorted(totals)}")
    n = totals.pop()
    if n < 2:
        raise ValueError(f"fleiss_kappa needs at least 2 ratings per subject, got {n}")
    if any(v < 0 for row in rows for v in row):
        raise ValueError("counts cannot be negative")
    subjects = len(rows)
    observed = sum((sum(v * v for v in row) - n) / (n * (n - 1)) for row in rows) / subjects
    shares = [sum(row[j] for row in rows) / (subjects * n) for j in range(len(rows[0]))]
    chance = sum(p * p for p in shares)
    if math.isclose(chance, 1.0):
        return None
    return (observed - chance) / (1 - chance)


def rating_table(ratings: Sequence[Sequence[int]], categories: Sequence[int] = SCALE) -> List[List[int]]:
    """Per-subject ratings (one list per subject, one rating per rater) as the count table
    :func:`fleiss_kappa` takes."""
    index = {c: j for j, c in enumerate(categories)}
    table = []
    for subject in ratings:
        row = [0] * len(categories)
        for rating in subject:
            if rating not in index:
                raise ValueError(f"rating {rating!r} is not one of the categories {list(categories)}")
            row[index[rating]] += 1
        table.append(row)
    return table


def cohen_kappa(first: Sequence[Any], second: Sequence[Any], categories: Optional[Sequence[Any]] = None) -> Optional[float]:
    """Cohen's kappa of two raters who rated the same subjects (scikit-learn's
    ``cohen_kappa_score``).

    With ``N`` subjects, ``n_1k``/``n_2k`` the times rater 1/2 chose category ``k``::

        p_o   = (1 / N) #{i : first_i = second_i}     observed agreement
        p_e   = sum_k (n_1k / N) (n_2k / N)           agreement expected by chance
        kappa = (p_o - p_e) / (1 - p_e)

    Returns ``None`` when ``p_e = 1`` (both raters always chose the one same category).
    """
    if len(first) != len(second):
        raise ValueError(f"the raters rated {len(first)} and {len(second)} subjects")
    if not first:
        raise ValueError("cohen_kappa needs at least one subject")
    if categories is not None:
        stray = sorted({str(v) for v in list(first) + list(second) if v not in set(categories)})
        if stray:
            raise ValueError(f"ratings {stray} are not among the categories {list(categories)}")
    from sklearn.metrics import cohen_kappa_score

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the one-category case warns; it is undefined here (None)
        kappa = cohen_kappa_score(list(first), list(second), labels=None if categories is None else list(categories))
    return None if math.isnan(kappa) else float(kappa)


def majority_rating(ratings: Sequence[int]) -> int:
    """The most frequent rating; on a tie the lower median of all the ratings."""
    counts = Counter(ratings)
    top = max(counts.values())
    winners = [r for r, c in counts.items() if c == top]
    return winners[0] if len(winners) == 1 else int(statistics.median_low(ratings))


# ====================================================================== export
@dataclass
class SheetItem:
    """One response to rate."""

    item: str
    dialogue_id: str
    system: str
    dialogue: str
    response: str
    response_audio: str = ""
    response_video: str = ""


def dialogue_text(dialogue: "Dialogue") -> str:
    """The dialogue as the sheet shows it: ``Speaker: text [a.wav, a.mp4]`` per turn."""
    from ..prompts import ROLE_NAMES

    lines = []
    for turn in dialogue.turns:
        media = [Path(m).name for m in (turn.audio, turn.video) if isinstance(m, (str, Path))]
        suffix = f" [{', '.join(media)}]" if media else ""
        lines.append(f"{ROLE_NAMES[turn.role]}: {turn.text.strip()}{suffix}")
    return "\n".join(lines)


def sample_items(
    dialogues: Sequence["Dialogue"],
    systems: Mapping[str, Sequence[Mapping[str, Any]]],
    n: int,
    seed: int = 0,
    include_gold: bool = False,
) -> List[SheetItem]:
    """Sample ``n`` dialogues (seeded) that every system answered, and make one item per
    dialogue and system (plus the gold response with ``include_gold``), shuffled
    together and numbered ``item-0001`` on.

    ``systems`` maps a system name to its prediction records (``id``, ``text``, optional
    ``audio``/``video``)."""
    if n < 1:
        raise ValueError(f"the number of dialogues must be at least 1, got {n}")
    if not systems and not include_gold:
        raise ValueError("no system to rate: give predictions (or include the gold responses)")
    if include_gold and GOLD_SYSTEM in systems:
        raise ValueError(f"a system is named {GOLD_SYSTEM!r}, which the gold responses use; rename it")
    by_system = {name: {p["id"]: p for p in records} for name, records in systems.items()}
    by_id = {d.id: d for d in dialogues if d.id}
    eligible = sorted(i for i in by_id if all(i in preds for preds in by_system.values()))
    if include_gold:
        eligible = [i for i in eligible if by_id[i].response]
    if len(eligible) < n:
        raise ValueError(
            f"asked for {n} dialogues but only {len(eligible)} of the {len(by_id)} in the data "
            f"have a response from every system{' and a gold response' if include_gold else ''}"
        )
    rng = random.Random(seed)
    chosen = rng.sample(eligible, n)
    items = []
    for dialogue_id in chosen:
        dialogue = by_id[dialogue_id]
        context = dialogue_text(dialogue)
        for name, preds in by_system.items():
            p = preds[dialogue_id]
            items.append(SheetItem("", dialogue_id, name, context, p["text"], p.get("audio") or "", p.get("video") or ""))
        if include_gold:
            media = [Path(m).name if m else "" for m in (dialogue.response_audio, dialogue.response_video)]
            items.append(SheetItem("", dialogue_id, GOLD_SYSTEM, context, dialogue.response, *media))
    rng.shuffle(items)
    width = max(4, len(str(len(items))))
    for number, item in enumerate(items, start=1):
        item.item = f"item-{number:0{width}d}"
    return items


def annotator_names(spec: Union[int, str, Sequence[str]]) -> List[str]:
    """``3`` or ``"3"`` -> ``["A1", "A2", "A3"]``; ``"ann,bob"`` or a list -> those names
    (letters, digits, ``_`` and ``-``; they name the sheet files)."""
    if isinstance(spec, int) or (isinstance(spec, str) and spec.strip().isdigit()):
        count = int(spec)
        if count < 1:
            raise ValueError(f"the number of annotators must be at least 1, got {count}")
        return [f"A{i}" for i in range(1, count + 1)]
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec)]
    bad = [s for s in names if not re.fullmatch(r"[A-Za-z0-9_-]+", s)]
    if bad or not names:
        raise ValueError(f"annotator names must be letters, digits, '_' or '-', got {bad or names}")
    if len(set(names)) != len(names):
        raise ValueError(f"annotator names repeat: {names}")
    return names


def _csv_text(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


def _instructions(criteria: Sequence[Criterion], count: int) -> str:
    lines = [
        "# Human evaluation: instructions",
        "",
        f"Rate each of the {count} responses in your sheet on every criterion column with a whole number "
        "from 1 to 5. Rate each response on its own; the same dialogue can come back with other responses.",
        "Open the media files named in the sheet (response_audio, response_video and the files in brackets "
        "after each turn) from the media folder you were given. Leave no rating empty; use `comment` for remarks.",
        "",
    ]
    for kind, group in (("text", TEXT_CRITERIA), ("multimodal", MULTIMODAL_CRITERIA)):
        chosen = [c for c in group if c in criteria]
        if not chosen:
            continue
        lines += [f"## {'Text' if kind == 'text' else 'Multimodal'} criteria ({SCALE_WORDS[kind]})", ""]
        lines += [f"- **{c.name}** ({c.abbreviation}): {c.question}" for c in chosen]
        lines.append("")
    return "\n".join(lines)


@dataclass
class ExportResult:
    key: Path
    sheets: List[Path]
    instructions: Path
    items: int
    dialogues: int
    criteria: List[str] = field(default_factory=list)


def export_sheets(
    items: Sequence[SheetItem],
    out_dir: PathLike,
    annotators: Sequence[str],
    criteria: Sequence[Criterion],
    overwrite: bool = False,
) -> ExportResult:
    """Write ``key.csv``, ``sheets/<annotator>.csv`` (empty rating columns) and
    ``instructions.md``. An existing kit (its ``key.csv``) is an error, since its sheets may
    already be filled in, unless ``overwrite``: then its sheets are removed first."""
    out_dir = Path(out_dir)
    if (out_dir / KEY_NAME).exists() and not overwrite:
        raise FileExistsError(f"{out_dir / KEY_NAME} exists: a kit was exported there already (sheets may be filled in); "
                              "use another folder or overwrite")
    if not criteria:
        raise ValueError("no criteria to rate")
    for stale in sorted((out_dir / SHEETS_DIR).glob("*.csv")) if overwrite else []:
        stale.unlink()  # sheets of the replaced kit would not match the new key
    key = write_text_atomic(out_dir / KEY_NAME, _csv_text(KEY_COLUMNS, [(i.item, i.dialogue_id, i.system) for i in items]))
    header = list(SHEET_COLUMNS) + [c.name for c in criteria] + [COMMENT_COLUMN]
    sheets = []
    for annotator in annotators:
        rows = [
            [annotator, i.item, i.dialogue, i.response, i.response_audio, i.response_video] + [""] * len(criteria) + [""]
            for i in items
        ]
        # UTF-8 with a byte-order mark, so spreadsheet programs read accents right.
        sheets.append(write_text_atomic(out_dir / SHEETS_DIR / f"{annotator}.csv", "\ufeff" + _csv_text(header, rows)))
    instructions = write_text_atomic(out_dir / INSTRUCTIONS_NAME, _instructions(criteria, len(items)))
    return ExportResult(key, sheets, instructions, len(items), len({i.dialogue_id for i in items}), [c.name for c in criteria])


def choose_criteria(name: str, items: Sequence[SheetItem]) -> Tuple[Criterion, ...]:
    """``text``, ``multimodal``, ``all``, or ``auto``: all when every response has media
    (audio or video), else the text criteria (a response without media cannot be rated on
    the multimodal ones)."""
    if name == "auto":
        name = "all" if items and all(i.response_audio or i.response_video for i in items) else "text"
    if name not in CRITERIA_SETS:
        raise ValueError(f"unknown criteria set {name!r}; choose one of {list(CRITERIA_SETS)} or 'auto'")
    return CRITERIA_SETS[name]


def export_kit(
    dialogues: Sequence["Dialogue"],
    predictions: Mapping[str, PathLike],
    out_dir: PathLike,
    n: int = 200,
    annotators: Union[int, str, Sequence[str]] = 3,
    seed: int = 0,
    criteria: str = "auto",
    include_gold: bool = False,
    overwrite: bool = False,
) -> ExportResult:
    """Read each system's predictions file (``{system: path}``), sample ``n`` dialogues
    and write the kit into ``out_dir`` (see :func:`sample_items`, :func:`export_sheets`)."""
    systems = {name: read_predictions(path) for name, path in predictions.items()}
    items = sample_items(dialogues, systems, n, seed, include_gold)
    return export_sheets(items, out_dir, annotator_names(annotators), choose_criteria(criteria, items), overwrite)


# ====================================================================== aggregate
@dataclass
class Sheet:
    """One annotator's ratings: ``ratings[item][criterion abbreviation]``."""

    path: Path
    annotator: str
    ratings: Dict[str, Dict[str, int]]
    criteria: List[str]


def _read_csv(path: Path) -> Tuple[List[str], List[Tuple[int, Dict[str, str]]]]:
    """Header and ``(spreadsheet row, row)`` pairs; ``,``, ``;`` or tab separated (as
    spreadsheet programs save), UTF-8 with or without a byte-order mark."""
    if not path.is_file():
        raise SheetError("file not found", path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as error:
        raise SheetError(f"not UTF-8 text ({error}); save the sheet as CSV UTF-8", path) from None
    first = text.split("\n", 1)[0]
    delimiter = max((",", ";", "\t"), key=first.count)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise SheetError("empty file", path) from None
    duplicated = sorted({h for h in header if header.count(h) > 1 and h})
    if duplicated:
        raise SheetError(f"repeated columns {duplicated}", path, row=1)
    rows = []
    for number, cells in enumerate(reader, start=2):  # records, as a spreadsheet numbers its rows
        if not any(c.strip() for c in cells):
            continue
        if len(cells) > len(header) and any(c.strip() for c in cells[len(header):]):
            raise SheetError(f"{len(cells)} cells but the header has {len(header)} columns", path, row=number)
        rows.append((number, dict(zip(header, cells + [""] * (len(header) - len(cells))))))
    return header, rows


def read_key(path: PathLike) -> Dict[str, Tuple[str, str]]:
    """``{item: (dialogue_id, system)}`` from a ``key.csv``."""
    path = Path(path)
    header, rows = _read_csv(path)
    missing = [c for c in KEY_COLUMNS if c not in header]
    if missing:
        raise SheetError(f"missing columns {missing} (a key has {list(KEY_COLUMNS)})", path, row=1)
    key: Dict[str, Tuple[str, str]] = {}
    for number, row in rows:
        for column in KEY_COLUMNS:
            if not row[column].strip():
                raise SheetError("empty", path, number, column)
        item = row["item"].strip()
        if item in key:
            raise SheetError(f"item {item!r} repeats", path, number, "item")
        key[item] = (row["dialogue_id"].strip(), row["system"].strip())
    if not key:
        raise SheetError("no items", path)
    return key


def parse_rating(text: str) -> int:
    """A 1-5 rating from a cell (``"4"``, ``" 4.0 "``); ``ValueError`` says what is wrong."""
    value = text.strip()
    if not value:
        raise ValueError("missing rating")
    try:
        number = float(value.replace(",", "."))
    except ValueError:
        raise ValueError(f"{value!r} is not a number (ratings are whole numbers 1-5)") from None
    if not number.is_integer():
        raise ValueError(f"{value!r} is not a whole number (ratings are whole numbers 1-5)")
    if int(number) not in SCALE:
        raise ValueError(f"{value!r} is out of range (ratings are 1-5)")
    return int(number)


def read_sheet(path: PathLike, key: Mapping[str, Tuple[str, str]]) -> Sheet:
    """Read and check one filled sheet against the key: every key item once, every
    criterion column rated 1-5, one annotator."""
    path = Path(path)
    header, rows = _read_csv(path)
    for column in ("annotator", "item"):
        if column not in header:
            raise SheetError(f"missing column {column!r}", path, row=1)
    criteria = [ALL_CRITERIA[h] for h in header if h in ALL_CRITERIA]
    if not criteria:
        raise SheetError(f"no criterion column (expected some of {list(ALL_CRITERIA)})", path, row=1)
    annotator = None
    ratings: Dict[str, Dict[str, int]] = {}
    for number, row in rows:
        name = row["annotator"].strip()
        if not name:
            raise SheetError("empty", path, number, "annotator")
        if annotator is None:
            annotator = name
        elif name != annotator:
            raise SheetError(f"annotator {name!r} differs from {annotator!r} above (one sheet per annotator)", path, number, "annotator")
        item = row["item"].strip()
        if item not in key:
            raise SheetError(f"item {item!r} is not in the key", path, number, "item")
        if item in ratings:
            raise SheetError(f"item {item!r} is rated twice", path, number, "item")
        scores = {}
        for criterion in criteria:
            try:
                scores[criterion.abbreviation] = parse_rating(row[criterion.name])
            except ValueError as error:
                raise SheetError(f"{error} for item {item!r}", path, number, criterion.name) from None
        ratings[item] = scores
    if annotator is None:
        raise SheetError("no rated rows", path)
    left_out = [item for item in key if item not in ratings]
    if left_out:
        shown = ", ".join(left_out[:5]) + (", ..." if len(left_out) > 5 else "")
        raise SheetError(f"{len(left_out)} item(s) of the key are not in the sheet: {shown}", path)
    return Sheet(path, annotator, ratings, [c.abbreviation for c in criteria])


def aggregate(sheet_paths: Sequence[PathLike], key_path: PathLike) -> Dict[str, Any]:
    """Per-system, per-criterion scores and inter-annotator agreement of filled sheets.

    Returns ``annotators``, ``systems``, ``criteria`` (abbreviation -> name), ``items``,
    ``dialogues``, ``scores[system][criterion]`` (``mean``, ``std``, ``majority_mean``,
    ``ratings``) and ``agreement[criterion or "all"]`` (``fleiss_kappa`` with two or
    more annotators, ``cohen_kappa`` with exactly two; ``None`` where undefined).
    """
    if not sheet_paths:
        raise ValueError("no sheets to aggregate")
    key = read_key(key_path)
    sheets = [read_sheet(path, key) for path in sheet_paths]
    seen: Dict[str, Path] = {}
    for sheet in sheets:
        if sheet.annotator in seen:
            raise SheetError(f"annotator {sheet.annotator!r} also has the sheet {seen[sheet.annotator]}", sheet.path)
        seen[sheet.annotator] = sheet.path
    if any(s.criteria != sheets[0].criteria for s in sheets):
        detail = "; ".join(f"{s.path}: {s.criteria}" for s in sheets)
        raise SheetError(f"sheets rate different criteria ({detail})", sheets[0].path)
    criteria = sheets[0].criteria
    names = {c.abbreviation: c.name for c in CRITERIA_SETS["all"]}
    systems = sorted({system for _, system in key.values()})
    scores: Dict[str, Dict[str, Any]] = {}
    for system in systems:
        items = [item for item, (_, s) in key.items() if s == system]
        scores[system] = {}
        for criterion in criteria:
            per_item = [[sheet.ratings[item][criterion] for sheet in sheets] for item in items]
            flat = [r for ratings in per_item for r in ratings]
            scores[system][criterion] = {
                "mean": statistics.fmean(flat),
                "std": statistics.pstdev(flat),
                "majority_mean": statistics.fmean(majority_rating(r) for r in per_item),
                "ratings": len(flat),
            }
    agreement: Dict[str, Dict[str, Optional[float]]] = {}
    if len(sheets) >= 2:
        for criterion in criteria + ["all"]:
            chosen = criteria if criterion == "all" else [criterion]
            subjects = [[sheet.ratings[item][c] for sheet in sheets] for item in key for c in chosen]
            entry: Dict[str, Optional[float]] = {"fleiss_kappa": fleiss_kappa(rating_table(subjects))}
            if len(sheets) == 2:
                entry["cohen_kappa"] = cohen_kappa([s[0] for s in subjects], [s[1] for s in subjects], SCALE)
            agreement[criterion] = entry
    return {
        "annotators": [s.annotator for s in sheets],
        "sheets": [str(s.path) for s in sheets],
        "systems": systems,
        "criteria": {c: names[c] for c in criteria},
        "items": len(key),
        "dialogues": len({dialogue for dialogue, _ in key.values()}),
        "scores": scores,
        "agreement": agreement,
    }


def render_results_markdown(results: Mapping[str, Any]) -> str:
    """The scores as a Markdown table (systems by criteria, means) and the agreement."""
    criteria = list(results["criteria"])
    lines = [
        "# Human evaluation",
        "",
        f"{results['items']} rated responses of {results['dialogues']} dialogues; annotators: {', '.join(results['annotators'])}. "
        "Mean of all ratings (1-5); in brackets the mean of the per-item majority rating.",
        "",
        "| system | " + " | ".join(criteria) + " |",
        "|---|" + "---|" * len(criteria),
    ]
    for system in results["systems"]:
        cells = [f"{results['scores'][system][c]['mean']:.2f} ({results['scores'][system][c]['majority_mean']:.2f})" for c in criteria]
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    if results["agreement"]:
        kinds = list(next(iter(results["agreement"].values())))
        lines += ["", "## Inter-annotator agreement", "", "| criterion | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
        for criterion, entry in results["agreement"].items():
            lines.append(f"| {criterion} | " + " | ".join("undefined" if entry[k] is None else f"{entry[k]:.3f}" for k in kinds) + " |")
    lines += ["", "Criteria: " + "; ".join(f"{c} = {n}" for c, n in results["criteria"].items()), ""]
    return "\n".join(lines)


def write_results(results: Mapping[str, Any], out_dir: PathLike) -> Tuple[Path, Path]:
    """``human_scores.json`` and ``human_scores.md`` in ``out_dir``."""
    out_dir = Path(out_dir)
    return write_json(out_dir / RESULTS_JSON, results), write_text_atomic(out_dir / RESULTS_MD, render_results_markdown(results))
