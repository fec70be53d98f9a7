"""Datasets for training and evaluation: readers, media features, batches (and the emotion
fold of :mod:`empatheia.labels`, re-exported here).

See ``docs/data.md`` for the formats and a walk-through.
"""

from .cache import MediaFeatureCache
from .dataset import StageCollator, StageDataset, StageExample, gold_feature_sources
from ..errors import DataError, SkippedSample, SkipReport
from ..faces import FaceCropper, NoFaceError
from ..labels import EMOTION_FOLD, UnknownEmotionError, fold_emotion
from .gold_features import FeatureSource, GoldFeatureExtractor, GoldFeatureStore, extract_gold_features
from .readers import FORMATS, DialogueCorpus, avamerg_dialogue, read_dataset

__all__ = [
    "DataError",
    "DialogueCorpus",
    "EMOTION_FOLD",
    "FORMATS",
    "FaceCropper",
    "FeatureSource",
    "GoldFeatureExtractor",
    "GoldFeatureStore",
    "MediaFeatureCache",
    "NoFaceError",
    "SkipReport",
    "SkippedSample",
    "StageCollator",
    "StageDataset",
    "StageExample",
    "UnknownEmotionError",
    "avamerg_dialogue",
    "extract_gold_features",
    "fold_emotion",
    "gold_feature_sources",
    "read_dataset",
]
