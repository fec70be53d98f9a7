"""Where a stage starts: a preset (stage 1), what the previous stage wrote, or a trained
model named by its preset (fine-tuning)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Union

import torch

from ..config import EmpatheiaConfig
from ..config_loader import preset_names
from ..modeling import CONFIG_NAME, Empatheia
from . import checkpoint as ckpt
from .config import ConfigError, TrainConfig

FAILED_NAME = "failed.json"
"""Written into ``output_dir`` by a run that stopped with an error: what stopped it, at
which step, and the last complete checkpoint (if any)."""


def resolve_init(init: str, stage: Union[int, str], presets: bool = False) -> Union[Path, str]:
    """What ``model.init`` names: a previous stage's output directory (its ``final/``), a
    saved model directory, or, with ``presets`` and where no such folder exists, a preset's
    name (returned as a ``str``: the model ``Empatheia.from_preset(name)`` gives, with the
    weights it ships)."""
    path = Path(init)
    for candidate in (path / "final", path):
        if (candidate / CONFIG_NAME).is_file():
            return candidate
    if not path.exists():
        if presets and init in preset_names():
            return init
        hint = "run the previous stage first" if stage != 1 else "check the path"
        also = f", a folder written by save_pretrained, or a preset's trained model: one of {preset_names()}" if presets else ""
        raise ConfigError(f"model.init: {path} does not exist; stage {stage} starts from the previous stage's output ({hint}){also}")
    raise ConfigError(f"model.init: {path} holds no trained model (no {path / 'final' / CONFIG_NAME}): {why_unfinished(path)}")


def why_unfinished(output_dir: Path) -> str:
    """What became of the run in ``output_dir`` that wrote no ``final/``, and what to do."""
    last = ckpt.latest_checkpoint(output_dir)
    failure = read_failure(output_dir)
    settings = output_dir / "train_config.yaml"
    # The run's resolved config reruns it exactly; without one, the stage's own config does.
    command, which = (f"empatheia train {settings}", "") if settings.is_file() else ("empatheia train CONFIG.yaml", " with that stage's config")
    rerun, resume = f"`{command}`{which}", f"`{command} --resume`{which}"
    if failure is not None:
        said = f"its run failed at step {failure.get('step', 0)} with {failure.get('error', 'an error')}"
        if last is None:
            return (f"{said}, before writing any checkpoint, so there is nothing to resume; fix the cause and run "
                    f"that stage again ({rerun})")
        return (f"{said}; its last complete checkpoint is {last.name}: fix the cause, then continue it with {resume} "
                "or run it again in a new output_dir")
    if last is None:
        return f"the run there did not finish and wrote no checkpoint, so there is nothing to resume: run that stage again ({rerun})"
    return f"the run there stopped at {last.name} before finishing: continue it with {resume}"


def read_failure(output_dir: Path) -> Optional[dict]:
    """The record a failed run left in ``output_dir`` (:data:`FAILED_NAME`), or ``None``."""
    try:
        record = json.loads((Path(output_dir) / FAILED_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def start_model(config: TrainConfig, require_init: bool) -> Empatheia:
    """The model a run starts from: ``model.init`` if given (required when
    ``require_init``), else ``model.preset``; ``model.overrides`` apply to either."""
    dtype = getattr(torch, config.model.dtype) if config.model.dtype else None
    overrides = config.model.overrides
    preset = config.model.preset
    if config.model.init is None:
        if require_init:
            raise ConfigError(
                f"model.init: stage {config.stage} starts from the previous stage's output directory, a folder "
                f"written by save_pretrained, or a preset's trained model ({', '.join(preset_names())}); set model.init"
            )
        if preset is None:
            raise ConfigError(f"model.preset: stage {config.stage} builds a preset's model; set model.preset")
        try:
            # Training starts from the preset's pretrained parts, never from weights it ships.
            return Empatheia.from_preset(preset, overrides, dtype=dtype, trained=False)
        except (KeyError, ValueError) as error:
            raise ConfigError(f"model: {error}") from None
    source = resolve_init(config.model.init, config.stage, presets=True)
    if isinstance(source, str):
        if preset is not None and preset != source:
            raise ConfigError(
                f"model.init is the {source!r} preset but model.preset is {preset!r}; set model.preset to "
                f"{source} (or null: the preset of model.init)"
            )
        try:
            # The preset's trained model, as Empatheia.from_preset gives it, shipped weights and all.
            return Empatheia.from_preset(source, overrides, dtype=dtype)
        except (KeyError, ValueError) as error:
            raise ConfigError(f"model: {error}") from None
    saved = EmpatheiaConfig.load_yaml(source / CONFIG_NAME)
    if preset is not None and saved.preset is not None and saved.preset != preset:
        raise ConfigError(
            f"model.preset is {preset!r} but {source} was trained from the {saved.preset!r} preset; "
            "set model.preset to match (or null: the preset of model.init)"
        )
    try:
        return Empatheia.from_pretrained(source, overrides, dtype=dtype)
    except KeyError as error:
        raise ConfigError(f"model.overrides: {error}") from None
