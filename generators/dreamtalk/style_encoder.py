"""The style encoder: up to ``style_max_len`` frames of a reference clip's expression
coefficients -> one ``d_model`` style code (Empatheia's video style feature S^v)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .config import DreamTalkConfig
from .layers import PositionTable, transformer_encoder

# Added to the pooling logits of padding frames: large enough that softmax gives them no
# weight, finite so that a fully padded row cannot produce NaN.
_PAD_LOGIT = -1e5


class AttentivePooling(nn.Module):
    """Self-attention pooling: a small MLP scores every frame, and the code is the
    softmax-weighted sum of the frames. Checkpoint names: ``W.0`` and ``W.2`` (Linear
    ``d -> d``, Mish, Linear ``d -> 1``)."""

    def __init__(self, dim: int):
        super().__init__()
        self.W = nn.Sequential(nn.Linear(dim, dim), nn.Mish(), nn.Linear(dim, 1))

    def forward(self, frames: torch.Tensor, pad_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``(B, L, d)`` frames, ``(B, L)`` mask (``True`` = padding) -> ``(B, d)``."""
        logits = self.W(frames).squeeze(-1)
        if pad_mask is not None:
            logits = logits + pad_mask.to(logits.dtype) * _PAD_LOGIT
        weights = logits.softmax(dim=-1)
        return torch.einsum("bl,bld->bd", weights, frames)


class StyleEncoder(nn.Module):
    """Checkpoint names: ``increase_embed_dim`` (Linear ``coeff_dim -> d_model``),
    ``pos_embed.pos_table`` ``(1, style_max_len, d_model)``, ``encoder.layers.{i}.*`` and
    ``aggregate_method.W.*`` (the pooling)."""

    def __init__(self, config: DreamTalkConfig):
        super().__init__()
        self.increase_embed_dim = nn.Linear(config.coeff_dim, config.d_model)
        self.pos_embed = PositionTable(config.d_model, config.style_max_len)
        self.encoder = transformer_encoder(
            config.d_model, config.num_heads, config.ffn_dim, config.style_layers, config.dropout
        )
        self.aggregate_method = AttentivePooling(config.d_model)

    @property
    def max_len(self) -> int:
        return self.pos_embed.pos_table.shape[1]

    def forward(self, coefficients: torch.Tensor, pad_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """
        Args:
            coefficients: ``(B, L, coeff_dim)`` expression coefficients, ``L <= style_max_len``.
            pad_mask: ``(B, L)`` bool, ``True`` where a clip is padding; ``None`` when
                every frame is real.

        Returns:
            ``(B, d_model)`` style codes.
        """
        x = self.increase_embed_dim(coefficients) + self.pos_embed(coefficients.shape[1])
        x = self.encoder(x, src_key_padding_mask=pad_mask)
        return self.aggregate_method(x, pad_mask)
