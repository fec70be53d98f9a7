"""The configuration of one training run, read from a stage's YAML file.

The recipe (``training/recipe.py``) reads a :class:`TrainConfig`, whose ``stage`` says
what the run trains (:mod:`empatheia.stages`); ``empatheia train CONFIG.yaml --set
key=value`` overrides any key by its dotted name (``optim.learning_rate=1e-4``), read by
the package's one config loader (:mod:`empatheia.config_loader`). Table 9 of the paper
gives the defaults of :class:`OptimConfig`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import yaml

from ..config_loader import PRESETS_PACKAGE as CONFIGS_PACKAGE
from ..config_loader import ConfigError, load_dataclass, parse_sets, read_yaml_mapping
from ..stages import STAGES, VARIANT_STAGES, get_stage

# Configs written when each stage had a recipe module of its own name it under `recipe`;
# the stage alone decides now, so the key is read and dropped.
_RETIRED_KEYS = ("recipe",)


@dataclass
class ModelSection:
    preset: Optional[str] = "tiny"
    """The preset a stage-1 run builds; later stages check that their starting point was
    trained from the same preset (``null``: whichever ``init`` was)."""
    init: Optional[str] = None
    """Where to start: the previous stage's output directory (its ``final/`` is loaded), a
    directory written by ``save_pretrained``, or a preset's name (``small``, ``tiny``,
    ``paper``: its trained model, as ``Empatheia.from_preset(name)`` gives it, with the
    weights the package ships for it) where no folder of that name exists. Required from
    stage 2 on."""
    overrides: Dict[str, Any] = field(default_factory=dict)
    """Dotted model config keys, e.g. ``language_model.pretrained: /models/vicuna-7b``."""
    dtype: Optional[str] = None
    """Weights of the language model: ``bfloat16``, ``float16`` or ``float32``."""
    gradient_checkpointing: bool = False
    variant: Dict[str, Any] = field(default_factory=dict)
    """A variant stage's model options (:class:`~empatheia.variants.meria.MeriaOptions`,
    :class:`~empatheia.variants.early_fusion.EarlyFusionOptions`), e.g. MERIA's ablations
    ``use_pdr: false``. A stage that starts from ``init`` keeps the options it was saved
    with; any given here must agree with them."""


@dataclass
class DataSection:
    train: Optional[str] = None
    """The training file: AvaMERG JSON, EmpatheticDialogues JSONL or avatar JSONL (stage 1
    also takes text-only files)."""
    eval: Optional[str] = None
    format: str = "auto"
    media_root: Optional[str] = None
    gold_features: Optional[str] = None
    """Gold generator features of ``train`` (stages 2-4), from ``empatheia data
    extract-features``."""
    eval_gold_features: Optional[str] = None
    labels: Optional[str] = None
    """A YAML of the dataset's own label sets (``emotions``, ``profile``,
    ``emotion_fold``, ``emotion_fold_replace``); default: the model's."""
    media_cache: Optional[str] = None
    text_only_share: float = 0.0
    """Stage 4: the share of training examples (chosen by a hash of their id, so the same
    ones every epoch) shown without their turns' speech and video, as a user who only
    types is. Their signal states then train the Style Disentangler too, and its running
    statistics cover both kinds of prompt."""
    text_train: Optional[str] = None
    """Stage 4: a file of more dialogues read as text alone (any readable format; media
    and gold features are not needed, e.g. stage 1's file). They join ``train`` and train
    L_emp and the Style Disentangler's classifiers (eq. 11), which learn to read the
    emotion from the dialogue; L_ccl and L_sal leave them out. Rendering media for every
    dialogue is slow, so a split whose rendered part is small gives the classifiers far
    fewer examples than the language core has."""
    on_error: str = "raise"
    """``raise`` at the first unusable example, or ``skip`` it and list it in
    ``skipped.jsonl``."""
    num_workers: int = 0
    mcoe: Optional[str] = None
    """MERIA: the multimodal chains of ``train`` (and ``eval``) by dialogue id, a JSONL
    file from ``empatheia variants mcoe``: the M-CoE stage's targets and what the Response
    LLM reads."""


@dataclass
class OptimConfig:
    """AdamW with warm-up and a decaying schedule; the defaults are Table 9's."""

    batch_size: int = 4
    """Micro-batch per process."""
    gradient_accumulation_steps: int = 8
    learning_rate: float = 5e-5
    head_learning_rate: Optional[float] = None
    """Learning rate of the projectors and both heads, which train from scratch in the
    stages that add them while LoRA only adapts the core (``None``: ``learning_rate``)."""
    weight_decay: float = 0.001
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    max_grad_norm: float = 1.0
    scheduler: str = "cosine"
    """``cosine``, ``linear`` or ``constant`` (all after ``warmup_steps``)."""
    warmup_steps: int = 0


@dataclass
class TrainConfig:
    stage: Union[int, str] = 1
    """The stage it trains (1-4, :data:`empatheia.stages.STAGES`, or a variant's stage by
    name, :data:`empatheia.stages.VARIANT_STAGES`); fine-tuning is a stage too (4, with
    ``data.labels``)."""
    max_steps: int = 1000
    """Optimizer steps (each ``batch_size x gradient_accumulation_steps x processes``
    examples)."""
    output_dir: str = "runs/stage1_coe"
    seed: int = 42
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    optim: OptimConfig = field(default_factory=OptimConfig)
    mixed_precision: str = "auto"
    """``auto`` (bf16 on GPUs that have it, else fp16 on GPUs; on the CPU bf16 autocast where
    the processor computes bf16 natively, else none), ``bf16``,
    ``fp16`` or ``no``."""
    deepspeed: Optional[str] = None
    """A DeepSpeed JSON (``configs/deepspeed/zero2.json``); ``null`` runs ZeRO stage 0."""
    logging_steps: int = 10
    eval_steps: Optional[int] = None
    save_steps: int = 500
    save_total_limit: Optional[int] = 3
    """Keep this many newest checkpoints (``null``: all)."""
    max_consecutive_skipped_steps: int = 10
    """The most optimizer steps in a row whose update DeepSpeed may skip (its overflow check
    found inf or NaN in the gradients) before the run stops as diverging. fp16 loss scaling
    skips a few steps at the start while the scale settles from 2^16 (each skip halves it)
    and one now and then when it tries a larger scale; a diverging run skips every step.
    Not under ``optim``, so a run stopped by it can be resumed with a higher budget."""
    tensorboard: bool = True
    progress: bool = True

    def validate(self, source: str = "config") -> "TrainConfig":
        def bad(key: str, message: str) -> ConfigError:
            return ConfigError(f"{source}: {key}: {message}")

        if self.stage not in STAGES and self.stage not in VARIANT_STAGES:
            raise bad("stage", f"must be one of {list(STAGES) + list(VARIANT_STAGES)}, got {self.stage!r}")
        if not self.data.train:
            raise bad("data.train", "no training file given")
        if not self.output_dir:
            raise bad("output_dir", "no output directory given")
        for key in ("max_steps", "logging_steps", "save_steps", "optim.batch_size", "optim.gradient_accumulation_steps"):
            value = get_key(self, key)
            if not isinstance(value, int) or value < 1:
                raise bad(key, f"must be a positive integer, got {value!r}")
        if self.save_total_limit is not None and (not isinstance(self.save_total_limit, int) or self.save_total_limit < 1):
            raise bad("save_total_limit", f"must be a positive integer or null, got {self.save_total_limit!r}")
        budget = self.max_consecutive_skipped_steps
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
            raise bad("max_consecutive_skipped_steps", f"must be a non-negative integer, got {budget!r}")
        if self.eval_steps is not None and (not isinstance(self.eval_steps, int) or self.eval_steps < 1):
            raise bad("eval_steps", f"must be a positive integer or null, got {self.eval_steps!r}")
        if self.optim.scheduler not in ("cosine", "linear", "constant"):
            raise bad("optim.scheduler", f"must be cosine, linear or constant, got {self.optim.scheduler!r}")
        if self.mixed_precision not in ("auto", "bf16", "fp16", "no"):
            raise bad("mixed_precision", f"must be auto, bf16, fp16 or no, got {self.mixed_precision!r}")
        if self.data.on_error not in ("raise", "skip"):
            raise bad("data.on_error", f"must be raise or skip, got {self.data.on_error!r}")
        if self.model.preset is None and self.model.init is None:
            raise bad("model.preset", "null needs model.init (the preset is then that of the model it names)")
        if self.model.variant and get_stage(self.stage).system == "empatheia":
            raise bad("model.variant", f"stage {self.stage} trains Empatheia's model, which has no variant options")
        if self.model.dtype not in (None, "bfloat16", "float16", "float32"):
            raise bad("model.dtype", f"must be bfloat16, float16, float32 or null, got {self.model.dtype!r}")
        return self

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def save_yaml(self, path: Union[str, Path]) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


def find_config_file(path: Union[str, Path], key: str = "config") -> Path:
    """``path`` where it is a file (relative to the current folder), else the config of
    that name the package ships as ``empatheia.configs``: ``configs/train/x.yaml`` (as the
    docs write it, from the repository) is the packaged ``train/x.yaml``, so the same
    command works from any folder. ``key`` names the path in the error."""
    path = Path(path)
    if path.is_file():
        return path
    parts = path.parts[1:] if path.parts[:1] == ("configs",) else path.parts
    if not path.is_absolute() and parts:
        packaged = resources.files(CONFIGS_PACKAGE).joinpath(*parts)
        if packaged.is_file():
            return Path(str(packaged))
    where = f" nor among the configs the package ships ({'/'.join(parts)} in {CONFIGS_PACKAGE})" if not path.is_absolute() else ""
    raise ConfigError(f"{key}: {path} not found in {Path.cwd()}{where}")


def load_train_config(path: Union[str, Path], sets: Sequence[str] = ()) -> TrainConfig:
    """Read a stage config and apply ``--set`` items, ``key=value`` with YAML values
    (``1e-4``, ``null``, ``[0.9, 0.95]``). Unknown keys and malformed values are errors
    naming the file or ``--set``, and the key. A ``path`` that is not a file here may name
    a packaged config (:func:`find_config_file`)."""
    path = find_config_file(path)
    data = read_yaml_mapping(path)
    for key in _RETIRED_KEYS:
        data.pop(key, None)
    overrides = parse_sets(sets)
    for given in (data, overrides):
        # YAML 1.1 reads a bare `no` as false; for this key it can only mean "no".
        if given.get("mixed_precision") is False:
            given["mixed_precision"] = "no"
    return load_dataclass(TrainConfig, data, str(path), overrides, overrides_source="--set").validate(str(path))


def get_key(config: Any, dotted: str) -> Any:
    node = config
    for part in dotted.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node
