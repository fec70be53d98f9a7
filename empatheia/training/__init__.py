"""Training: the four curriculum stages (§5, :mod:`empatheia.stages`) and downstream
fine-tuning.

The recipe in the top-level ``training/`` package (``training/recipe.py``) composes these
parts for any stage; run it with ``empatheia train configs/train/stage1_coe.yaml``. See
``docs/training.md``.
"""

from .checkpoint import TrainerState, checkpoints, latest_checkpoint
from .config import ConfigError, TrainConfig, load_train_config
from .data import StageData, build_stage_data, label_sets
from .loop import TrainingDiverged, TrainResult, evaluate, train
from .start import resolve_init, start_model

__all__ = [
    "ConfigError",
    "StageData",
    "TrainConfig",
    "TrainResult",
    "TrainerState",
    "TrainingDiverged",
    "build_stage_data",
    "checkpoints",
    "evaluate",
    "label_sets",
    "latest_checkpoint",
    "load_train_config",
    "resolve_init",
    "start_model",
    "train",
]
