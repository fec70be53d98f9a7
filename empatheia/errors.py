"""Errors that say where bad data is, and the report of samples skipped on request."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Union


class DataError(ValueError):
    """Bad input data. The message starts with where the problem is: the file, the record
    (a conversation id, a line number) and the field, whichever are known."""

    def __init__(
        self,
        reason: str,
        file: Union[None, str, Path] = None,
        record: Optional[str] = None,
        field: Optional[str] = None,
    ):
        self.reason = reason
        self.file = str(file) if file is not None else None
        self.record = record
        self.field = field
        super().__init__(f"{self.where}: {reason}" if self.where else reason)

    @property
    def where(self) -> str:
        parts = []
        if self.file:
            parts.append(self.file)
        if self.record is not None:
            parts.append(f"record {self.record}")
        if self.field:
            parts.append(f"field {self.field!r}")
        return ", ".join(parts)


@dataclass
class SkippedSample:
    file: Optional[str]
    record: Optional[str]
    field: Optional[str]
    reason: str

    def __str__(self) -> str:
        return str(DataError(self.reason, self.file, self.record, self.field))


def skipped_or_raised(error: DataError, record: Optional[str], on_error: str) -> SkippedSample:
    """What a dataset gives for an example that raised ``error``: with ``on_error`` ``raise``
    the error, naming ``record`` where it named none; with ``skip`` the sample to list."""
    if error.record is None:
        error = DataError(error.reason, error.file, record, error.field)
    if on_error == "raise":
        raise error from None
    return SkippedSample(error.file, error.record, error.field, error.reason)


@dataclass
class SkipReport:
    """Every sample left out because the caller asked to skip bad samples, with its reason."""

    skipped: List[SkippedSample] = field(default_factory=list)

    def add(self, error: DataError) -> None:
        self.skipped.append(SkippedSample(error.file, error.record, error.field, error.reason))

    def __len__(self) -> int:
        return len(self.skipped)

    def summary(self) -> str:
        lines = [f"skipped: {s}" for s in self.skipped]
        lines.append(f"{len(self.skipped)} sample(s) skipped")
        return "\n".join(lines)
