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
