"""Datasets for training and evaluation: readers, label folding, media features, batches."""

from .errors import DataError, SkipReport, SkippedSample

__all__ = ["DataError", "SkipReport", "SkippedSample"]
