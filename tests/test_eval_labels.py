"""`empatheia eval`: a gold emotion the label sets do not know is an error naming the file,
record and field, or, with `--skip-unknown-gold`, left out and counted; never a class of
its own. Probabilities in a predictions file are finite, non-negative numbers."""

from __future__ import annotations

import json

import pytest

from empatheia.errors import DataError
from empatheia.evaluation.scoring import ScoreOptions, score

from .test_eval_cli import run_cli, write_jsonl

PREDICTIONS = [
    {"id": "a", "text": "I am sorry.", "emotion": "sad"},
    {"id": "b", "text": "Great!", "emotion": "happy"},
    {"id": "c", "text": "Oh.", "emotion": "sad"},
]
REFERENCES = [
    {"id": "a", "response": "So sad.", "emotion": "sad"},
    {"id": "b", "response": "Yay.", "emotion": "happy"},
    {"id": "c", "response": "Wow.", "emotion": "flabbergasted"},
]


def files(tmp_path, predictions=PREDICTIONS, references=REFERENCES):
    return write_jsonl(tmp_path / "p.jsonl", predictions), write_jsonl(tmp_path / "r.jsonl", references)


def test_unknown_gold_emotion_is_an_error_naming_file_record_and_field(tmp_path):
    predictions, references = files(tmp_path)
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match=rf"error: {references}, record id 'c', field 'emotion': unknown gold emotion 'flabbergasted'"):
        run_cli(["eval", "--predictions", str(predictions), "--references", str(references), "--out", str(out)])
    assert not (out / "metrics.json").exists()
    raw = [dict(r, emotion="sad", emotion_label="flabbergasted") if r["id"] == "c" else r for r in REFERENCES]
    with pytest.raises(DataError, match="record id 'c', field 'emotion_label'"):
        score(PREDICTIONS, raw)


def test_skipped_unknown_gold_is_left_out_and_counted(tmp_path, capsys):
    predictions, references = files(tmp_path)
    out = tmp_path / "out"
    assert run_cli(["eval", "--predictions", str(predictions), "--references", str(references), "--out", str(out),
                    "--skip-unknown-gold"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["count"] == 2 and metrics["emotion_accuracy"] == 1.0 and metrics["emotion_macro_f1"] == 1.0
    assert metrics["skipped_unknown_gold"] == 1 and metrics["missing"]["unknown_gold"] == ["c"]
    emotion = metrics["emotion"]
    assert emotion["skipped_unknown_gold"] == 1 and emotion["unknown_predictions"] == 0
    assert "flabbergasted" not in emotion["labels"] and len(emotion["labels"]) == 7
    assert "1 reference(s) whose gold emotion the label sets do not know" in capsys.readouterr().err
    assert "reference with an unknown gold emotion" in (out / "report.md").read_text()


def test_unknown_predicted_emotion_is_wrong_not_a_class():
    metrics = score([dict(PREDICTIONS[0], emotion="neutral"), *PREDICTIONS[1:]], REFERENCES[:2],
                    ScoreOptions(allow_missing=True))
    emotion = metrics["emotion"]
    assert metrics["emotion_accuracy"] == 0.5 and emotion["unknown_predictions"] == 1
    assert emotion["labels"] == ["sad", "happy", "angry", "fear", "surprised", "contempt", "disgusted"]


@pytest.mark.parametrize("field, value, shown", [
    ("emotion_probabilities", float("nan"), "nan"),
    ("emotion_probabilities", float("inf"), "inf"),
    ("emotion_probabilities", -0.25, "-0.25"),
    ("emotion_probabilities", "lots", "'lots'"),
    ("chain_emotion_probabilities", float("nan"), "nan"),
    ("chain_emotion_probabilities", "0.5", "'0.5'"),
])
def test_bad_probabilities_name_file_record_and_field(tmp_path, field, value, shown):
    bad = [dict(PREDICTIONS[0], **{field: {"sad": value, "happy": 0.1}}), *PREDICTIONS[1:]]
    predictions, references = files(tmp_path, bad, REFERENCES[:2] + [dict(REFERENCES[2], emotion="fear")])
    with pytest.raises(SystemExit, match=rf"error: {predictions}, record line 1, field '{field}.sad': "
                                          rf"should be a finite, non-negative probability, got {shown}"):
        run_cli(["eval", "--predictions", str(predictions), "--references", str(references), "--out", str(tmp_path / "o")])
