"""Projectors from encoder features into the language model's embedding space (§4.1)."""

from __future__ import annotations

from torch import nn


class Projector(nn.Sequential):
    """MLP ``(..., in_dim) -> (..., out_dim)``: Linear, then (GELU, Linear) ``num_layers - 1``
    times (LLaVA-1.5's mlp2x_gelu for ``num_layers = 2``).

    With ``zero_init_output`` the last Linear starts at zero, so the projector's output is
    zero until training moves it (its own gradient is not zero: it is the upstream
    gradient times the hidden features)."""

    def __init__(self, in_dim: int, out_dim: int, num_layers: int = 2, zero_init_output: bool = False):
        if num_layers < 1:
            raise ValueError(f"projector.num_layers must be at least 1, got {num_layers}")
        layers = [nn.Linear(in_dim, out_dim)]
        for _ in range(num_layers - 1):
            layers += [nn.GELU(), nn.Linear(out_dim, out_dim)]
        super().__init__(*layers)
        if zero_init_output:
            nn.init.zeros_(layers[-1].weight)
            nn.init.zeros_(layers[-1].bias)
