"""The Python walk-throughs in the docs run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


def python_blocks(path: Path):
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


@pytest.mark.parametrize("name", ["data.md"])
def test_doc_walkthrough_runs(name, tmp_path, monkeypatch, capsys):
    blocks = python_blocks(DOCS / name)
    assert blocks, f"{name} has no python example"
    monkeypatch.chdir(tmp_path)
    for block in blocks:
        exec(compile(block, f"{name}", "exec"), {"__name__": "__doc_example__"})
    printed = capsys.readouterr().out.splitlines()
    # one line of losses per stage, each finite
    assert [line.split()[0] for line in printed] == ["1", "2", "3", "4"]
    assert "nan" not in "".join(printed)


def test_training_example_runs(tmp_path, monkeypatch, capsys):
    """docs/training.md's Python example trains stage 1 and writes a loadable model."""
    from empatheia import Empatheia

    blocks = python_blocks(DOCS / "training.md")
    assert len(blocks) == 1
    (tmp_path / "configs").symlink_to(DOCS.parent / "configs")
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks[0], "training.md", "exec"), {"__name__": "__doc_example__"})
    final, steps = capsys.readouterr().out.split()[-2:]
    assert steps == "4" and Empatheia.from_pretrained(final).config.preset == "tiny"


def test_generation_example_runs(tmp_path, monkeypatch):
    """docs/generation.md's first example speaks, animates and saves."""
    block = python_blocks(DOCS / "generation.md")[0]
    monkeypatch.chdir(tmp_path)
    scope = {"__name__": "__doc_example__"}
    exec(compile(block, "generation.md", "exec"), scope)
    assert {p.name for p in (tmp_path / "answer").iterdir()} >= {"response.json", "response.wav", "response.mp4"}
    assert scope["response"].video.frames.shape[1:] == (256, 256, 3)
