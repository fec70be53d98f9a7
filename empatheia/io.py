"""Files written whole or not at all, file digests, and JSON / JSONL reading and writing.

Atomic writes
-------------
Everything that a later run trusts (a predictions file it resumes from, a rendered clip
it skips, a cache entry, a feature shard, a checkpoint) is written under a temporary name
beside its target and renamed onto it once complete, so a process killed mid-write leaves
the old file or none, never half of one. :func:`atomic_path` yields that temporary path
to any writer (``soundfile``, PyAV, ``safetensors``, ``np.save``, a whole folder);
:func:`write_text_atomic` and :func:`write_bytes_atomic` cover the plain cases. The data
of a file is synced to disk before the rename and the folder after it, so a crash of the
machine (not only of the process) cannot leave a renamed but empty file either.

Temporary names are ``.tmp-<stem>.<pid><suffix>``: hidden, unique per process (two
processes may write one target at once), and ending with the target's suffix, since
writers such as PyAV and ``np.save`` choose the format from it.
:func:`remove_temporary_files` clears what killed runs left in a folder.

The rename replaces whatever entry has the target's name: a symbolic link planted there is
replaced by the new file, never followed, so a write never lands outside its folder.

Folder locks
------------
:func:`folder_lock` makes one process at a time the writer of an output folder (a
``respond --out``, an ``eval`` run folder): a second one gets a :class:`FolderLockedError`
naming the folder at once, rather than interleaving its files with the first's or appending
the same predictions twice. The lock is an ``flock`` on :data:`LOCK_NAME` inside the
folder, which the system drops when its process ends however it ends, so a killed run
leaves no stale lock; the file itself stays (removing it would let a third process lock a
new file while the second still holds the old one).

Reading
-------
:func:`read_text`, :func:`read_json` and :func:`read_jsonl` report a missing file, text
that is not UTF-8 and invalid JSON as a :class:`~empatheia.errors.DataError` naming the
file (and, for JSONL, the line).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any, Iterable, Iterator, List, Mapping, Optional, Tuple, Union

from .errors import DataError

PathLike = Union[str, Path]

TEMP_PREFIX = ".tmp-"
"""How every temporary name made here starts (see :func:`temporary_path`)."""


# ---------------------------------------------------------------------- atomic writes
def temporary_path(target: PathLike) -> Path:
    """The name ``target`` is written under before the rename:
    ``.tmp-<stem>.<pid><suffix>`` in the same folder (a rename is atomic only within one
    file system)."""
    target = Path(target)
    return target.with_name(f"{TEMP_PREFIX}{target.stem}.{os.getpid()}{target.suffix}")


def sync_path(path: PathLike) -> None:
    """Flush a file's or a folder's data to disk, where the platform allows it."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # folders cannot be synced on every platform
    finally:
        os.close(descriptor)


def replace_path(temporary: PathLike, target: PathLike, keep_existing: bool = False) -> Path:
    """Rename a complete file or folder onto ``target``, a file after syncing its data
    (a folder's files are left to its writer: syncing a checkpoint's gigabytes is its
    call).

    A folder cannot replace a non-empty folder in one rename: an existing ``target``
    folder is removed first, or, with ``keep_existing``, kept and ``temporary`` removed
    instead (for content-addressed targets that concurrent writers fill alike: the first
    to finish wins). ``keep_existing`` keeps an existing file the same way."""
    temporary, target = Path(temporary), Path(target)
    if temporary.is_file():
        sync_path(temporary)
    if target.exists() and keep_existing:
        _remove(temporary)
        return target
    if target.is_symlink():
        if temporary.is_dir():
            target.unlink()  # a folder cannot be renamed onto a link; the link goes, its target stays
    elif target.is_dir():
        shutil.rmtree(target)
    try:
        os.replace(temporary, target)
    except OSError:
        # Another writer's folder arrived between the check and the rename.
        if not (keep_existing and target.exists()):
            raise
        _remove(temporary)
    sync_path(target.parent)
    return target


@contextlib.contextmanager
def atomic_path(target: PathLike, directory: bool = False, keep_existing: bool = False) -> Iterator[Path]:
    """Yield the temporary path to write ``target`` to; when the block ends without an
    error it becomes ``target`` (:func:`replace_path`), and after an error it is removed.

    The target's folder is created. With ``directory`` the temporary folder is made (with
    the mode a new folder gets) for the block to fill; otherwise the block creates the
    file itself, e.g. ``with atomic_path(out / "a.wav") as tmp: write_wav(tmp, ...)``.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = temporary_path(target)
    _remove(temporary)  # left by a killed process that had our pid
    if directory:
        temporary.mkdir()
    try:
        yield temporary
        replace_path(temporary, target, keep_existing=keep_existing)
    except BaseException:
        _remove(temporary)
        raise


def write_bytes_atomic(path: PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` whole or not at all (:func:`atomic_path`)."""
    with atomic_path(path) as temporary:
        temporary.write_bytes(data)
    return Path(path)


def write_text_atomic(path: PathLike, text: str) -> Path:
    """Write ``text`` as UTF-8 to ``path`` whole or not at all (:func:`atomic_path`)."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def remove_temporary_files(directory: PathLike) -> List[Path]:
    """Delete the temporary files (:data:`TEMP_PREFIX`) that killed writers left directly
    in ``directory``; only call it where no other process is writing. Returns them."""
    removed = [path for path in Path(directory).glob(f"{TEMP_PREFIX}*") if path.is_file()]
    for path in removed:
        path.unlink(missing_ok=True)
    return removed


# ---------------------------------------------------------------------- folder locks
LOCK_NAME = ".empatheia.lock"
"""The file inside an output folder that :func:`folder_lock` locks."""


class FolderLockedError(OSError):
    """Another process is writing the output folder this one was asked to write."""

    def __init__(self, folder: PathLike):
        self.folder = Path(folder)
        super().__init__(
            f"{self.folder} is being written by another run (it holds the lock on {self.folder / LOCK_NAME}); "
            "wait for that run to finish, or use another output folder"
        )


_held = threading.local()


@contextlib.contextmanager
def folder_lock(folder: PathLike) -> Iterator[Path]:
    """Hold the exclusive lock of output ``folder`` (created if absent) for the block, or
    raise :class:`FolderLockedError` at once when another process or thread holds it.

    Nested blocks of one thread on the same folder share the lock (an ``eval`` run locks
    its folder, and so does the scoring inside it). Yields the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(folder)
    counts = _held.__dict__.setdefault("counts", {})
    if counts.get(key):
        counts[key] += 1
        try:
            yield folder
        finally:
            counts[key] -= 1
        return
    descriptor = _open_lock_file(folder / LOCK_NAME)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FolderLockedError(folder) from None
        counts[key] = 1
        try:
            yield folder
        finally:
            del counts[key]
    finally:
        os.close(descriptor)  # closing the last descriptor of the file releases the lock


def _open_lock_file(path: Path) -> int:
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        return os.open(path, flags, 0o644)
    except OSError as error:
        if error.errno != errno.ELOOP:
            raise
    # A link planted at the lock's name is never a lock anyone holds: it goes, unfollowed.
    path.unlink()
    return os.open(path, flags, 0o644)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


# ---------------------------------------------------------------------- digests
def file_digest(path: PathLike, algorithm: str = "sha256") -> str:
    """Hex digest of a file's bytes (read in 1 MiB blocks, so any size fits in memory)."""
    digest = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------------- JSON and JSONL
NESTING_REASON = "JSON nested too deeply for the parser (no dataset record nests more than a few levels)"
"""Python's JSON parser recurses once per level and gives up near 1000 levels."""


def read_text(path: PathLike) -> str:
    """A UTF-8 text file; a missing file or other bytes are a :class:`DataError`."""
    path = Path(path)
    if path.is_dir():
        raise DataError("is a folder, not a file", file=path)
    if not path.is_file():
        raise DataError("file not found", file=path)
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        # Windows editors save "Unicode" as UTF-16: say so rather than show a byte offset.
        found = " (it is UTF-16: it starts with a UTF-16 byte-order mark)" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise DataError(f"not UTF-8 text{found}; save it as UTF-8 ({error})", file=path) from None


def parse_json(text: str, path: PathLike) -> Any:
    """``text`` (the content of ``path``) as one JSON value."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise DataError(f"invalid JSON at line {error.lineno}, column {error.colno}: {error.msg}", file=path) from None
    except RecursionError:
        raise DataError(NESTING_REASON, file=path) from None


def parse_jsonl(text: str, path: PathLike, keep_bad_lines: bool = False) -> List[Tuple[int, Any]]:
    """``(line number, value)`` for every non-blank line of ``text`` (the content of
    ``path``). A line that is not JSON is a :class:`DataError` naming it; with
    ``keep_bad_lines`` that error is returned as the line's value instead, so a reader
    can skip that line alone."""
    records: List[Tuple[int, Any]] = []
    # Only "\n" ends a line: str.splitlines would also split at U+2028 and the like, which
    # JSON strings may hold unescaped.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            records.append((number, json.loads(line)))
        except (json.JSONDecodeError, RecursionError) as error:
            reason = f"invalid JSON at column {error.colno}: {error.msg}" if isinstance(error, json.JSONDecodeError) else NESTING_REASON
            bad = DataError(reason, file=path, record=f"line {number}")
            if not keep_bad_lines:
                raise bad from None
            records.append((number, bad))
    return records


def read_json(path: PathLike) -> Any:
    """A JSON file's value (errors as in :func:`read_text` and :func:`parse_json`)."""
    return parse_json(read_text(path), path)


def read_jsonl(path: PathLike, keep_bad_lines: bool = False) -> List[Tuple[int, Any]]:
    """A JSONL file's ``(line number, value)`` pairs (see :func:`parse_jsonl`)."""
    return parse_jsonl(read_text(path), path, keep_bad_lines)


def json_line(record: Any) -> str:
    """One JSONL line: compact, non-ASCII kept, ending in a newline."""
    return json.dumps(record, ensure_ascii=False) + "\n"


def write_json(path: PathLike, data: Any, indent: Optional[int] = 2) -> Path:
    """``data`` as indented JSON, written atomically; NaN and infinity are an error (they
    are not JSON)."""
    return write_text_atomic(path, json.dumps(data, indent=indent, ensure_ascii=False, allow_nan=False) + "\n")


def write_jsonl(path: PathLike, records: Iterable[Mapping[str, Any]]) -> Path:
    """One :func:`json_line` per record, written atomically."""
    return write_text_atomic(path, "".join(json_line(record) for record in records))
