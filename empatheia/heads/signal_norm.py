"""Standardisation of the signal tokens' hidden states by running statistics."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class SignalStandardizer(nn.Module):
    """Standardises each of ``length`` signal positions per feature with running
    statistics: ``(x - mean[i]) / sqrt(var[i] + eps)`` for position ``i``.

    Why: the language core learns to predict the next signal token at every signal
    position with near certainty, so its hidden state there is dominated by a vector
    fixed by the position (on the shipped ``small`` weights the dialogue moves it by about
    12 % of its norm). A head reading the raw states sees almost the same input for every
    dialogue and learns the label prior: the Style Disentangler answered ``happy`` for
    every held-out dialogue although a linear read-out of the same, standardised states
    finds the emotion. Per-position statistics remove that fixed part; pooled statistics
    do not (the positions differ from each other far more than dialogues do).

    The statistics are running averages updated in training, never batch statistics, so a
    batch of four standardises the same way as inference does. The first updates average
    cumulatively, then ``momentum`` takes over. They are buffers: saved with the head, not
    trained by the optimiser. Under data parallelism every process updates with the
    statistics of all processes' batches, so the buffers stay identical across ranks.
    """

    def __init__(self, length: int, dim: int, momentum: float = 0.01, eps: float = 1e-4):
        super().__init__()
        self.momentum, self.eps = momentum, eps
        self.register_buffer("running_mean", torch.zeros(length, dim))
        self.register_buffer("running_var", torch.ones(length, dim))
        self.register_buffer("updates", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def _update(self, x: torch.Tensor) -> None:
        batch_mean, batch_var = x.mean(0), x.var(0, unbiased=False)  # (length, dim) each
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            # Every process updates with the statistics of all processes' batches, so the
            # ranks keep identical buffers (the processes step in lockstep with equal
            # micro-batches, as data-parallel training does).
            moments = torch.stack([batch_mean, batch_var + batch_mean**2])
            dist.all_reduce(moments)
            moments /= dist.get_world_size()
            batch_mean, batch_var = moments[0], (moments[1] - moments[0] ** 2).clamp(min=0.0)
        rate = max(1.0 / (int(self.updates) + 1), self.momentum)
        delta = batch_mean - self.running_mean
        # The variance of a mixture of the old statistics and the batch's.
        self.running_var.mul_(1 - rate).add_(rate * batch_var + rate * (1 - rate) * delta**2)
        self.running_mean.add_(rate * delta)
        self.updates += 1

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        """``(B, length, dim)`` -> standardised ``(B, length, dim)`` in float32; the states
        unchanged while no statistics were gathered (a head trained without them)."""
        if states.shape[1:] != self.running_mean.shape:
            raise ValueError(
                f"signal states have shape {tuple(states.shape[1:])} per item, expected {tuple(self.running_mean.shape)}"
            )
        x = states.float()
        if self.training:
            self._update(x.detach())
        elif int(self.updates) == 0:
            return x
        return (x - self.running_mean) * torch.rsqrt(self.running_var + self.eps)
