"""Building, loading and starting the variants that train models of their own (MERIA,
early fusion), and the data of their stages.

A variant's stage (:data:`~empatheia.stages.VARIANT_STAGES`, ``system`` other than
``empatheia``) runs in the same training loop as Empatheia's: :func:`start_variant_model`
gives the model it starts from, :func:`variant_stage_data` its examples
(:class:`~empatheia.variants.prefix.UtteranceDataset`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Dict, Optional, Union

import torch

from ..config import EmpatheiaConfig
from ..errors import SkipReport
from ..stages import get_stage
from .prefix import PrefixModel, UtteranceDataset, make_options, read_variant_config

PathLike = Union[str, Path]


def variant_models() -> Dict[str, type]:
    """The model class of each variant that trains one, by system name."""
    from .early_fusion import EarlyFusionModel
    from .meria import MeriaModel

    return {"meria": MeriaModel, "early_fusion": EarlyFusionModel}


def model_class(system: str) -> type:
    classes = variant_models()
    if system not in classes:
        raise ValueError(f"no trainable variant {system!r}; one of {sorted(classes)}")
    return classes[system]


def build_variant_model(system: str, preset: str = "tiny", options: Optional[dict] = None,
                        overrides: Optional[dict] = None, dtype: Optional[torch.dtype] = None) -> PrefixModel:
    """A fresh ``system`` model over ``preset``'s pretrained parts (never the weights the
    preset ships for Empatheia), with ``options`` (its options class's keys)."""
    from ..modeling import Empatheia

    cls = model_class(system)
    options = make_options(cls.options_class, options, f"{system} options")
    return cls(Empatheia.from_preset(preset, overrides, dtype=dtype, trained=False), options)


def load_variant_model(directory: PathLike, overrides: Optional[dict] = None,
                       dtype: Optional[torch.dtype] = None) -> PrefixModel:
    """A model saved by :meth:`~empatheia.variants.prefix.PrefixModel.save_pretrained` (a
    run's ``final/`` or the folder holding it)."""
    from ..modeling import CONFIG_NAME, TOKENIZER_DIR, Empatheia

    directory = Path(directory)
    if not (directory / CONFIG_NAME).is_file() and (directory / "final" / CONFIG_NAME).is_file():
        directory = directory / "final"
    system, saved = read_variant_config(directory)
    cls = model_class(system)
    config = EmpatheiaConfig.load_yaml(directory / CONFIG_NAME)
    if overrides:
        config.update(overrides)
    tokenizer = directory / TOKENIZER_DIR
    core = Empatheia(config, tokenizer_path=tokenizer if tokenizer.is_dir() else None, dtype=dtype)
    model = cls(core, make_options(cls.options_class, saved, str(directory / "variant.yaml")))
    model.load_trained_state_dict(model.read_trained_state(directory), source=str(directory))
    return model


def start_variant_model(config) -> PrefixModel:
    """The model a variant stage starts from: ``model.init`` (an earlier stage's output),
    or, where the stage (with the options' ablations) needs nothing trained before it, a
    fresh model over ``model.preset``."""
    from ..training.config import ConfigError
    from ..training.start import resolve_init

    stage = get_stage(config.stage)
    cls = model_class(stage.system)
    dtype = getattr(torch, config.model.dtype) if config.model.dtype else None
    try:
        options = make_options(cls.options_class, config.model.variant, "model.variant")
    except (TypeError, ValueError) as error:
        raise ConfigError(str(error)) from None
    if config.model.init is None:
        needed = cls.needs_init(stage, options)
        if needed:
            raise ConfigError(f"model.init: {needed}")
        try:
            return build_variant_model(stage.system, config.model.preset, config.model.variant,
                                       config.model.overrides, dtype)
        except (KeyError, ValueError) as error:
            raise ConfigError(f"model: {error}") from None
    directory = resolve_init(config.model.init, stage.number)
    try:
        model = load_variant_model(directory, config.model.overrides, dtype)
    except FileNotFoundError as error:
        raise ConfigError(f"model.init: {error} (a {stage.system} stage starts from an earlier {stage.system} stage's "
                          "output)") from None
    except (KeyError, ValueError) as error:
        raise ConfigError(f"model: {error}") from None
    if model.system != stage.system:
        raise ConfigError(f"model.init: {directory} holds a {model.system} model; stage {stage.name} trains {stage.system}")
    if model.config.preset is not None and model.config.preset != config.model.preset:
        raise ConfigError(f"model.preset is {config.model.preset!r} but {directory} was trained from the "
                          f"{model.config.preset!r} preset; set model.preset to match")
    differ = {k: (v, getattr(model.options, k)) for k, v in config.model.variant.items() if getattr(model.options, k) != v}
    fixed = {k: pair for k, pair in differ.items() if k not in cls.late_options}
    if fixed:
        details = ", ".join(f"{k}: {given!r} here, {saved!r} there" for k, (given, saved) in fixed.items())
        raise ConfigError(f"model.variant: {directory} was trained with other options ({details}); only "
                          f"{', '.join(cls.late_options) or 'none'} may change from one stage to the next")
    model.options = dataclasses.replace(model.options, **{k: given for k, (given, _) in differ.items()})
    return model


def variant_stage_data(config, model: PrefixModel):
    """The training (and evaluation) examples of a variant stage."""
    from ..data import MediaFeatureCache, read_dataset
    from ..training.config import ConfigError
    from ..training.data import StageData
    from .mcoe import load_mcoe_targets

    stage, data = get_stage(config.stage), config.data
    if data.labels is not None:
        raise ConfigError(f"data.labels: stage {stage.name} reads the model's own label sets (its preset's); "
                          "a dataset's own labels are not supported for the variants' stages")
    labels = model.label_sets()
    chains = None
    wants_chains, notes = model.reads_chains(stage)
    if wants_chains:
        if data.mcoe is None:
            raise ConfigError(f"data.mcoe: stage {stage.name} reads the multimodal chains; build them with "
                              "`empatheia variants mcoe DATA --out FILE.jsonl` and set data.mcoe to that file")
        chains = load_mcoe_targets(data.mcoe)
    skipped = SkipReport()
    cache = MediaFeatureCache(data.media_cache, model.processor.config) if data.media_cache else None

    def dataset(path: str) -> UtteranceDataset:
        corpus = read_dataset(path, format=data.format, media_root=data.media_root, labels=labels,
                              require_media=False, on_error=data.on_error)
        skipped.skipped.extend(corpus.skipped.skipped)
        return UtteranceDataset(corpus.dialogues, model.processor, stage, labels, chains, notes=notes,
                                on_error=data.on_error, media_cache=cache)

    return StageData(dataset(data.train), dataset(data.eval) if data.eval else None, labels, skipped)
