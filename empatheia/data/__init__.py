"""Datasets for training and evaluation: readers, media features, batches (and the emotion
fold of :mod:`empatheia.labels`, re-exported here).

See ``docs/data.md`` for the formats and a walk-through.
"""

from typing import TYPE_CHECKING

from ..lazy import lazy_attributes

# Loaded on first use: reading and checking a dataset's text needs neither torch nor the
# face detector, and the command line's parser reads FORMATS.
_EXPORTS = {
    "MediaFeatureCache": ".cache",
    "StageCollator": ".dataset",
    "StageDataset": ".dataset",
    "StageExample": ".dataset",
    "gold_feature_sources": ".dataset",
    "DataError": "..errors",
    "SkippedSample": "..errors",
    "SkipReport": "..errors",
    "FaceCropper": "..faces",
    "NoFaceError": "..faces",
    "EMOTION_FOLD": "..labels",
    "UnknownEmotionError": "..labels",
    "fold_emotion": "..labels",
    "FeatureSource": ".gold_features",
    "GoldFeatureExtractor": ".gold_features",
    "GoldFeatureStore": ".gold_features",
    "extract_gold_features": ".gold_features",
    "FORMATS": ".readers",
    "DialogueCorpus": ".readers",
    "PickedExample": ".readers",
    "as_label_sets": ".readers",
    "avamerg_dialogue": ".readers",
    "read_dataset": ".readers",
    "read_example": ".readers",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from ..errors import DataError as DataError, SkippedSample as SkippedSample, SkipReport as SkipReport
    from ..faces import FaceCropper as FaceCropper, NoFaceError as NoFaceError
    from ..labels import EMOTION_FOLD as EMOTION_FOLD, UnknownEmotionError as UnknownEmotionError, fold_emotion as fold_emotion
    from .cache import MediaFeatureCache as MediaFeatureCache
    from .dataset import StageCollator as StageCollator, StageDataset as StageDataset, StageExample as StageExample, gold_feature_sources as gold_feature_sources
    from .gold_features import FeatureSource as FeatureSource, GoldFeatureExtractor as GoldFeatureExtractor, GoldFeatureStore as GoldFeatureStore, extract_gold_features as extract_gold_features
    from .readers import FORMATS as FORMATS, DialogueCorpus as DialogueCorpus, PickedExample as PickedExample, as_label_sets as as_label_sets, avamerg_dialogue as avamerg_dialogue, read_dataset as read_dataset, read_example as read_example


__getattr__, __dir__ = lazy_attributes(__name__, globals(), _EXPORTS)
