"""The Transformer VAE block shared by the Content Synchronizer and the Style Disentangler
(Figure 4 of the paper): an encoder in which learned queries read a source sequence into a
Gaussian latent, and a decoder in which the same queries read the sampled latent back."""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import nn


def feed_forward(in_dim: int, out_dim: int) -> nn.Sequential:
    """The FFN(.) of eqs. 1-6: two linear layers with a GELU between."""
    return nn.Sequential(nn.Linear(in_dim, out_dim), nn.GELU(), nn.Linear(out_dim, out_dim))


def _decoder_stack(d_model: int, num_heads: int, num_layers: int, ffn_dim: int, dropout: float) -> nn.TransformerDecoder:
    layer = nn.TransformerDecoderLayer(
        d_model, num_heads, ffn_dim, dropout, activation="gelu", batch_first=True, norm_first=True
    )
    return nn.TransformerDecoder(layer, num_layers, norm=nn.LayerNorm(d_model))


class VAEOutput(NamedTuple):
    features: torch.Tensor
    """``(B, Q, d_model)`` decoder output, one vector per query."""
    mean: torch.Tensor
    """``(B, Q, latent_dim)``."""
    log_var: torch.Tensor
    """``(B, Q, latent_dim)``."""
    kl: torch.Tensor
    """``(B,)`` KL divergence to N(0, I), summed over latent dimensions and averaged over
    the item's valid queries."""


class TransformerVAE(nn.Module):
    """``z = Enc(source, queries)``, ``out = Dec(FFN(z), queries)``.

    Both halves are stacks of pre-norm transformer decoder layers: the queries self-attend
    and cross-attend to the source (encoder) or to the projected latent (decoder). The
    latent is sampled with the reparameterisation trick in training and is its mean in
    evaluation, so inference is deterministic.
    """

    def __init__(self, d_model: int, num_heads: int, num_layers: int, ffn_dim: int, latent_dim: int, dropout: float):
        super().__init__()
        self.encoder = _decoder_stack(d_model, num_heads, num_layers, ffn_dim, dropout)
        self.to_latent = nn.Linear(d_model, 2 * latent_dim)
        self.from_latent = feed_forward(latent_dim, d_model)
        self.decoder = _decoder_stack(d_model, num_heads, num_layers, ffn_dim, dropout)

    def forward(
        self,
        source: torch.Tensor,
        queries: torch.Tensor,
        source_padding_mask: Optional[torch.Tensor] = None,
        query_padding_mask: Optional[torch.Tensor] = None,
    ) -> VAEOutput:
        """
        Args:
            source: ``(B, S, d_model)`` sequence to read.
            queries: ``(B, Q, d_model)`` learned queries.
            source_padding_mask: ``(B, S)``, True where ``source`` is padding.
            query_padding_mask: ``(B, Q)``, True where a query is padding.
        """
        encoded = self.encoder(
            queries, source, tgt_key_padding_mask=query_padding_mask, memory_key_padding_mask=source_padding_mask
        )
        mean, log_var = self.to_latent(encoded).chunk(2, dim=-1)
        log_var = log_var.clamp(-30.0, 20.0)
        z = mean + torch.randn_like(mean) * torch.exp(0.5 * log_var) if self.training else mean
        features = self.decoder(
            queries,
            self.from_latent(z),
            tgt_key_padding_mask=query_padding_mask,
            memory_key_padding_mask=query_padding_mask,
        )
        kl_per_query = -0.5 * (1 + log_var - mean.pow(2) - log_var.exp()).sum(-1)  # (B, Q)
        if query_padding_mask is None:
            kl = kl_per_query.mean(-1)
        else:
            valid = (~query_padding_mask).to(kl_per_query.dtype)
            kl = (kl_per_query * valid).sum(-1) / valid.sum(-1).clamp(min=1)
        return VAEOutput(features=features, mean=mean, log_var=log_var, kl=kl)
