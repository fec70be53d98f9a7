"""`empatheia respond` end to end on the tiny preset."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from empatheia.cli import main

from .test_dialogue_and_media import TRAIN_CONVERSATION, _media_root

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "conversation.json"


def test_respond_writes_response_json(tmp_path, capsys):
    assert main(["respond", str(EXAMPLE), "--preset", "tiny", "--out", str(tmp_path / "out"), "--max-new-tokens", "8"]) == 0
    data = json.loads((tmp_path / "out" / "response.json").read_text())
    assert data["dialogue_id"] == "demo-001/0"
    assert set(data) >= {"text", "chain_of_empathy", "emotion", "profile", "features"}
    printed = json.loads(capsys.readouterr().out)
    assert printed["text"] == data["text"]


def test_respond_from_a_checkpoint_with_media(tmp_path, model):
    model.save_pretrained(tmp_path / "ckpt")
    conversations = tmp_path / "train.json"
    conversations.write_text(json.dumps([TRAIN_CONVERSATION, {**TRAIN_CONVERSATION, "conversation_id": "00043"}]))
    root = _media_root(tmp_path, TRAIN_CONVERSATION)
    args = ["respond", str(conversations), "--checkpoint", str(tmp_path / "ckpt"), "--media-root", str(root),
            "--turn", "1", "--max-new-tokens", "4", "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit, match="holds 2 conversations.*--conversation"):
        main(args)
    assert main(args + ["--conversation", "00042"]) == 0
    data = json.loads((tmp_path / "out" / "response.json").read_text())
    assert data["dialogue_id"] == "00042/1"


def test_respond_reports_bad_input(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SystemExit, match="bad.json: not valid JSON"):
        main(["respond", str(bad), "--out", str(tmp_path / "o")])
    missing_media = tmp_path / "conv.json"
    missing_media.write_text(json.dumps(TRAIN_CONVERSATION))
    with pytest.raises(SystemExit, match=r"conv.json: .*dia00042utt0_7.wav, record 00042/1, .*audio file not found"):
        main(["respond", str(missing_media), "--media-root", str(tmp_path), "--out", str(tmp_path / "o")])


def test_module_entry_point_runs(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "empatheia", "respond", str(EXAMPLE), "--preset", "tiny", "--max-new-tokens", "4",
         "--out", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "[empatheia] wrote" in result.stderr
    assert (tmp_path / "o" / "response.json").is_file()


def test_set_overrides_the_model_config(tmp_path, model):
    from empatheia.cli import build_parser
    from empatheia.loading import load_model

    model.save_pretrained(tmp_path / "ckpt")
    for source in (["--preset", "tiny"], ["--checkpoint", str(tmp_path / "ckpt")]):
        args = build_parser().parse_args(["respond", str(EXAMPLE), *source, "--out", str(tmp_path / "o"),
                                          "--set", "loss.alpha=0.5", "language_model.max_new_tokens=4", "--set", "loss.beta=1e-1"])
        config = load_model(args).config
        assert (config.loss.alpha, config.loss.beta, config.language_model.max_new_tokens) == (0.5, 0.1, 4)
    with pytest.raises(SystemExit, match=r"error: --set 'loss.alpha': expected key=value"):
        main(["respond", str(EXAMPLE), "--preset", "tiny", "--out", str(tmp_path / "o"), "--set", "loss.alpha"])
    with pytest.raises(SystemExit, match=r"error: overrides: unknown config key 'loss.gama'"):
        main(["respond", str(EXAMPLE), "--preset", "tiny", "--out", str(tmp_path / "o"), "--set", "loss.gama=1"])
    with pytest.raises(SystemExit, match=r"error: --set only apply with --checkpoint/--preset"):
        main(["eval", "--predictions", "p.jsonl", "--references", "r.jsonl", "--out", str(tmp_path / "e"), "--set", "loss.alpha=1"])
