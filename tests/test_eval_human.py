"""The human-evaluation kit: kappas on hand-computed cases, sheet export/aggregate round
trip (library and `empatheia human`), and bad sheets rejected with their file/row/column."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Dict, List

import pytest

from empatheia.data.readers import read_dataset
from empatheia.evaluation.human import (
    MULTIMODAL_CRITERIA,
    TEXT_CRITERIA,
    SheetError,
    aggregate,
    cohen_kappa,
    export_kit,
    fleiss_kappa,
    majority_rating,
    parse_rating,
    rating_table,
)

from .test_eval_cli import ED_CONVERSATIONS, ED_IDS, run_cli, write_jsonl

TEXT = ["Empathy", "Coherence", "Informativity", "Fluency"]


# ---------------------------------------------------------------------- agreement
def test_criteria_are_the_papers():
    assert [c.name for c in TEXT_CRITERIA] == TEXT
    assert [c.abbreviation for c in TEXT_CRITERIA] == ["Emp", "Coh", "Inf", "Flu"]
    assert [(c.abbreviation, c.name) for c in MULTIMODAL_CRITERIA] == [
        ("SCA", "Speech Content Accuracy"), ("VCA", "Video Content Accuracy"), ("SSA", "Speech Style Accuracy"),
        ("VSA", "Video Style Accuracy"), ("MCC", "Multimodal Content Consistency"),
        ("MSC", "Multimodal Style Consistency"),
    ]


def test_fleiss_kappa_perfect_agreement_is_one():
    ratings = [[1, 1, 1], [3, 3, 3], [5, 5, 5], [2, 2, 2]]
    assert fleiss_kappa(rating_table(ratings)) == pytest.approx(1.0)


def test_fleiss_kappa_textbook_example():
    """Fleiss (1971) as worked on Wikipedia: 10 subjects, 14 raters, 5 categories.
    P = 0.37802, P_e = 0.21276, kappa = (P - P_e) / (1 - P_e) = 4211/20059 = 0.20993."""
    table = [
        [0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
        [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7],
    ]
    assert fleiss_kappa(table) == pytest.approx(4211 / 20059, abs=1e-12)


def test_fleiss_kappa_small_hand_case_and_edges():
    # Two raters, four subjects: ratings (1,1), (2,2), (1,2), (2,1).
    # P_i = 1, 1, 0, 0 -> P = 0.5; p = (0.5, 0.5) -> P_e = 0.5; kappa = 0.
    assert fleiss_kappa(rating_table([[1, 1], [2, 2], [1, 2], [2, 1]])) == pytest.approx(0.0)
    # Every rating the same category: chance agreement is total, kappa undefined.
    assert fleiss_kappa(rating_table([[4, 4], [4, 4]])) is None
    with pytest.raises(ValueError, match="same number of ratings"):
        fleiss_kappa([[2, 0], [1, 0]])
    with pytest.raises(ValueError, match="at least 2 ratings"):
        fleiss_kappa([[1, 0]])
    with pytest.raises(ValueError, match="not one of the categories"):
        rating_table([[0, 1]])


def test_cohen_kappa_textbook_example():
    """50 items: both yes 20, A yes/B no 5, A no/B yes 10, both no 15.
    p_o = 35/50 = 0.7; p_e = 0.5*0.6 + 0.5*0.4 = 0.5; kappa = 0.4."""
    a = ["yes"] * 25 + ["no"] * 25
    b = ["yes"] * 20 + ["no"] * 5 + ["yes"] * 10 + ["no"] * 15
    assert cohen_kappa(a, b) == pytest.approx(0.4)
    assert cohen_kappa([1, 2, 3, 5], [1, 2, 3, 5]) == pytest.approx(1.0)
    assert cohen_kappa([3, 3], [3, 3]) is None
    with pytest.raises(ValueError, match="rated 2 and 1"):
        cohen_kappa([1, 2], [1])


def test_majority_and_rating_cells():
    assert majority_rating([4, 4, 2]) == 4
    assert majority_rating([1, 3, 5]) == 3  # no majority: the median
    assert majority_rating([2, 5]) == 2  # tie of two: the lower median
    assert parse_rating(" 4 ") == 4 and parse_rating("5.0") == 5
    for bad, message in (("", "missing"), ("6", "out of range"), ("0", "out of range"), ("3.5", "not a whole"),
                         ("good", "not a number")):
        with pytest.raises(ValueError, match=message):
            parse_rating(bad)


# ---------------------------------------------------------------------- export / aggregate
@pytest.fixture
def kit_inputs(tmp_path):
    data = write_jsonl(tmp_path / "ed.jsonl", ED_CONVERSATIONS)
    system_a = write_jsonl(tmp_path / "a.jsonl", [{"id": i, "text": f"Answer A to {i}", "emotion": "sad"} for i in ED_IDS])
    system_b = write_jsonl(tmp_path / "b.jsonl", [{"id": i, "text": f"Answer B to {i}", "emotion": "fear"} for i in ED_IDS[:4]])
    return data, {"A": system_a, "B": system_b}


def read_rows(path: Path) -> List[Dict[str, str]]:
    with open(path, encoding="utf-8-sig", newline="") as handle:
        return list(csv.DictReader(handle))


def fill(path: Path, ratings: Dict[str, Dict[str, int]], criteria=TEXT) -> None:
    """Write ``ratings[item][criterion]`` into a sheet (as a spreadsheet would save it)."""
    rows = read_rows(path)
    for row in rows:
        for criterion in criteria:
            row[criterion] = str(ratings[row["item"]][criterion])
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def key_rows(kit: Path) -> List[Dict[str, str]]:
    return read_rows(kit / "key.csv")


def test_export_writes_blind_seeded_sheets(tmp_path, kit_inputs):
    data, systems = kit_inputs
    dialogues = read_dataset(data).dialogues
    result = export_kit(dialogues, systems, tmp_path / "kit", n=3, annotators="ann,bob", seed=7)
    assert [p.name for p in result.sheets] == ["ann.csv", "bob.csv"]
    assert result.items == 6 and result.dialogues == 3 and result.criteria == TEXT  # auto: no media -> text

    key = key_rows(tmp_path / "kit")
    assert len(key) == 6 and {k["system"] for k in key} == {"A", "B"}
    chosen = {k["dialogue_id"] for k in key}
    assert chosen <= set(ED_IDS[:4])  # only dialogues every system answered
    assert all(sum(k["dialogue_id"] == d for k in key) == 2 for d in chosen)

    rows = read_rows(result.sheets[0])
    assert list(rows[0]) == ["annotator", "item", "dialogue", "response", "response_audio", "response_video", *TEXT, "comment"]
    assert [r["item"] for r in rows] == [k["item"] for k in key]
    assert all(r["annotator"] == "ann" and r[TEXT[0]] == "" for r in rows)
    by_item = {k["item"]: k for k in key}
    for row in rows:  # the response shown is the keyed system's, the system name is not shown
        k = by_item[row["item"]]
        assert row["response"] == f"Answer {k['system']} to {k['dialogue_id']}"
        assert row["dialogue"].startswith("Speaker: ")
    assert "system" not in rows[0]
    assert "Empathy" in (tmp_path / "kit" / "instructions.md").read_text()

    again = export_kit(dialogues, systems, tmp_path / "kit2", n=3, annotators=2, seed=7)
    assert key_rows(tmp_path / "kit2") == key
    assert [p.name for p in again.sheets] == ["A1.csv", "A2.csv"]
    with pytest.raises(FileExistsError, match="exported there already"):
        export_kit(dialogues, systems, tmp_path / "kit", n=3, annotators=2, seed=7)
    with pytest.raises(ValueError, match="asked for 5 dialogues but only 4"):
        export_kit(dialogues, systems, tmp_path / "kit3", n=5)


def test_export_multimodal_criteria_and_gold(tmp_path, kit_inputs):
    data, _ = kit_inputs
    speaking = write_jsonl(tmp_path / "s.jsonl", [
        {"id": i, "text": "Hi", "emotion": "sad", "audio": f"{i}.wav".replace("/", "_"), "video": "v.mp4"} for i in ED_IDS])
    result = export_kit(read_dataset(data).dialogues, {"S": speaking}, tmp_path / "kit", n=2, annotators=1)
    assert result.criteria == TEXT + [c.name for c in MULTIMODAL_CRITERIA]
    row = read_rows(result.sheets[0])[0]
    assert row["response_audio"].endswith(".wav") and row["response_video"] == "v.mp4"

    result = export_kit(read_dataset(data).dialogues, {"S": speaking}, tmp_path / "kit2", n=2, annotators=1,
                        include_gold=True, criteria="text")
    assert {k["system"] for k in key_rows(tmp_path / "kit2")} == {"S", "gold"}
    assert result.criteria == TEXT


def test_round_trip_means_and_agreement(tmp_path, kit_inputs):
    data, systems = kit_inputs
    result = export_kit(read_dataset(data).dialogues, systems, tmp_path / "kit", n=4, annotators=3, seed=1)
    key = key_rows(tmp_path / "kit")
    # A is always rated 4 on every criterion but Fluency (5), B 2; all three annotators agree,
    # except that A3 gives B's Empathy 3.
    ratings = {}
    for k in key:
        base = 4 if k["system"] == "A" else 2
        ratings[k["item"]] = {c: base + (c == "Fluency" and k["system"] == "A") for c in TEXT}
    for sheet in result.sheets:
        if sheet.stem == "A3":
            fill(sheet, {i: dict(r, Empathy=3 if r["Empathy"] == 2 else r["Empathy"]) for i, r in ratings.items()})
        else:
            fill(sheet, ratings)

    results = aggregate(result.sheets, tmp_path / "kit" / "key.csv")
    assert results["annotators"] == ["A1", "A2", "A3"] and results["systems"] == ["A", "B"]
    assert results["items"] == 8 and results["dialogues"] == 4
    assert list(results["criteria"]) == ["Emp", "Coh", "Inf", "Flu"]
    a, b = results["scores"]["A"], results["scores"]["B"]
    assert a["Emp"] == {"mean": 4.0, "std": 0.0, "majority_mean": 4.0, "ratings": 12}
    assert a["Flu"]["mean"] == 5.0 and b["Coh"]["mean"] == 2.0
    assert b["Emp"]["mean"] == pytest.approx((2 + 2 + 3) / 3) and b["Emp"]["majority_mean"] == 2.0
    # Coherence: subjects are 4 items rated (4,4,4) and 4 rated (2,2,2): perfect agreement.
    assert results["agreement"]["Coh"]["fleiss_kappa"] == pytest.approx(1.0)
    assert "cohen_kappa" not in results["agreement"]["Coh"]
    # Empathy by hand: 4 subjects (4,4,4) P_i=1; 4 subjects (2,2,3) P_i=(4+1-3)/6=1/3 -> P=2/3;
    # p = (2: 8/24, 3: 4/24, 4: 12/24) -> P_e = (64+16+144)/576 = 224/576; kappa = (2/3 - 7/18)/(11/18) = 5/11.
    assert results["agreement"]["Emp"]["fleiss_kappa"] == pytest.approx(5 / 11)


def test_two_annotators_get_cohen_kappa_too_and_the_cli_round_trip(tmp_path, kit_inputs, capsys):
    data, systems = kit_inputs
    kit, out = tmp_path / "kit", tmp_path / "scores"
    assert run_cli(["human", "export", "--data", str(data), "--predictions", f"A={systems['A']}",
                    "--predictions", str(systems["B"]), "--n", "2", "--annotators", "2", "--seed", "3",
                    "--out", str(kit)]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert [Path(s).name for s in exported["sheets"]] == ["A1.csv", "A2.csv"]
    key = key_rows(kit)
    assert {k["system"] for k in key} == {"A", "b"}  # an unnamed file is named by its stem
    levels = [1, 2, 3, 5]
    ratings = {k["item"]: {c: levels[n % 4] for c in TEXT} for n, k in enumerate(key)}
    for sheet in sorted((kit / "sheets").glob("*.csv")):
        fill(sheet, ratings)
    assert run_cli(["human", "aggregate", str(kit / "sheets"), "--out", str(out)]) == 0  # key found beside sheets/
    results = json.loads((out / "human_scores.json").read_text())
    assert results["agreement"]["Emp"] == {"fleiss_kappa": pytest.approx(1.0), "cohen_kappa": pytest.approx(1.0)}
    assert "| A |" in (out / "human_scores.md").read_text() and "| A |" in capsys.readouterr().out


# ---------------------------------------------------------------------- bad sheets
@pytest.fixture
def filled_kit(tmp_path, kit_inputs):
    data, systems = kit_inputs
    result = export_kit(read_dataset(data).dialogues, systems, tmp_path / "kit", n=2, annotators=2, seed=0)
    ratings = {k["item"]: {c: 3 for c in TEXT} for k in key_rows(tmp_path / "kit")}
    for sheet in result.sheets:
        fill(sheet, ratings)
    return tmp_path / "kit", result.sheets


def edit(path: Path, row: int, column: str, value: str) -> None:
    """Set a cell; ``row`` counts data rows from 0 (spreadsheet row ``row + 2``)."""
    rows = read_rows(path)
    rows[row][column] = value
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


@pytest.mark.parametrize(
    "row, column, value, message",
    [
        (1, "Fluency", "7", r"A2.csv, row 3, column 'Fluency': '7' is out of range \(ratings are 1-5\) for item"),
        (0, "Empathy", "", r"A2.csv, row 2, column 'Empathy': missing rating for item"),
        (2, "Coherence", "4.5", r"A2.csv, row 4, column 'Coherence': '4.5' is not a whole number"),
        (0, "Informativity", "great", r"A2.csv, row 2, column 'Informativity': 'great' is not a number"),
        (1, "item", "item-9999", r"A2.csv, row 3, column 'item': item 'item-9999' is not in the key"),
        (1, "annotator", "A7", r"A2.csv, row 3, column 'annotator': annotator 'A7' differs from 'A2'"),
    ],
)
def test_bad_cells_are_named(filled_kit, row, column, value, message):
    kit, sheets = filled_kit
    edit(sheets[1], row, column, value)
    with pytest.raises(SheetError, match=message):
        aggregate(sheets, kit / "key.csv")


def test_bad_sheets_are_named(filled_kit, tmp_path):
    kit, sheets = filled_kit
    key = kit / "key.csv"
    rows = read_rows(sheets[0])

    duplicate = tmp_path / "dup.csv"
    write_rows(duplicate, rows + [rows[0]])
    with pytest.raises(SheetError, match=r"dup.csv, row 6, column 'item': item '.*' is rated twice"):
        aggregate([duplicate, sheets[1]], key)

    short = tmp_path / "short.csv"
    write_rows(short, rows[:-1])
    with pytest.raises(SheetError, match=r"short.csv: 1 item\(s\) of the key are not in the sheet: item-0004"):
        aggregate([short, sheets[1]], key)

    no_criteria = tmp_path / "nocrit.csv"
    write_rows(no_criteria, [{k: v for k, v in r.items() if k not in TEXT} for r in rows])
    with pytest.raises(SheetError, match=r"nocrit.csv, row 1: no criterion column"):
        aggregate([no_criteria], key)

    with pytest.raises(SheetError, match=r"annotator 'A1' also has the sheet"):
        aggregate([sheets[0], sheets[0]], key)

    with pytest.raises(SystemExit, match=r"error: .*A1.csv, row 2, column 'Empathy': '0' is out of range"):
        edit(sheets[0], 0, "Empathy", "0")
        run_cli(["human", "aggregate", str(sheets[0]), str(sheets[1]), "--key", str(key), "--out", str(tmp_path / "o")])


def test_semicolon_sheets_from_spreadsheets_are_read(filled_kit):
    kit, sheets = filled_kit
    rows = read_rows(sheets[0])
    with open(sheets[0], "w", encoding="utf-8-sig", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]), delimiter=";")
        writer.writeheader()
        writer.writerows(rows)
    results = aggregate(sheets, kit / "key.csv")
    assert results["scores"]["A"]["Emp"]["mean"] == 3.0
    assert results["agreement"]["Emp"] == {"fleiss_kappa": None, "cohen_kappa": None}  # all 3s: undefined


def write_rows(path: Path, rows: List[Dict[str, str]]) -> None:
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
