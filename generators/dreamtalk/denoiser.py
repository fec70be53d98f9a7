"""The network inside the diffusion: noisy coefficients + step + content + style ->
predicted clean coefficients."""

from __future__ import annotations

import torch
from torch import nn

from .config import DreamTalkConfig
from .content_encoder import AudioContentEncoder
from .layers import PositionTable, mlp, timestep_embedding, transformer_decoder
from .style_encoder import StyleEncoder


class DisentangledDecoder(nn.Module):
    """Two transformer decoders, one for the upper face and one for the mouth region,
    each predicting its own subset of the expression coefficients.

    Each video frame is decoded on its own: the queries are the window positions plus the
    style code, the memory is the frame's ``W`` conditioned content vectors, and the
    coefficients come from the query at the window centre.

    Checkpoint names: ``upper_decoder`` / ``lower_decoder`` (``layers.{i}.*``, ``norm``),
    ``pos_embed.pos_table`` ``(1, W, d)``, ``upper_tail_fc`` / ``lower_tail_fc``
    (Linear ``d -> d/2 -> d/2 -> len(indices)`` at Sequential indices 0, 2, 4).
    """

    def __init__(self, config: DreamTalkConfig):
        super().__init__()
        d = config.d_model
        sizes = (d, config.num_heads, config.ffn_dim, config.decoder_layers, config.dropout)
        self.upper_decoder = transformer_decoder(*sizes)
        self.lower_decoder = transformer_decoder(*sizes)
        self.pos_embed = PositionTable(d, config.window_frames)
        self.upper_tail_fc = mlp([d, d // 2, d // 2, len(config.upper_face_indices)])
        self.lower_tail_fc = mlp([d, d // 2, d // 2, len(config.lower_face_indices)])
        # Not part of the checkpoint: they follow from the config.
        self.register_buffer("upper_indices", torch.tensor(config.upper_face_indices), persistent=False)
        self.register_buffer("lower_indices", torch.tensor(config.lower_face_indices), persistent=False)
        self.coeff_dim = config.coeff_dim

    def forward(self, content: torch.Tensor, style_code: torch.Tensor) -> torch.Tensor:
        """
        Args:
            content: ``(B, L, W, d)`` conditioned content (audio + noisy motion + step).
            style_code: ``(B, d)``.

        Returns:
            ``(B, L, coeff_dim)`` predicted clean coefficients.
        """
        batch, frames, width, dim = content.shape
        memory = content.reshape(batch * frames, width, dim)
        # The published decoder starts from zero targets plus positions plus style.
        queries = self.pos_embed(width) + style_code[:, None, None, :]  # (B, 1, W, d)
        queries = queries.expand(batch, frames, width, dim).reshape(batch * frames, width, dim)
        centre = width // 2
        upper = self.upper_decoder(queries, memory)[:, centre].reshape(batch, frames, dim)
        lower = self.lower_decoder(queries, memory)[:, centre].reshape(batch, frames, dim)
        out = content.new_empty(batch, frames, self.coeff_dim)
        out[..., self.upper_indices] = self.upper_tail_fc(upper)
        out[..., self.lower_indices] = self.lower_tail_fc(lower)
        return out


class MotionDenoiser(nn.Module):
    """Predicts the clean coefficients ``x_0`` from ``x_t``.

    Checkpoint names (under ``diff_net.net.``): ``content_encoder``, ``style_encoder``,
    ``decoder``, ``content_xt_to_decoder_input_wo_time`` (Linear ``d + coeff_dim -> d``,
    ReLU, Linear ``d -> d``, ReLU, Linear ``d -> d``) and ``time_embed_net`` (Linear, SiLU,
    Linear, all ``d -> d``).
    """

    def __init__(self, config: DreamTalkConfig):
        super().__init__()
        d = config.d_model
        self.content_encoder = AudioContentEncoder(config)
        self.style_encoder = StyleEncoder(config)
        self.decoder = DisentangledDecoder(config)
        self.content_xt_to_decoder_input_wo_time = mlp([d + config.coeff_dim, d, d, d])
        self.time_embed_net = mlp([d, d, d], activation=nn.SiLU)
        self.d_model = d

    def forward(
        self, x_t: torch.Tensor, t: torch.Tensor, content: torch.Tensor, style_code: torch.Tensor
    ) -> torch.Tensor:
        """
        Args:
            x_t: ``(B, L, coeff_dim)`` noisy coefficients.
            t: ``(B,)`` diffusion steps.
            content: ``(B, L, W, d)`` output of :attr:`content_encoder` (computed once per
                sampling run, not per step: it depends on the audio alone).
            style_code: ``(B, d)``.

        Returns:
            ``(B, L, coeff_dim)`` predicted ``x_0``.
        """
        width = content.shape[2]
        # Every window position sees the frame's noisy coefficients.
        x_t = x_t[:, :, None, :].expand(-1, -1, width, -1)
        hidden = self.content_xt_to_decoder_input_wo_time(torch.cat([content, x_t], dim=-1))
        time = self.time_embed_net(timestep_embedding(t, self.d_model))  # (B, d)
        return self.decoder(hidden + time[:, None, None, :], style_code)


__all__ = ["DisentangledDecoder", "MotionDenoiser"]
