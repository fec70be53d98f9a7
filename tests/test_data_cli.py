"""`empatheia data check` and `empatheia data extract-features`."""

from __future__ import annotations

import json
import re

import pytest

from empatheia.cli import main
from empatheia.data import GoldFeatureStore

from .test_data_stages import TRAIN_CONVERSATION, write_avamerg

EXTRACTORS = "tests.test_data_stages:tiny_extractors"


def test_check_prints_counts_media_and_distributions(tmp_path, capsys):
    path, root = write_avamerg(tmp_path)
    assert main(["data", "check", str(path), "--media-root", str(root)]) == 0
    out = capsys.readouterr().out
    for line in (
        "conversations: 1",
        "turns (training examples): 2",
        "utterances: 4",
        "media files: audio 4 found, 0 missing, video 4 found, 0 missing",
        "listener profile age: elderly 2",
        "speaker profile gender: female 2",
        "emotion labels as written: anxious 1, apprehensive 1",
        "problems: 0, missing media files: 0",
    ):
        assert line in out
    assert re.search(r"^  fear +2 \(100\.0%\)$", out, re.M)


def test_check_decodes_media_and_names_every_bad_file(tmp_path, capsys):
    path, root = write_avamerg(tmp_path)
    assert main(["data", "check", str(path), "--media-root", str(root), "--decode"]) == 0  # real faces, real speech
    assert "media files decoded and checked: 8" in capsys.readouterr().out
    (root / "dia00042utt2_7.mp4").write_bytes(b"\x00" * 100)
    (root / "dia00042utt0_7.wav").unlink()
    assert main(["data", "check", str(path), "--media-root", str(root), "--decode"]) == 1
    out = capsys.readouterr().out
    assert f"problem: {root / 'dia00042utt2_7.mp4'}, record 00042/1, field 'turns[2].video': cannot decode video" in out
    assert f"missing: {root / 'dia00042utt0_7.wav'}" in out
    assert "problems: 1, missing media files: 1" in out


def test_check_reports_bad_records_and_exits_non_zero(tmp_path, capsys):
    conversation = json.loads(json.dumps(TRAIN_CONVERSATION))
    conversation["turns"][0]["chain_of_empathy"]["speaker_emotion"] = "bananas"
    conversation["turns"][1]["dialogue_history"][1]["role"] = "narrator"
    path = tmp_path / "train.json"
    path.write_text(json.dumps([conversation]))
    assert main(["data", "check", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"problem: {path}, record 00042/0, field 'turns[0].chain_of_empathy.speaker_emotion': unknown emotion 'bananas'" in out
    assert f"problem: {path}, record 00042/1, field 'turns[1].dialogue_history[1].role': unknown role 'narrator'" in out
    assert "problems: 2" in out


def test_check_stops_on_a_file_that_is_not_json(tmp_path):
    path = tmp_path / "train.json"
    path.write_text('[{"conversation_id": "1", "turns": [}]')
    with pytest.raises(SystemExit, match=rf"error: {path}: invalid JSON at line 1, column 37: Expecting value"):
        main(["data", "check", str(path)])


def test_custom_label_sets_from_yaml(tmp_path, capsys):
    labels = tmp_path / "labels.yaml"
    labels.write_text("emotions: [calm, stressed]\nprofile: {age: [young, old]}\nemotion_fold: {anxious: stressed, apprehensive: stressed}\n")
    conversation = json.loads(json.dumps(TRAIN_CONVERSATION))
    conversation["listener_profile"]["age"] = "old"
    conversation["speaker_profile"]["age"] = "young"
    path = tmp_path / "train.json"
    path.write_text(json.dumps([conversation]))
    assert main(["data", "check", str(path), "--labels", str(labels)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^  stressed +2 \(100\.0%\)$", out, re.M) and "listener profile age: old 2" in out
    labels.write_text("emotions: [calm]\ncolours: [red]\n")
    with pytest.raises(SystemExit, match=r"labels.yaml: unknown keys \['colours'\]"):
        main(["data", "check", str(path), "--labels", str(labels)])


def test_extract_features_writes_a_store_and_resumes(tmp_path, capsys):
    path, root = write_avamerg(tmp_path)
    out_dir = tmp_path / "gold"
    args = ["data", "extract-features", str(path), "--media-root", str(root), "--out", str(out_dir), "--extractor", EXTRACTORS]
    assert main(args + ["--shard-size", "1"]) == 0
    assert "2 of 2 responses have features" in capsys.readouterr().out
    store = GoldFeatureStore(out_dir)
    assert store.complete and sorted(store.feature_names) == ["speech_content", "speech_style", "speech_units", "video_content", "video_style"]
    assert main(args + ["--shard-size", "1"]) == 0  # a finished store is reused, not rebuilt
    with pytest.raises(SystemExit, match="new output directory"):
        main(args + ["--shard-size", "2"])


def test_extract_features_skips_bad_samples_on_request(tmp_path, capsys):
    path, root = write_avamerg(tmp_path)
    (root / "dia00042utt3_3.wav").write_bytes(b"broken")
    args = ["data", "extract-features", str(path), "--media-root", str(root), "--extractor", EXTRACTORS]
    with pytest.raises(SystemExit, match=r"dia00042utt3_3.wav, record 00042/1, field 'audio'"):
        main(args + ["--out", str(tmp_path / "a")])
    assert main(args + ["--out", str(tmp_path / "b"), "--skip-bad"]) == 0
    out = capsys.readouterr().out
    assert "skipped: " in out and "record 00042/1" in out
    assert "1 of 2 responses have features" in out and "1 sample(s) skipped" in out
    with pytest.raises(SystemExit, match="MODULE:NAME"):
        main(args + ["--out", str(tmp_path / "c"), "--extractor", "nonsense"])
