"""Where a stage starts: a preset (stage 1) or what the previous stage wrote."""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import EmpatheiaConfig
from ..modeling import CONFIG_NAME, Empatheia
from .config import ConfigError, TrainConfig


def resolve_init(init: str, stage: int) -> Path:
    """A previous stage's output directory (its ``final/``) or a saved model directory."""
    path = Path(init)
    for candidate in (path / "final", path):
        if (candidate / CONFIG_NAME).is_file():
            return candidate
    if not path.exists():
        hint = "run the previous stage first" if stage > 1 else "check the path"
        raise ConfigError(f"model.init: {path} does not exist; stage {stage} starts from the previous stage's output ({hint})")
    raise ConfigError(
        f"model.init: {path} holds no trained model (neither {path / 'final' / CONFIG_NAME} nor {path / CONFIG_NAME}); "
        "the previous stage may not have finished: resume it with --resume"
    )


def start_model(config: TrainConfig, require_init: bool) -> Empatheia:
    """The model a run starts from: ``model.init`` if given (required when
    ``require_init``), else ``model.preset``; ``model.overrides`` apply to either."""
    dtype = getattr(torch, config.model.dtype) if config.model.dtype else None
    overrides = config.model.overrides
    if config.model.init is None:
        if require_init:
            raise ConfigError(
                f"model.init: stage {config.stage} starts from the previous stage's output directory; set model.init"
            )
        try:
            # Training starts from the preset's pretrained parts, never from weights it ships.
            return Empatheia.from_preset(config.model.preset, overrides, dtype=dtype, trained=False)
        except (KeyError, ValueError) as error:
            raise ConfigError(f"model: {error}") from None
    directory = resolve_init(config.model.init, config.stage)
    saved = EmpatheiaConfig.load_yaml(directory / CONFIG_NAME)
    if saved.preset is not None and saved.preset != config.model.preset:
        raise ConfigError(
            f"model.preset is {config.model.preset!r} but {directory} was trained from the {saved.preset!r} preset; "
            "set model.preset to match"
        )
    try:
        return Empatheia.from_pretrained(directory, overrides, dtype=dtype)
    except KeyError as error:
        raise ConfigError(f"model.overrides: {error}") from None

