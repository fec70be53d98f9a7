"""empatheia.io: files written whole or not at all, digests, JSON and JSONL."""

from __future__ import annotations

import hashlib
import os

import pytest

from empatheia.errors import DataError
from empatheia.io import (
    TEMP_PREFIX,
    atomic_path,
    file_digest,
    read_json,
    read_jsonl,
    remove_temporary_files,
    replace_path,
    temporary_path,
    write_json,
    write_jsonl,
    write_text_atomic,
)


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "deep" / "clip.wav"
    write_text_atomic(target, "old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(target) as temporary:
            assert temporary.parent == target.parent and temporary.suffix == ".wav"  # writers pick the format by it
            assert temporary.name.startswith(TEMP_PREFIX)
            temporary.write_text("half")
            raise KeyboardInterrupt
    assert target.read_text() == "old" and os.listdir(target.parent) == ["clip.wav"]
    with atomic_path(target) as temporary:
        temporary.write_text("new")
    assert target.read_text() == "new" and os.listdir(target.parent) == ["clip.wav"]


def test_folders_replace_or_keep_what_is_there(tmp_path):
    target = tmp_path / "entry"
    with atomic_path(target, directory=True) as staging:
        (staging / "a.txt").write_text("first")
    # A concurrent writer of the same content-addressed entry finished first: keep it.
    with atomic_path(target, directory=True, keep_existing=True) as staging:
        (staging / "a.txt").write_text("second")
    assert (target / "a.txt").read_text() == "first" and sorted(os.listdir(tmp_path)) == ["entry"]
    # Without keep_existing the new folder replaces the old one whole.
    other = tmp_path / ".other.tmp"
    other.mkdir()
    (other / "b.txt").write_text("b")
    replace_path(other, target)
    assert sorted(os.listdir(target)) == ["b.txt"] and not other.exists()


def test_leftovers_of_killed_writers_are_removed(tmp_path):
    leftover = temporary_path(tmp_path / "shard.safetensors")
    leftover.write_bytes(b"half")
    (tmp_path / "keep.txt").write_text("x")
    assert remove_temporary_files(tmp_path) == [leftover]
    assert os.listdir(tmp_path) == ["keep.txt"]


def test_json_lines_round_trip_and_name_bad_lines(tmp_path):
    records = [{"id": "a", "text": "line\u2028separator"}, {"id": "b", "text": "é"}]
    path = write_jsonl(tmp_path / "r.jsonl", records)
    assert read_jsonl(path) == [(1, records[0]), (2, records[1])]  # U+2028 does not end a line
    path.write_text('{"id": "a"}\n\n{broken\n')
    with pytest.raises(DataError, match=r"r.jsonl, record line 3: invalid JSON at column 2"):
        read_jsonl(path)
    (number, good), (bad_number, bad) = read_jsonl(path, keep_bad_lines=True)
    assert (number, good, bad_number) == (1, {"id": "a"}, 3) and isinstance(bad, DataError)
    with pytest.raises(DataError, match=r"nowhere.jsonl: file not found"):
        read_jsonl(tmp_path / "nowhere.jsonl")
    with pytest.raises(ValueError):
        write_json(tmp_path / "nan.json", {"x": float("nan")})  # not JSON
    assert read_json(write_json(tmp_path / "m.json", {"x": [1, 2]})) == {"x": [1, 2]}


def test_file_digest_is_the_sha256_of_the_bytes(tmp_path):
    data = os.urandom(3 << 20)  # several read blocks
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert file_digest(path) == hashlib.sha256(data).hexdigest()
