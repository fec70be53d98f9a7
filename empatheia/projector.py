"""Projectors from encoder features into the language model's embedding space (§4.1)."""

from __future__ import annotations

from torch import nn


class Projector(nn.Sequential):
    """MLP ``(..., in_dim) -> (..., out_dim)``: Linear, then (GELU, Linear) ``num_layers - 1``
    times (LLaVA-1.5's mlp2x_gelu for ``num_layers = 2``)."""

    def __init__(self, in_dim: int, out_dim: int, num_layers: int = 2):
        if num_layers < 1:
            raise ValueError(f"projector.num_layers must be at least 1, got {num_layers}")
        layers = [nn.Linear(in_dim, out_dim)]
        for _ in range(num_layers - 1):
            layers += [nn.GELU(), nn.Linear(out_dim, out_dim)]
        super().__init__(*layers)
