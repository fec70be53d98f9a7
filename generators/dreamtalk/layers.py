"""Building blocks shared by DreamTalk's encoders and decoder.

The transformer layers are PyTorch's own post-norm ``nn.TransformerEncoderLayer`` /
``nn.TransformerDecoderLayer``: the published layers are post-norm too, add positions only
once at the input (never inside attention) and name their parts ``self_attn``,
``multihead_attn``, ``linear1``, ``linear2`` and ``norm1..3``, which is exactly PyTorch's
layout, so the checkpoint loads into them unchanged.
"""

from __future__ import annotations

import torch
from torch import nn


def sinusoid_table(length: int, dim: int) -> torch.Tensor:
    """``(1, length, dim)`` sinusoidal positions: ``sin`` on even channels, ``cos`` on odd
    ones, at frequency ``10000^(-2 * (j // 2) / dim)`` for channel ``j``."""
    position = torch.arange(length, dtype=torch.float64)[:, None]
    channel = torch.arange(dim)
    angle = position / torch.pow(10000.0, (2 * (channel // 2)).double() / dim)
    table = torch.where(channel % 2 == 0, torch.sin(angle), torch.cos(angle))
    return table.float().unsqueeze(0)


class PositionTable(nn.Module):
    """A fixed table of sinusoidal positions. It is a buffer saved in the checkpoint
    (``pos_embed.pos_table``), so it is loaded, not recomputed, once weights are loaded."""

    def __init__(self, dim: int, length: int):
        super().__init__()
        self.register_buffer("pos_table", sinusoid_table(length, dim))

    def forward(self, length: int) -> torch.Tensor:
        """``(1, length, dim)`` positions of the first ``length`` steps."""
        if length > self.pos_table.shape[1]:
            raise ValueError(f"sequence of {length} steps is longer than the {self.pos_table.shape[1]} positions")
        return self.pos_table[:, :length]


def timestep_embedding(timesteps: torch.Tensor, dim: int) -> torch.Tensor:
    """``(B,)`` diffusion steps -> ``(B, dim)``: ``[cos(t * f), sin(t * f)]`` with
    ``f_i = 10000^(-i / (dim / 2))``."""
    half = dim // 2
    freqs = torch.pow(10000.0, -torch.arange(half, device=timesteps.device, dtype=torch.float32) / half)
    args = timesteps.float()[:, None] * freqs[None]
    embedding = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        embedding = nn.functional.pad(embedding, (0, 1))
    return embedding


def transformer_encoder(d_model: int, num_heads: int, ffn_dim: int, num_layers: int, dropout: float) -> nn.TransformerEncoder:
    """Post-norm ReLU encoder without a final norm (the published encoders have none)."""
    layer = nn.TransformerEncoderLayer(
        d_model, num_heads, ffn_dim, dropout, activation="relu", batch_first=True, norm_first=False
    )
    encoder = nn.TransformerEncoder(layer, num_layers, norm=None, enable_nested_tensor=False)
    xavier_init(encoder)
    return encoder


def transformer_decoder(d_model: int, num_heads: int, ffn_dim: int, num_layers: int, dropout: float) -> nn.TransformerDecoder:
    """Post-norm ReLU decoder with a final LayerNorm."""
    layer = nn.TransformerDecoderLayer(
        d_model, num_heads, ffn_dim, dropout, activation="relu", batch_first=True, norm_first=False
    )
    decoder = nn.TransformerDecoder(layer, num_layers, norm=nn.LayerNorm(d_model))
    xavier_init(decoder)
    return decoder


def xavier_init(module: nn.Module) -> None:
    """Xavier-uniform for every matrix, as the published model was initialised."""
    for parameter in module.parameters():
        if parameter.dim() > 1:
            nn.init.xavier_uniform_(parameter)


def mlp(sizes, activation: type = nn.ReLU) -> nn.Sequential:
    """``Linear -> act -> Linear -> ... -> Linear`` over consecutive ``sizes``."""
    layers = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        if i:
            layers.append(activation())
        layers.append(nn.Linear(n_in, n_out))
    return nn.Sequential(*layers)


__all__ = [
    "PositionTable",
    "mlp",
    "sinusoid_table",
    "timestep_embedding",
    "transformer_decoder",
    "transformer_encoder",
    "xavier_init",
]
