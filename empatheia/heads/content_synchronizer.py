"""Content Synchronizer (§4.3, eqs. 1-2)."""

from __future__ import annotations


from typing import NamedTuple

import torch
from torch import nn

from ..config import ContentSynchronizerConfig
from .transformer_vae import TransformerVAE, feed_forward


class ContentOutput(NamedTuple):
    speech: torch.Tensor
    """``(B, Ls, speech_content_dim)`` speech content C^s, one row per phoneme."""
    speech_mask: torch.Tensor
    """``(B, Ls)`` True on the rows that belong to each item."""
    video: torch.Tensor
    """``(B, Lv, video_content_dim)`` video content C^v, one row per video frame."""
    video_mask: torch.Tensor
    """``(B, Lv)``."""
    kl: torch.Tensor
    """``(B,)`` KL of both modalities' latents."""


class ContentSynchronizer(nn.Module):
    """Reads the response text's hidden states r^t and writes the content features of the
    speech generator (C^s) and the talking-head generator (C^v).

    One shared Transformer VAE serves both modalities; what differs is the learned content
    query q_c^{s/v} (a modality vector plus a learned position per output row) and the
    output projection to each generator's feature width. Output lengths are given per
    item, because they are facts of the generators (phonemes of the text, frames of the
    speech), not something to predict here.
    """

    def __init__(self, config: ContentSynchronizerConfig, input_dim: int):
        super().__init__()
        self.config = config
        d = config.d_model
        self.input_ffn = feed_forward(input_dim, d)
        self.vae = TransformerVAE(d, config.num_heads, config.num_layers, config.ffn_dim, config.latent_dim, config.dropout)
        self.speech_query = nn.Parameter(torch.randn(d) * 0.02)
        self.video_query = nn.Parameter(torch.randn(d) * 0.02)
        self.speech_positions = nn.Embedding(config.max_speech_length, d)
        self.video_positions = nn.Embedding(config.max_video_length, d)
        nn.init.normal_(self.speech_positions.weight, std=0.02)
        nn.init.normal_(self.video_positions.weight, std=0.02)
        self.speech_out = nn.Linear(d, config.speech_content_dim)
        self.video_out = nn.Linear(d, config.video_content_dim)

    def estimate_lengths(self, num_chars: torch.Tensor) -> tuple:
        """Content lengths ``((B,), (B,))`` estimated from response lengths in characters,
        for use when no generator gives exact ones."""
        speech = (num_chars.float() * self.config.phonemes_per_char).round().long()
        video = (num_chars.float() * self.config.frames_per_char).round().long()
        return (
            speech.clamp(1, self.config.max_speech_length),
            video.clamp(1, self.config.max_video_length),
        )

    def _queries(self, base: torch.Tensor, positions: nn.Embedding, lengths: torch.Tensor, name: str):
        limit = positions.num_embeddings
        if int(lengths.max()) > limit:
            raise ValueError(
                f"{name} content length {int(lengths.max())} exceeds content_synchronizer.max_{name}_length={limit}"
            )
        if int(lengths.min()) < 1:
            raise ValueError(f"{name} content lengths must be at least 1, got {lengths.tolist()}")
        steps = torch.arange(int(lengths.max()), device=lengths.device)
        queries = base + positions(steps)  # (L, d)
        padding = steps[None, :] >= lengths[:, None]  # (B, L)
        return queries, padding

    def forward(
        self,
        hidden_states: torch.Tensor,
        response_mask: torch.Tensor,
        speech_lengths: torch.Tensor,
        video_lengths: torch.Tensor,
    ) -> ContentOutput:
        """
        Args:
            hidden_states: ``(B, L, input_dim)`` language-model hidden states.
            response_mask: ``(B, L)`` True on the response text's tokens (r^t).
            speech_lengths: ``(B,)`` rows of C^s per item.
            video_lengths: ``(B,)`` rows of C^v per item.
        """
        empty = ~response_mask.any(1)
        if empty.any():
            rows = empty.nonzero().flatten().tolist()
            raise ValueError(f"batch rows {rows} have no response tokens for the Content Synchronizer")
        b = hidden_states.shape[0]
        dtype = self.speech_query.dtype
        source = self.input_ffn(hidden_states.to(dtype))
        speech_q, speech_pad = self._queries(self.speech_query, self.speech_positions, speech_lengths, "speech")
        video_q, video_pad = self._queries(self.video_query, self.video_positions, video_lengths, "video")
        # Both modalities go through the shared VAE in one call: stack them on the batch
        # axis, padding the shorter query set.
        length = max(speech_q.shape[0], video_q.shape[0])
        queries = torch.zeros(2, length, source.shape[-1], dtype=dtype, device=source.device)
        queries[0, : speech_q.shape[0]] = speech_q
        queries[1, : video_q.shape[0]] = video_q
        padding = torch.ones(2 * b, length, dtype=torch.bool, device=source.device)
        padding[:b, : speech_pad.shape[1]] = speech_pad
        padding[b:, : video_pad.shape[1]] = video_pad
        out = self.vae(
            source.repeat(2, 1, 1),
            queries.repeat_interleave(b, dim=0),
            source_padding_mask=(~response_mask).repeat(2, 1),
            query_padding_mask=padding,
        )
        speech = self.speech_out(out.features[:b, : speech_q.shape[0]])
        video = self.video_out(out.features[b:, : video_q.shape[0]])
        return ContentOutput(
            speech=speech,
            speech_mask=~speech_pad,
            video=video,
            video_mask=~video_pad,
            kl=out.kl[:b] + out.kl[b:],
        )
