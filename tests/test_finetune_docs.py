"""docs/training.md's "Fine-tuning on your own avatar", run as a new user runs it: its labels
file and its commands exactly as written, from a folder outside the repository, on avatar
JSONL with real speech and face clips, a profile attribute of the user's own (``accent``)
and emotions that reach their classes through the fold. The only changes are the ones the
section itself names for a quick try: ``tiny`` wherever it says ``small``, and
``--set max_steps=2`` added to ``train``."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import List

import yaml

from .avatar_dataset import write_real_avatar_dataset

REPO = Path(__file__).resolve().parents[1]
SECTION = "## Fine-tuning on your own avatar"
QUICK_TRY = ("with `tiny`\nwherever they say `small`", "`--set max_steps=2` added to `train`")


def _section() -> str:
    text = (REPO / "docs" / "training.md").read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start:end if end >= 0 else None]


def _blocks(section: str, language: str) -> List[str]:
    """The fenced blocks of ``section`` whose info string is ``language`` ("" for plain)."""
    blocks, current, info = [], None, None
    for line in section.splitlines(keepends=True):
        if line.startswith("```"):
            if current is None:
                current, info = [], line[3:].strip()
            else:
                if info == language:
                    blocks.append("".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def _commands(section: str) -> List[str]:
    """The section's shell commands, one per line (``\\`` continuations joined)."""
    commands = []
    for block in _blocks(section, ""):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip().startswith("empatheia "):
                commands.append(line.strip())
    return commands


def _quick_try(command: str) -> str:
    """The substitutions the section names for a quick try on a CPU."""
    command = re.sub(r"\bsmall\b", "tiny", command)
    return command + " --set max_steps=2" if command.startswith("empatheia train ") else command


def test_the_documented_finetuning_path_runs_as_written(tmp_path):
    section = _section()
    flat = " ".join(section.split())
    for phrase in QUICK_TRY:
        assert " ".join(phrase.split()) in flat, f"training.md no longer names the quick try {phrase!r}"
    labels_block = next(b for b in _blocks(section, "yaml") if b.startswith("# my_avatar/labels.yaml"))
    commands = _commands(section)
    verbs = [shlex.split(c)[1] for c in commands]
    assert verbs == ["data", "data", "data", "data", "train", "respond", "eval"], commands
    assert all("--generators-of small" in c for c in commands if " extract-features " in c)
    assert "--labels" not in commands[-1] and "--extractor" not in section

    # The user's folder, outside the repository; their data beside the labels file the docs show.
    user = tmp_path / "user"
    assert REPO not in user.resolve().parents
    write_real_avatar_dataset(user / "my_avatar", train=4, val=2, seconds=0.8)
    (user / "my_avatar" / "labels.yaml").write_text(labels_block)
    assert yaml.safe_load(labels_block)["profile"]["accent"] == ["us", "uk"]

    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE"):
        env.pop(name, None)  # a group an earlier in-process test set up is not this one's
    outputs = []
    for command in map(_quick_try, commands):
        done = subprocess.run(shlex.split(command), cwd=user, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        outputs.append(done.stdout)

    # data check: both files read through the user's fold (anxious: built-in fear, then theirs).
    assert all("problems: 0" in out for out in outputs[:2])
    assert "stressed" in outputs[0] and "listener profile accent" in outputs[0]
    # train: the saved model classifies the user's classes and keeps their fold.
    final = user / "runs" / "finetune_avatar" / "final"
    saved = yaml.safe_load((final / "config.yaml").read_text())["style_disentangler"]
    assert saved["emotion_labels"] == ["calm", "stressed", "upbeat"]
    assert saved["profile_labels"] == {"gender": ["male", "female"], "accent": ["us", "uk"]}
    assert saved["emotion_fold"]["fear"] == "stressed"
    rows = [json.loads(line) for line in (final.parent / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 2 and "loss_cls_accent" in rows[-1] and "loss_cls_age" not in rows[-1]
    # respond: the documented dialogue, answered in the user's classes.
    response = json.loads((user / "answers" / "clinic-7" / "response.json").read_text())
    assert response["dialogue_id"] == "clinic-7/2" and response["emotion"]["label"] in saved["emotion_labels"]
    assert set(response["profile"]) == {"gender", "accent"}
    # eval, without --labels: gold emotions read through the saved fold, profiles scored per attribute.
    metrics = json.loads((user / "eval" / "finetune_avatar" / "metrics.json").read_text())
    assert metrics["count"] == 2 and metrics["emotion_accuracy"] is not None
    references = [json.loads(line) for line in (user / "eval" / "finetune_avatar" / "references.jsonl").read_text().splitlines()]
    assert [(r["emotion_label"], r["emotion"]) for r in references] == [("worried", "stressed"), ("anxious", "stressed")]
    assert set(metrics["profile"]) == {"gender", "accent"} and metrics["profile"]["accent"]["n"] == 2
