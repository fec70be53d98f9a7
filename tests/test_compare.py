"""`empatheia compare` on the tiny preset, and the time per answer that eval records."""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import weakref
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace
from typing import List

import pytest

from empatheia.errors import DataError
from empatheia.evaluation import cli as eval_cli
from empatheia.evaluation.compare import COLUMNS, FINE_DIR, MISSING, metric_value
from empatheia.evaluation.records import PREDICTION_FIELDS, prediction_record, validate_records
from empatheia.evaluation.scoring import score_files

from .conftest import shared_data

SYSTEMS = ["empatheia", "pipeline"]
FAST = ["--preset", "tiny", "--limit", "2", "--max-new-tokens", "6", "--no-progress"]


def run_cli(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="empatheia")
    eval_cli.add_eval_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.run(args)


def compare(out: Path, *extra: str, systems=SYSTEMS) -> int:
    data = shared_data("ed/ed_valid_response_examples.jsonl")
    return run_cli(["compare", "--systems", *systems, "--data", str(data), "--out", str(out), *FAST, *extra])


def read_json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """One comparison of two systems: ``(out folder, system objects' weak references in
    load order, whether each earlier one was gone when the next loaded)``."""
    out = tmp_path_factory.mktemp("compare")
    loaded, freed_before = [], []
    real = eval_cli.load_system

    def tracking(args):
        freed_before.append(all(ref() is None for ref in loaded))
        system = real(args)
        loaded.append(weakref.ref(system))
        return system

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(eval_cli, "load_system", tracking)
        assert compare(out) == 0
    return out, loaded, freed_before


def test_compare_writes_one_row_per_system_with_each_runs_own_values(compared):
    out, loaded, freed_before = compared
    comparison = read_json(out / "comparison.json")
    assert [row["system"] for row in comparison["rows"]] == SYSTEMS
    for row in comparison["rows"]:
        metrics = read_json(out / row["system"] / "metrics.json")
        fine = read_json(out / row["system"] / FINE_DIR / "metrics.json")
        assert (out / row["system"] / "report.html").is_file()  # everything eval writes
        for column in COLUMNS:
            source = fine if column.source == "fine" else metrics
            assert row["values"][column.name] == metric_value(source, column.key), column.name
        assert row["values"]["examples"] == 2 and row["values"]["dist_1"] == metrics["dist_1"]
        assert row["values"]["bleu_4"] == metrics["bleu"]["bleu_4"]
        # Text only: the speech and video columns are missing, and say what they need.
        assert row["values"]["speech_wer"] is None and "--speak" in row["missing"]["speech_wer"]
        assert "--animate" in row["missing"]["lip_sync_in_sync"]
    # One system alive at a time.
    assert len(loaded) == 2 and freed_before == [True, True]

    markdown = (out / "comparison.md").read_text(encoding="utf-8")
    table = [line for line in markdown.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(SYSTEMS)  # header, then a row per system
    assert [line.split("|")[1].strip() for line in table[1:]] == SYSTEMS
    assert all(line.count("|") == len(COLUMNS) + 2 for line in table)
    assert MISSING in table[1] and "needs --speak (or --animate) and --multimodal" in markdown

    page = (out / "comparison.html").read_text(encoding="utf-8")
    svgs = re.findall(r"<svg.*?</svg>", page, re.S)
    charted = [c for c in COLUMNS if c.better and any(r["values"][c.name] is not None for r in comparison["rows"])]
    assert len(svgs) == len(charted) > 0
    titles = [ET.fromstring(svg).find("{http://www.w3.org/2000/svg}title").text for svg in svgs]
    assert "Seconds per answer (lower is better)" in titles and "Dist-1 (higher is better)" in titles
    assert all(system in svg for svg in svgs for system in SYSTEMS)  # systems side by side


def test_the_runs_record_the_time_per_answer(compared):
    out, _, _ = compared
    for system in SYSTEMS:
        lines = (out / system / "predictions.jsonl").read_text(encoding="utf-8").splitlines()
        seconds = [json.loads(line)["seconds"] for line in lines]
        assert len(seconds) == 2 and all(s > 0 and round(s, 3) == s for s in seconds)
        latency = read_json(out / system / "metrics.json")["latency"]
        assert latency["answers"] == 2 and latency["seconds_mean"] > 0 and latency["seconds_median"] > 0
        assert latency["seconds_mean"] == pytest.approx(sum(seconds) / 2)


def test_rerunning_the_comparison_resumes_every_system(compared):
    out, _, _ = compared
    before = {s: (out / s / "predictions.jsonl").read_text(encoding="utf-8") for s in SYSTEMS}
    assert compare(out) == 0
    for system in SYSTEMS:
        assert read_json(out / system / "metrics.json")["run"]["generated"] == 0
        assert (out / system / "predictions.jsonl").read_text(encoding="utf-8") == before[system]
    assert [row["run"]["generated"] for row in read_json(out / "comparison.json")["rows"]] == [0, 0]


def test_a_failing_system_is_named_and_the_finished_ones_keep_their_folders(compared, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(compared[0] / "empatheia", out / "empatheia")  # finished before: resumes, no generation
    with pytest.raises(SystemExit, match=r"system 'pipeline' failed: no style table .*finished ones \(empatheia\)"):
        compare(out, "--styles", str(tmp_path / "missing.json"))
    assert (out / "empatheia" / "metrics.json").is_file()
    assert not (out / "comparison.json").exists()


def test_an_unknown_system_is_a_clear_error_listing_the_known_ones(tmp_path):
    with pytest.raises(SystemExit, match=r"unknown system 'e4rg' in 'e4rg'; known: empatheia, pipeline, e3rg, meria"):
        compare(tmp_path / "out", systems=["empatheia", "e4rg"])
    with pytest.raises(SystemExit, match="more than once"):
        compare(tmp_path / "out", systems=["pipeline", "pipeline"])
    with pytest.raises(SystemExit, match="more than once"):  # rows of one system need tags of their own
        compare(tmp_path / "out", systems=["meria:a=x", "meria:a=y"])
    with pytest.raises(SystemExit, match="SYSTEM:TAG"):
        compare(tmp_path / "out", systems=["meria:"])
    assert not (tmp_path / "out").exists()


def test_fine_labels_default_to_the_references_own_labels_as_ed32_does(tmp_path):
    """The chain names ED labels: folded onto 7 classes "grateful" matches "proud" (both
    happy); under the fine labels it does not, the same with or without ed32.yaml."""
    from empatheia.evaluation.compare import score_fine_labels
    from empatheia.labels import LabelSets

    lines = {
        "predictions.jsonl": [{"id": "a", "text": "Well done.", "emotion": "happy", "chain_emotion": "grateful"},
                              {"id": "b", "text": "I am sorry.", "emotion": "sad", "chain_emotion": "lonely"}],
        "references.jsonl": [{"id": "a", "response": "Yay.", "emotion": "happy", "emotion_label": "proud"},
                             {"id": "b", "response": "Oh.", "emotion": "sad", "emotion_label": "Lonely"}],
    }
    for name, records in lines.items():
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in records))
    assert score_files(tmp_path / "predictions.jsonl", tmp_path / "references.jsonl")["chain_emotion_accuracy"] == 1.0
    assert score_fine_labels(tmp_path)["chain_emotion_accuracy"] == 0.5
    assert read_json(tmp_path / FINE_DIR / "metrics.json")["chain_emotion_accuracy"] == 0.5
    ed32 = LabelSets.from_yaml(Path(__file__).resolve().parents[1] / "configs" / "labels" / "ed32.yaml")
    assert score_fine_labels(tmp_path, ed32)["chain_emotion_accuracy"] == 0.5


# ---------------------------------------------------------------------- seconds per answer
def _response():
    return SimpleNamespace(
        text="I am sorry.", emotion=SimpleNamespace(label="sad", probabilities={"sad": 1.0}),
        chain=SimpleNamespace(speaker_emotion="lonely"), chain_emotion=None,
    )


def test_prediction_record_with_and_without_seconds():
    dialogue = SimpleNamespace(id="c1/1")
    without = prediction_record(dialogue, _response())
    assert "seconds" not in without
    timed = prediction_record(dialogue, _response(), seconds=0.123456)
    assert timed["seconds"] == 0.123 and {k: v for k, v in timed.items() if k != "seconds"} == without
    assert validate_records([without, timed], PREDICTION_FIELDS)  # both are valid lines
    for bad in (-0.5, math.nan, math.inf, "1.2", True):
        with pytest.raises(DataError, match="seconds"):
            validate_records([dict(timed, seconds=bad)], PREDICTION_FIELDS)


def test_predictions_without_seconds_still_score(tmp_path):
    def write(name, records):
        path = tmp_path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        return path

    references = write("ref.jsonl", [{"id": "a", "response": "Oh no.", "emotion": "sad"},
                                     {"id": "b", "response": "Great!", "emotion": "happy"}])
    old = write("old.jsonl", [{"id": "a", "text": "So sad.", "emotion": "sad"},
                              {"id": "b", "text": "Nice!", "emotion": "happy"}])
    metrics = score_files(old, references)
    assert metrics["emotion_accuracy"] == 1.0 and "latency" not in metrics
    mixed = write("mixed.jsonl", [{"id": "a", "text": "So sad.", "emotion": "sad", "seconds": 0.5},
                                  {"id": "b", "text": "Nice!", "emotion": "happy"}])
    assert score_files(mixed, references)["latency"] == {"answers": 1, "seconds_mean": 0.5, "seconds_median": 0.5}
