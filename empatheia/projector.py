"""Projectors from encoder features into the language model's embedding space (§4.1)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn


class NormCap(nn.Module):
    """Shortens each vector ``(..., D)`` longer than ``max_norm`` to that length; shorter
    ones pass unchanged (a zero stays zero)."""

    def __init__(self, max_norm: float):
        super().__init__()
        self.max_norm = float(max_norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm = x.norm(dim=-1, keepdim=True)
        return x * (self.max_norm / norm.clamp(min=self.max_norm))

    def extra_repr(self) -> str:
        return f"max_norm={self.max_norm:.4g}"


class Projector(nn.Sequential):
    """MLP ``(..., in_dim) -> (..., out_dim)``: Linear, then (GELU, Linear) ``num_layers - 1``
    times (LLaVA-1.5's mlp2x_gelu for ``num_layers = 2``), then optionally a cap on each
    output vector's length (:class:`NormCap`).

    With ``zero_init_output`` the last Linear starts at zero, so the projector's output is
    zero until training moves it (its own gradient is not zero: it is the upstream
    gradient times the hidden features). ``max_norm`` (the language model's typical token
    embedding length) keeps a media token no longer than a word: trained in stage 3 for
    the Style Disentangler alone, through a frozen core, uncapped video tokens grew to 4.5
    times a word's length on ``small`` and derailed the text-trained core when stage 4
    first showed it media beside text."""

    def __init__(self, in_dim: int, out_dim: int, num_layers: int = 2, zero_init_output: bool = False,
                 max_norm: Optional[float] = None):
        if num_layers < 1:
            raise ValueError(f"projector.num_layers must be at least 1, got {num_layers}")
        layers = [nn.Linear(in_dim, out_dim)]
        for _ in range(num_layers - 1):
            layers += [nn.GELU(), nn.Linear(out_dim, out_dim)]
        if zero_init_output:
            nn.init.zeros_(layers[-1].weight)
            nn.init.zeros_(layers[-1].bias)
        if max_norm is not None:
            layers.append(NormCap(max_norm))
        super().__init__(*layers)

    @property
    def output_layer(self) -> nn.Linear:
        """The last Linear (the one ``zero_init_output`` zeroes)."""
        return [m for m in self if isinstance(m, nn.Linear)][-1]
