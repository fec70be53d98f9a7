"""Evaluating a model fine-tuned on the user's own labels (issue 26): a labels argument may
be a YAML path or a `LabelSets`; `eval --checkpoint` reads and scores with the model's
label sets, and scoring files whose classes are not the default ones asks for `--labels`;
the profile predictions are written and scored per attribute; a metric that cannot apply
is null with its reason, "n/a (reason)" in the report."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import torch

from empatheia import Empatheia
from empatheia.data import StageDataset, read_dataset
from empatheia.data.check import check_dataset
from empatheia.evaluation.compare import system_row
from empatheia.evaluation.multimodal import MultimodalModels
from empatheia.evaluation.records import references_from_dialogues
from empatheia.evaluation.report import write_report
from empatheia.evaluation.scoring import RecordFiles, ScoreOptions, score
from empatheia.labels import LabelSets

from .test_eval_cli import read_jsonl, run_cli, write_jsonl
from .test_eval_multimodal import FakeExpression

LABELS_YAML = """emotions: [calm, stressed, upbeat]
profile: {gender: [male, female], accent: [us, uk]}
emotion_fold: {worried: stressed, excited: upbeat}
"""
DATA = [
    {"id": "a/1", "listener": {"gender": "female"}, "history": [{"role": "speaker", "text": "Still no call."}],
     "response": {"text": "Waiting is hard."}, "emotion": "worried"},
    {"id": "b/1", "listener": {"gender": "Male"}, "history": [{"role": "speaker", "text": "We moved in!"}],
     "response": {"text": "How exciting!"}, "emotion": "excited"},
    {"id": "c/1", "history": [{"role": "speaker", "text": "A quiet day at the lake."}],
     "response": {"text": "Sounds lovely."}, "emotion": "calm"},
]
# AvaMERG's fold knows every one of these labels (worried: fear, excited and calm: happy), so
# scored under the default label sets they would give numbers, all of them wrong.
GOLD = ["stressed", "upbeat", "calm"]


@pytest.fixture(scope="module")
def user(tmp_path_factory) -> SimpleNamespace:
    """The user's labels file, data and fine-tuned model, and one `eval --checkpoint` run
    of it without `--labels`."""
    folder = tmp_path_factory.mktemp("user")
    labels = folder / "labels.yaml"
    labels.write_text(LABELS_YAML)
    data = write_jsonl(folder / "avatar.jsonl", DATA)
    model = Empatheia.from_preset("tiny")
    model.set_label_sets(LabelSets.from_yaml(labels))
    model.save_pretrained(folder / "final")
    run = folder / "run"
    assert run_cli(["eval", "--checkpoint", str(folder / "final"), "--data", str(data), "--out", str(run),
                    "--max-new-tokens", "2", "--no-progress"]) == 0
    return SimpleNamespace(folder=folder, labels=labels, data=data, checkpoint=folder / "final", run=run, model=model)


def test_labels_may_be_a_path_or_label_sets(user):
    for given in (str(user.labels), user.labels, LabelSets.from_yaml(user.labels)):
        corpus = read_dataset(user.data, labels=given)
        references = references_from_dialogues(corpus.dialogues, given)
        assert [r["emotion"] for r in references] == GOLD
        assert check_dataset(user.data, labels=given, progress=False).ok
        predictions = [{"id": r["id"], "text": "Hm.", "emotion": g} for r, g in zip(references, GOLD)]
        assert score(predictions, references, ScoreOptions(labels=given))["emotion_accuracy"] == 1.0
        assert StageDataset(corpus, user.model.processor, 1, labels=given).labels.emotions == ["calm", "stressed", "upbeat"]
    with pytest.raises(TypeError, match=r"labels: expected a LabelSets or the path of a labels YAML file, got int"):
        read_dataset(user.data, labels=3)
    with pytest.raises(ValueError, match=r"absent.yaml: cannot read label sets"):
        read_dataset(user.data, labels=user.folder / "absent.yaml")


def test_eval_of_a_fine_tuned_checkpoint_needs_no_labels(user, tmp_path):
    metrics = json.loads((user.run / "metrics.json").read_text())
    assert metrics["count"] == 3 and metrics["emotion"]["labels"] == ["calm", "stressed", "upbeat"]
    assert [r["emotion"] for r in read_jsonl(user.run / "references.jsonl")] == GOLD
    # Scoring the run's files again: nothing in them says which labels folded them.
    files = ["eval", "--predictions", str(user.run / "predictions.jsonl"), "--references",
             str(user.run / "references.jsonl")]
    with pytest.raises(SystemExit) as raised:
        run_cli(files + ["--out", str(tmp_path / "a")])
    message = str(raised.value.code)
    assert "\n" not in message and re.search(
        r"^error: .*predictions.jsonl, record id 'a/1', field 'emotion_probabilities': the predictions' emotion classes "
        r"\['calm', 'stressed', 'upbeat'\] are not the default label sets' .*--labels LABELS.yaml", message), message
    assert not (tmp_path / "a" / "metrics.json").exists()
    assert run_cli(files + ["--out", str(tmp_path / "b"), "--labels", str(user.labels)]) == 0
    rescored = json.loads((tmp_path / "b" / "metrics.json").read_text())
    assert rescored["emotion_accuracy"] == metrics["emotion_accuracy"]


def test_profile_predictions_are_written_and_scored_per_attribute(user):
    predictions = read_jsonl(user.run / "predictions.jsonl")
    for prediction in predictions:
        assert set(prediction["profile"]) == {"gender", "accent"}
        for name, probabilities in prediction["profile_probabilities"].items():
            assert set(probabilities) == set(LabelSets.from_yaml(user.labels).profile[name])
            assert prediction["profile"][name] == max(probabilities, key=probabilities.get)
    references = read_jsonl(user.run / "references.jsonl")
    assert [r.get("listener_profile") for r in references] == [{"gender": "female"}, {"gender": "male"}, None]
    metrics = json.loads((user.run / "metrics.json").read_text())
    correct = sum(p["profile"]["gender"] == g for p, g in zip(predictions, ["female", "male"]))
    assert metrics["profile"]["gender"] == {"accuracy": correct / 2, "correct": correct, "n": 2}
    assert metrics["profile"]["accent"] == {"accuracy": None, "correct": 0, "n": 0}
    reason = metrics["not_applicable"]["profile.accent.accuracy"]
    assert reason.startswith("no gold values")
    report = (user.run / "report.md").read_text()
    assert f"| accent | 0 | 0 | n/a ({reason}) |" in report and "| gender |" in report


def test_profile_scores_hand_checked():
    predictions = [
        {"id": "a", "text": "x", "emotion": "sad", "profile": {"age": "young", "gender": "female"}},
        {"id": "b", "text": "x", "emotion": "sad", "profile": {"age": "elderly", "gender": "female"}},
        {"id": "c", "text": "x", "emotion": "sad", "profile": {"age": "young", "gender": "male"}},
    ]
    references = [
        {"id": "a", "response": "y", "emotion": "sad", "listener_profile": {"age": "Young", "gender": "female"}},
        {"id": "b", "response": "y", "emotion": "sad", "listener_profile": {"age": "young"}},
        {"id": "c", "response": "y", "emotion": "sad"},
    ]
    metrics = score(predictions, references)
    assert metrics["profile"] == {"age": {"accuracy": 0.5, "correct": 1, "n": 2},
                                  "gender": {"accuracy": 1.0, "correct": 1, "n": 1}}
    assert "not_applicable" not in metrics
    with pytest.raises(ValueError, match=r"record line 1, field 'profile_probabilities.age.young': should be a finite"):
        score([dict(predictions[0], profile_probabilities={"age": {"young": float("nan")}})], references[:1])


def test_metrics_that_cannot_apply_are_null_with_their_reason(user, tmp_path):
    labels = LabelSets.from_yaml(user.labels)
    # The chain names EmpatheticDialogues labels, which the user's fold does not know.
    predictions = [{"id": "a", "text": "Oh.", "emotion": "stressed", "chain_emotion": "anxious"},
                   {"id": "b", "text": "Ah.", "emotion": "calm", "chain_emotion": "sad"}]
    references = [{"id": "a", "response": "y", "emotion": "stressed"}, {"id": "b", "response": "y", "emotion": "calm"}]
    metrics = score(predictions, references, ScoreOptions(labels=labels))
    assert metrics["emotion_accuracy"] == 1.0 and metrics["chain_emotion_accuracy"] is None
    reason = metrics["not_applicable"]["chain_emotion_accuracy"]
    assert "'anxious'" in reason and "'calm'" in reason
    write_report(metrics, tmp_path)
    assert f"| Chain-of-Empathy emotion accuracy | n/a ({reason}) |" in (tmp_path / "report.md").read_text()
    row = system_row("empatheia", metrics, {}, multimodal=False)
    assert row["values"]["chain_emotion_accuracy"] is None and row["missing"]["chain_emotion_accuracy"] == reason

    unwritten = score([dict(p, chain_emotion=None) for p in predictions], references, ScoreOptions(labels=labels))
    assert unwritten["chain_emotion_accuracy"] is None
    assert unwritten["not_applicable"]["chain_emotion_accuracy"] == "no prediction's Chain of Empathy names an emotion"
    # Where some of the chain's emotions are the label sets' own, it is scored (the others are wrong).
    mixed = score([dict(predictions[0], chain_emotion="worried"), predictions[1]], references, ScoreOptions(labels=labels))
    assert mixed["chain_emotion_accuracy"] == 0.5 and "not_applicable" not in mixed


def test_facial_emotion_is_not_read_through_avamergs_fold(user, tmp_path):
    """FER reads AvaMERG-like classes; 'calm' is the user's own class, not AvaMERG's happy."""
    from empatheia.media import write_mp4

    write_mp4(tmp_path / "v.mp4", torch.full((12, 32, 32, 3), 128, dtype=torch.uint8), 25.0)
    predictions = [{"id": "a", "text": "Easy now.", "emotion": "calm", "video": "v.mp4"}]
    references = [{"id": "a", "response": "y", "emotion": "calm"}]
    models = MultimodalModels(transcriber=None, expression=FakeExpression({0: "happy"}), identity=None)
    options = ScoreOptions(labels=LabelSets.from_yaml(user.labels), multimodal=True, multimodal_models=models)
    metrics = score(predictions, references, options, RecordFiles(predictions_media=tmp_path))
    video, consistency = metrics["video"], metrics["consistency"]
    assert (video["facial_emotion_accuracy"], video["facial_emotion_scored"], video["facial_emotion_excluded"]) == (None, 0, 1)
    assert consistency["text_video_emotion_agreement"] is None and consistency["text_video_count"] == 0
    reasons = metrics["not_applicable"]
    assert "FER" in reasons["video.facial_emotion_accuracy"] and "'calm'" in reasons["video.facial_emotion_accuracy"]
    assert "FER" in reasons["consistency.text_video_emotion_agreement"]
    write_report(metrics, tmp_path)
    assert f"n/a ({reasons['video.facial_emotion_accuracy']})" in (tmp_path / "report.md").read_text()
