"""Train one head of a frozen model on states collected from it once.

Why: stages 2-4 train the heads beside the language core, a step at a time, and every step
costs a forward and backward pass through the core. On the ``small`` preset's CPU budget
that is a few hundred examples, far fewer updates than the heads' Transformer VAEs need.
With the core frozen, the states a head reads are a fixed function of the dialogue, so
they are computed once, in evaluation mode as inference computes them, and the head then
trains for thousands of steps at the cost of the head alone.
:mod:`~empatheia.training.style_refit` and :mod:`~empatheia.training.content_refit` collect
their states and define their loss; this module holds the optimisation they share and
the file their collected states are kept in.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Sequence, Tuple

import torch
from torch import nn
from tqdm.auto import tqdm


def refit_head(
    head: nn.Module,
    step_terms: Callable[[torch.Generator], Dict[str, torch.Tensor]],
    steps: int,
    learning_rate: float,
    weight_decay: float = 1e-3,
    warmup_steps: int = 50,
    seed: int = 0,
    progress: bool = True,
    description: str = "refit",
    log_every: int = 50,
) -> List[Dict[str, float]]:
    """Train ``head`` for ``steps`` AdamW steps: a linear warm-up over ``warmup_steps``,
    then a cosine decay to zero; gradients clipped at norm 1.

    ``step_terms(generator)`` draws a batch with ``generator`` and returns the loss as
    ``loss`` plus any scalar terms to log. Returns one row of them every ``log_every``
    steps and at the last. Only parameters that require a gradient are trained; the caller
    sets the head's training and evaluation modes, which this loop leaves as they are."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=learning_rate, weight_decay=weight_decay)
    warmup = max(1, min(warmup_steps, steps - 1))

    # Not transformers' get_cosine_schedule_with_warmup: theirs warms up from 0 (step / warmup), ours from 1 / warmup.
    def rate(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    log: List[Dict[str, float]] = []
    for step in tqdm(range(1, steps + 1), desc=description, disable=not progress, unit="step"):
        terms = step_terms(generator)
        loss = terms["loss"]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in head.parameters() if p.requires_grad], 1.0)
        optimizer.step()
        schedule.step()
        if step % log_every == 0 or step == steps:
            log.append({"step": step, **{k: v.item() for k, v in terms.items() if v.dim() == 0}})
    return log


def save_states(path, tensors: Dict[str, torch.Tensor], targets: Dict[str, torch.Tensor], key: str = "") -> None:
    """Write collected states and their targets (``target.``-prefixed) to a safetensors
    file; ``key`` names what they were collected from (:func:`states_key_of` reads it)."""
    from safetensors.torch import save_file

    tensors = {**tensors, **{f"target.{name}": value for name, value in targets.items()}}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"key": key})


def states_key_of(path) -> str:
    """The ``key`` that :func:`save_states` wrote into ``path``."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as file:
        return (file.metadata() or {}).get("key", "")


def load_states(path, required: Sequence[str], kind: str) -> Tuple[Dict[str, torch.Tensor], Dict[str, torch.Tensor]]:
    """Read what :func:`save_states` wrote: ``(tensors, targets)``; a file without the
    ``required`` tensors is refused, naming it as not a file of ``kind``."""
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    missing = set(required) - tensors.keys()
    if missing:
        raise ValueError(f"{path}: not a file of {kind} (no {sorted(missing)})")
    targets = {k[len("target.") :]: v for k, v in tensors.items() if k.startswith("target.")}
    return tensors, targets
