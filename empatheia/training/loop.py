"""The training loop of every stage: DeepSpeed does gradient accumulation, mixed
precision, clipping and ZeRO; this file decides what is read, logged, evaluated and saved.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from ..errors import SkippedSample
from ..io import write_text_atomic
from ..modeling import Empatheia
from ..stages import get_stage
from . import checkpoint as ckpt
from .config import ConfigError, TrainConfig
from .data import StageData, eval_batches, to_device, train_loader
from .start import FAILED_NAME
from .distributed import (
    ProcessInfo,
    all_reduce_mean,
    any_process,
    autocast,
    barrier,
    deepspeed_config,
    deepspeed_precision,
    gather_objects,
    init_processes,
    resolve_precision,
    zero_stage,
)

METRICS_NAME = "metrics.jsonl"
SKIPPED_NAME = "skipped.jsonl"
CONFIG_NAME = "train_config.yaml"
FINAL_DIR = "final"
# Keys a resumed run must share with the run it continues; max_steps may grow.
_RESUME_KEYS = ("stage", "seed", "model", "data", "optim", "deepspeed", "mixed_precision")


class TrainingDiverged(RuntimeError):
    """The loss, the gradients or the trained weights stopped being finite, or DeepSpeed
    skipped more optimizer steps in a row than ``max_consecutive_skipped_steps`` allows; the
    message names the step, the last good checkpoint and what to change."""


@dataclass
class TrainResult:
    model: Empatheia
    """The trained model (on this process's device)."""
    output_dir: Path
    final_dir: Path
    state: ckpt.TrainerState
    is_main: bool
    """Whether this is the main process (the one that wrote the files)."""


def train(config: TrainConfig, model: Empatheia, data: StageData, resume: bool = False) -> TrainResult:
    """Train ``model`` on ``data`` for ``config.stage`` and write ``config.output_dir``:
    ``metrics.jsonl``, ``checkpoint-STEP/`` every ``save_steps``, and ``final/``.

    With ``resume``, continue from the newest complete checkpoint; a resumed run ends with
    the weights an uninterrupted one would have.
    """
    proc = init_processes()
    _seed_everything(config.seed + proc.rank)
    output_dir = Path(config.output_dir)
    start_from = _prepare_output_dir(output_dir, config, resume, proc)
    state = ckpt.TrainerState()
    try:
        return _train(config, model, data, proc, output_dir, start_from, state, resume)
    except Exception as error:
        # A later stage or --resume reads this rather than guessing from a folder without final/.
        _record_failure(output_dir, error, state)
        raise


def _train(
    config: TrainConfig,
    model: Empatheia,
    data: StageData,
    proc: ProcessInfo,
    output_dir: Path,
    start_from: Optional[Path],
    state: ckpt.TrainerState,
    resume: bool,
) -> TrainResult:
    """The run itself, from ``start_from`` (a checkpoint) or the start; ``state`` is
    updated in place as it goes, so a failure can say where it happened."""
    import deepspeed

    precision = resolve_precision(config, proc.device)
    ds_config = deepspeed_config(config, proc.world_size, deepspeed_precision(precision, proc.device))

    # Models load in eval mode, with the adapter merged once they have answered.
    model.set_stage(config.stage).train()
    if config.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.to(proc.device)
    optimizer = _optimizer(model, config)
    scheduler = _scheduler(optimizer, config)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config)

    skips = _SkippedSteps(config.max_consecutive_skipped_steps)
    if start_from is not None:
        restored, skips.in_a_row = _restore(start_from, engine, model, proc, ds_config)
        vars(state).update(vars(restored))
    log = _RunLog(output_dir, config, proc)
    log.note(
        f"stage {config.stage}, {get_stage(config.stage).title}: {len(data.train)} training examples, "
        f"{proc.world_size} process(es), micro-batch {config.optim.batch_size} x "
        f"{config.optim.gradient_accumulation_steps} accumulation, precision {precision}, "
        f"ZeRO stage {zero_stage(ds_config)}"
        + (f"; resuming from {start_from.name}" if start_from is not None else "")
        + ("; nothing to resume in this output_dir, so it starts at step 0" if resume and start_from is None else "")
    )
    log.skipped(data.skipped.skipped)

    loader = train_loader(data.train, config, proc.rank, proc.world_size, start=state.micro_steps)
    batches = iter(loader)
    progress = tqdm(
        total=config.max_steps,
        initial=state.step,
        desc=f"stage {config.stage}",
        disable=not (proc.is_main and config.progress),
        dynamic_ncols=True,
    )
    window: List[Dict[str, float]] = []
    started = time.perf_counter()
    accumulation = config.optim.gradient_accumulation_steps
    while state.step < config.max_steps:
        terms: Dict[str, float] = {}
        examples, skipped = 0, []
        for micro in range(accumulation):
            batch = next(batches)
            state.micro_steps += 1
            skipped += batch.get("skipped", [])
            ids = batch.get("ids", [])
            examples += len(ids)
            if ids:
                with autocast(precision, proc.device):
                    outputs = engine(_encode_media(to_device(batch, proc.device), data, model, ds_config))
            else:  # every example of this micro-batch was skipped: keep the processes in step
                outputs = {"loss": _zero_loss(model)}
            _check_finite(outputs["loss"], state, micro, ids, config, output_dir, proc)
            engine.backward(outputs["loss"])
            if micro == accumulation - 1 and zero_stage(ds_config) == 0:
                grad_norm = _grad_norm(model)  # ZeRO 0 clips without keeping the norm
                _check_gradient_before_update(grad_norm, engine, state, config, output_dir, proc)
            _engine_step(engine, state, config, output_dir)
            values = torch.stack([v.detach().float() for v in outputs.values()]).tolist()
            for name, value in zip(outputs, values):
                terms[name] = terms.get(name, 0.0) + value / accumulation
        state.step += 1
        if zero_stage(ds_config) > 0:
            grad_norm = _as_float(engine.get_global_grad_norm())
        diverged = skips.after_step(engine.was_step_applied(), grad_norm, state, config, output_dir)
        if config.data.on_error == "skip":
            log.skipped([s for rank_skipped in gather_objects(skipped) for s in rank_skipped])
        terms["examples"] = examples
        reduced = _reduce_terms(terms, proc, agree_on_names=config.data.on_error == "skip")
        state.examples += round(reduced.pop("examples") * proc.world_size)
        window.append(reduced)
        progress.update(1)
        progress.set_postfix(loss=f"{reduced['loss']:.4f}")
        # The steps up to a stop are logged, so metrics.jsonl shows how the run diverged.
        if state.step % config.logging_steps == 0 or state.step == config.max_steps or diverged:
            extra = {
                "lr": scheduler.get_last_lr()[0],
                "epoch": round(loader.batch_sampler.epoch(state.micro_steps), 4),
                "examples": state.examples,
                "grad_norm": grad_norm,
                "skipped_steps": skips.take_logged(),
                "seconds": round(time.perf_counter() - started, 3),
            }
            log.metrics(state.step, "train", _mean(window), extra)
            window = []
        if diverged is not None:
            progress.close()
            log.close()
            raise diverged
        if data.eval is not None and config.eval_steps and state.step % config.eval_steps == 0:
            with autocast(precision, proc.device):
                log.metrics(state.step, "eval", evaluate(engine, data, config, proc), {})
        if state.step % config.save_steps == 0 or state.step == config.max_steps:
            _check_weights_finite(model, state, config, output_dir, proc, ds_config)
            _save_checkpoint(output_dir, engine, model, state, config, proc, ds_config, skips.in_a_row)
    progress.close()
    # The last step always saved a checkpoint, after the weights were checked.
    final_dir = output_dir / FINAL_DIR
    with ckpt.atomic_directory(final_dir, proc.is_main) as tmp:
        _save_model(model, tmp, proc, ds_config)
    log.note(f"wrote {final_dir}")
    log.close()
    return TrainResult(model, output_dir, final_dir, state, proc.is_main)


# ---------------------------------------------------------------------- pieces
def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """AdamW over the stage's trainable parameters; biases and norms get no decay; the parts
    that train from scratch (the model's ``fresh_groups``: projectors and heads, MERIA's PDR
    and soft prompts, ...) take ``optim.head_learning_rate`` when it is set, while LoRA only
    adapts the core."""
    optim = config.optim
    head_lr = optim.head_learning_rate if optim.head_learning_rate is not None else optim.learning_rate
    named = model.parameter_groups()
    heads = {id(p) for key in model.fresh_groups for _, p in named[key]}
    groups: Dict[Tuple[bool, bool], List[nn.Parameter]] = {}
    for param in model.parameters():
        if param.requires_grad:
            groups.setdefault((id(param) in heads, param.ndim >= 2), []).append(param)
    if not groups:
        raise ConfigError(f"stage {config.stage} leaves no parameter to train")
    return torch.optim.AdamW(
        [{"params": params, "lr": head_lr if head else optim.learning_rate,
          "weight_decay": optim.weight_decay if decays else 0.0}
         for (head, decays), params in sorted(groups.items())],
        lr=optim.learning_rate, betas=tuple(optim.betas), eps=optim.eps,
    )


def _scheduler(optimizer: torch.optim.Optimizer, config: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    warmup, total, kind = config.optim.warmup_steps, config.max_steps, config.optim.scheduler

    # Not transformers' get_*_schedule_with_warmup: theirs warms up from 0 (step / warmup), ours from 1 / (warmup + 1).
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if kind == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        if kind == "linear":
            return 1.0 - progress
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _encode_media(batch: Dict[str, object], data: StageData, model: Empatheia, ds_config: Dict) -> Dict[str, object]:
    """With ``data.media_cache``, encode the batch's uncached media once with the frozen
    encoders and store them, so later epochs and stages read features instead of decoding
    and encoding the files again. (ZeRO-3 shards the encoders, which only the engine's
    forward gathers, so there they run inside the forward as usual.)"""
    cache = data.train.media_cache
    if cache is None or zero_stage(ds_config) == 3:
        return batch
    # The frozen encoders ignore CPU autocast here as in Empatheia.encode_media: the cache
    # holds the fp32 features inference computes (and Whisper's mel front end cannot
    # hand a bf16 tensor to numpy).
    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        return cache.complete(batch, model)


def _grad_norm(model: nn.Module) -> float:
    grads = [p.grad for p in model.parameters() if p.requires_grad and p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))) if grads else 0.0


def _zero_loss(model: nn.Module) -> torch.Tensor:
    """A loss of 0 that touches every trainable parameter, so backward still syncs."""
    return sum(p.sum() * 0.0 for p in model.parameters() if p.requires_grad)


def _check_finite(
    loss: torch.Tensor,
    state: ckpt.TrainerState,
    micro: int,
    ids: List[str],
    config: TrainConfig,
    output_dir: Path,
    proc: ProcessInfo,
) -> None:
    bad = not bool(torch.isfinite(loss.detach()).all())
    if not any_process(bad, proc.device):
        return
    culprits = [i for rank_ids in gather_objects(ids if bad else []) for i in rank_ids]
    raise TrainingDiverged(
        f"stage {config.stage}: the loss became {float(loss.detach())} at step {state.step + 1} "
        f"(micro-batch {micro + 1} of {config.optim.gradient_accumulation_steps}, batch {state.micro_steps} of "
        f"this run), on examples {culprits}; training stopped before this update, and {_kept(output_dir)}. "
        + _remedy(config)
    )


def _kept(output_dir: Path) -> str:
    last = ckpt.latest_checkpoint(output_dir)
    return f"the last good checkpoint is {last}" if last else "no checkpoint was written yet"


def _remedy(config: TrainConfig) -> str:
    # optim is one of the keys a resumed run must keep, hence the fresh output_dir.
    return (
        f"To train on, lower optim.learning_rate (now {config.optim.learning_rate:g}) or raise optim.warmup_steps "
        f"(now {config.optim.warmup_steps}) and start again in a new output_dir"
    )


def _as_float(value) -> Optional[float]:
    return None if value is None else float(value)


def _is_finite(value: Optional[float]) -> bool:
    return value is None or math.isfinite(value)


def _check_gradient_before_update(
    grad_norm: float, engine, state: ckpt.TrainerState, config: TrainConfig, output_dir: Path, proc: ProcessInfo
) -> None:
    """Under ZeRO stage 0 with a plain optimizer (fp32, or bf16 autocast on the CPU)
    DeepSpeed has no overflow check: it would apply an inf or NaN gradient and leave every
    weight NaN, so the run stops before that update. The fp16 and bf16 optimizers keep an
    ``overflow`` flag and skip such a step themselves, which the skipped-step budget counts."""
    if hasattr(engine.optimizer, "overflow"):
        return
    if not any_process(not math.isfinite(grad_norm), proc.device):
        return
    raise TrainingDiverged(
        f"stage {config.stage}: the gradient norm became {grad_norm} at step {state.step + 1} while the loss was "
        f"finite; ZeRO stage 0 without loss scaling cannot skip such an update, so training stopped before it, and "
        f"{_kept(output_dir)}. " + _remedy(config)
    )


# What DeepSpeed's fp16 loss scaler raises, as a bare Exception, when an overflow finds the
# scale at its minimum already.
_LOSS_SCALE_AT_MINIMUM = "loss scale already at minimum"


def _engine_step(engine, state: ckpt.TrainerState, config: TrainConfig, output_dir: Path) -> None:
    try:
        engine.step()
    except Exception as error:
        if _LOSS_SCALE_AT_MINIMUM not in str(error):
            raise
        raise TrainingDiverged(
            f"stage {config.stage}: at step {state.step + 1} the gradients overflowed fp16 although DeepSpeed's loss "
            f"scale had already fallen to its minimum: the run is diverging. Training stopped before this update, and "
            f"{_kept(output_dir)}. " + _remedy(config) + "; or train in bf16 (mixed_precision: bf16) where the GPU has it"
        ) from error


class _SkippedSteps:
    """Counts the optimizer steps whose update DeepSpeed discarded (inf or NaN in the
    gradients: fp16 loss-scale overflows, or a diverging run in any precision) and decides
    when the run is diverging rather than settling its loss scale."""

    def __init__(self, budget: int):
        self.budget = budget
        self.in_a_row = 0
        """Skipped steps since the last applied one; kept in checkpoints, so a resumed run
        stops where an uninterrupted one would."""
        self.since_logged = 0

    def take_logged(self) -> int:
        count, self.since_logged = self.since_logged, 0
        return count

    def after_step(
        self, applied: bool, grad_norm: Optional[float], state: ckpt.TrainerState, config: TrainConfig, output_dir: Path
    ) -> Optional[TrainingDiverged]:
        """The error to stop with after the step ``state.step``, or ``None``."""
        if applied and not _is_finite(grad_norm):
            # bf16 ZeRO without check_grad_overflow applies what it cannot clip.
            return TrainingDiverged(
                f"stage {config.stage}: the gradient norm became {grad_norm} at step {state.step} and DeepSpeed applied "
                f"that update, so the weights are no longer finite; no checkpoint of it was written, and "
                f"{_kept(output_dir)}. " + _remedy(config)
            )
        if applied:
            self.in_a_row = 0
            return None
        self.in_a_row += 1
        self.since_logged += 1
        if self.in_a_row <= self.budget:
            return None
        first = state.step - self.in_a_row + 1
        return TrainingDiverged(
            f"stage {config.stage}: DeepSpeed skipped {self.in_a_row} optimizer steps in a row (steps {first} to "
            f"{state.step}) because their gradients held inf or NaN, more than max_consecutive_skipped_steps "
            f"({self.budget}) allows: the run is diverging. Training stopped at step {state.step}, and "
            f"{_kept(output_dir)}. " + _remedy(config) + "; or, if these are fp16 loss-scale overflows that would "
            "settle, raise max_consecutive_skipped_steps and continue this run with --resume"
        )


def _check_weights_finite(
    model: Empatheia, state: ckpt.TrainerState, config: TrainConfig, output_dir: Path, proc: ProcessInfo, ds_config: Dict
) -> None:
    """Refuse to save weights that hold inf or NaN (an update that blew up with a finite
    gradient, or one applied without an overflow check). Under ZeRO-3 each process checks
    the shard it holds."""
    zero3 = zero_stage(ds_config) == 3
    bad = next(
        (name for key, group in model.parameter_groups().items() if key != "frozen" for name, p in group
         if not bool(torch.isfinite(p.ds_tensor if zero3 and hasattr(p, "ds_tensor") else p).all())),
        None,
    )
    if not any_process(bad is not None, proc.device):
        return
    names = sorted({name for name in gather_objects(bad) if name})
    raise TrainingDiverged(
        f"stage {config.stage}: after step {state.step} the trained weights hold inf or NaN ({', '.join(names)}); "
        f"nothing of this step was saved, and {_kept(output_dir)}. " + _remedy(config)
    )


def _reduce_terms(terms: Dict[str, float], proc: ProcessInfo, agree_on_names: bool) -> Dict[str, float]:
    """Mean of each term over the processes. A process whose micro-batches were all
    skipped has only ``loss``; with skipping on, the processes first agree on the names."""
    names = sorted(terms)
    if agree_on_names:
        names = sorted(set().union(*gather_objects(names)))
    values = all_reduce_mean(torch.tensor([terms.get(n, 0.0) for n in names], dtype=torch.float64, device=proc.device))
    return dict(zip(names, values.tolist()))


def _mean(window: List[Dict[str, float]]) -> Dict[str, float]:
    names = sorted({k for row in window for k in row})
    return {n: sum(row.get(n, 0.0) for row in window) / len(window) for n in names}


@torch.no_grad()
def evaluate(engine, data: StageData, config: TrainConfig, proc: ProcessInfo) -> Dict[str, float]:
    """Mean loss terms over ``data.eval``, over all processes."""
    engine.eval()
    collate = data.eval.collator()
    sums: Dict[str, float] = {}
    count = 0.0
    for indices, counts in eval_batches(len(data.eval), config.optim.batch_size, proc.rank, proc.world_size):
        batch = collate([data.eval[i] for i in indices])
        if "ids" not in batch:
            continue
        outputs = engine(to_device(batch, proc.device))
        if counts:
            n = len(batch["ids"])
            count += n
            for name, value in outputs.items():
                sums[name] = sums.get(name, 0.0) + float(value) * n
    engine.train()
    names = sorted(sums)
    totals = torch.tensor([sums.get(n, 0.0) for n in names] + [count], dtype=torch.float64, device=proc.device)
    totals = all_reduce_mean(totals) * proc.world_size
    return {n: float(v) / max(1.0, float(totals[-1])) for n, v in zip(names, totals[:-1])}


# ---------------------------------------------------------------------- saving
def _trained_parameters(model: Empatheia) -> List[nn.Parameter]:
    return [p for key, group in model.parameter_groups().items() if key != "frozen" for _, p in group]


def _save_model(model: Empatheia, directory: Path, proc: ProcessInfo, ds_config: Dict) -> None:
    """``save_pretrained`` from the main process; under ZeRO-3 every process first
    gathers the trained parameters it holds a shard of."""
    import deepspeed

    gather = deepspeed.zero.GatheredParameters(_trained_parameters(model)) if zero_stage(ds_config) == 3 else contextlib.nullcontext()
    with gather:
        if proc.is_main:
            model.save_pretrained(directory)


# Kept in the engine's client state, beside DeepSpeed's own counters.
_SKIPPED_IN_A_ROW = "empatheia_skipped_steps_in_a_row"


def _save_checkpoint(
    output_dir: Path, engine, model: Empatheia, state, config: TrainConfig, proc, ds_config, skipped_in_a_row: int
) -> None:
    final = output_dir / f"checkpoint-{state.step}"
    with ckpt.atomic_directory(final, proc.is_main) as tmp:
        _save_model(model, tmp / ckpt.MODEL_DIR, proc, ds_config)
        engine.save_checkpoint(str(tmp / ckpt.ENGINE_DIR), tag=ckpt.ENGINE_TAG, exclude_frozen_parameters=True,
                               client_state={_SKIPPED_IN_A_ROW: skipped_in_a_row})
        ckpt.save_rng(tmp, proc.rank, proc.device)
        barrier()
        if proc.is_main:
            state.save(tmp / ckpt.STATE_NAME)
    if proc.is_main:
        ckpt.rotate_checkpoints(output_dir, config.save_total_limit)
    barrier()


def _restore(
    directory: Path, engine, model: Empatheia, proc: ProcessInfo, ds_config: Dict
) -> Tuple[ckpt.TrainerState, int]:
    """The trainer state of ``directory`` and the skipped steps in a row it ended with."""
    import deepspeed

    # Parts trained by earlier stages first, then the engine's state for this stage's.
    saved = directory / ckpt.MODEL_DIR
    zero3 = zero_stage(ds_config) == 3
    gather = deepspeed.zero.GatheredParameters(_trained_parameters(model), modifier_rank=0) if zero3 else contextlib.nullcontext()
    with gather:
        model.load_trained_state_dict(model.read_trained_state(saved), source=str(saved))
    path, client_state = engine.load_checkpoint(
        str(directory / ckpt.ENGINE_DIR),
        tag=ckpt.ENGINE_TAG,
        load_module_strict=False,
        load_optimizer_states=True,
        load_lr_scheduler_states=True,
    )
    if path is None:
        raise RuntimeError(f"DeepSpeed could not load its state from {directory / ckpt.ENGINE_DIR}")
    ckpt.load_rng(directory, proc.rank, proc.device)
    return ckpt.TrainerState.load(directory / ckpt.STATE_NAME), int((client_state or {}).get(_SKIPPED_IN_A_ROW, 0))


def _prepare_output_dir(output_dir: Path, config: TrainConfig, resume: bool, proc: ProcessInfo) -> Optional[Path]:
    """The checkpoint to resume from (or ``None``), after refusing to overwrite a run or to
    resume one with different settings."""
    existing = ckpt.latest_checkpoint(output_dir)
    saved_config = output_dir / CONFIG_NAME
    if existing is not None and not resume:
        raise ConfigError(
            f"output_dir {output_dir} already holds {existing.name}; pass --resume to continue that run "
            "or choose another output_dir"
        )
    if resume and existing is not None and saved_config.is_file():
        from .config import load_train_config

        previous = load_train_config(saved_config).to_dict()
        current = config.to_dict()
        changed = [k for k in _RESUME_KEYS if previous.get(k) != current.get(k)]
        if changed:
            raise ConfigError(
                f"--resume: {saved_config} differs from this config in {changed}; a resumed run must keep them "
                "(only max_steps and logging settings may change)"
            )
    barrier()
    if proc.is_main:
        output_dir.mkdir(parents=True, exist_ok=True)
        ckpt.remove_partial_checkpoints(output_dir)
        (output_dir / FAILED_NAME).unlink(missing_ok=True)
        config.save_yaml(saved_config)
        if existing is None:
            for name in (METRICS_NAME, SKIPPED_NAME):
                (output_dir / name).unlink(missing_ok=True)
        else:
            ckpt.truncate_metrics(output_dir / METRICS_NAME, ckpt.TrainerState.load(existing / ckpt.STATE_NAME).step)
    barrier()
    return existing


def _record_failure(output_dir: Path, error: Exception, state: ckpt.TrainerState) -> None:
    """Write :data:`~empatheia.training.start.FAILED_NAME` into ``output_dir``: the error's
    first line, the step it stopped at and the last complete checkpoint, for the next
    stage's ``model.init`` to report. Any process that fails writes it (the same record),
    so a failure on one rank of many is recorded too."""
    if not output_dir.is_dir():
        return
    first_line = (str(error).strip().splitlines() or [""])[0]
    described = f"{type(error).__name__}: {first_line}" if first_line else type(error).__name__
    last = ckpt.latest_checkpoint(output_dir)
    record = {"error": described[:500], "step": state.step, "last_checkpoint": last.name if last else None}
    try:
        write_text_atomic(output_dir / FAILED_NAME, json.dumps(record, indent=1) + "\n")
    except OSError:
        pass  # a full disk must not hide the error that stopped the run


def _strict_json_row(row: Dict[str, object]) -> Dict[str, object]:
    """``row`` with each inf or NaN number written as ``null`` and named, with its value as
    text, under ``"nonfinite"`` (``{"grad_norm": "inf"}``): JSON has no such numbers, and
    strict readers (``jq``, most other languages) reject Python's ``Infinity``."""
    nonfinite = {k: str(v) for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)}
    if not nonfinite:
        return row
    return {**{k: None if k in nonfinite else v for k, v in row.items()}, "nonfinite": nonfinite}


class _RunLog:
    """``metrics.jsonl``, ``skipped.jsonl``, TensorBoard and messages, from the main
    process only."""

    def __init__(self, output_dir: Path, config: TrainConfig, proc: ProcessInfo):
        self.active = proc.is_main
        self.output_dir = output_dir
        self.writer = None
        if self.active and config.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(output_dir / "tensorboard"))

    def note(self, message: str) -> None:
        if self.active:
            tqdm.write(f"[empatheia] {message}")

    def metrics(self, step: int, split: str, values: Dict[str, float], extra: Dict[str, object]) -> None:
        if not self.active:
            return
        row = _strict_json_row({"step": step, "split": split, **{k: round(v, 6) for k, v in values.items()}, **extra})
        with open(self.output_dir / METRICS_NAME, "a") as f:
            f.write(json.dumps(row, allow_nan=False) + "\n")
        if self.writer is not None:
            for key, value in {**values, **extra}.items():
                if isinstance(value, (int, float)):
                    self.writer.add_scalar(f"{split}/{key}", value, step)
            self.writer.flush()

    def skipped(self, samples: List[SkippedSample]) -> None:
        if not (self.active and samples):
            return
        with open(self.output_dir / SKIPPED_NAME, "a") as f:
            for s in samples:
                f.write(json.dumps({"file": str(s.file), "record": s.record, "field": s.field, "reason": s.reason}) + "\n")
        for s in samples:
            tqdm.write(f"[empatheia] skipped: {s}")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
