"""Content Synchronizer (§4.3, eqs. 1-2)."""

from __future__ import annotations


from typing import NamedTuple, Optional

import torch
from torch import nn

from ..config import ContentSynchronizerConfig
from .transformer_vae import TransformerVAE, feed_forward


class ContentOutput(NamedTuple):
    speech: torch.Tensor
    """``(B, Ls, speech_content_dim)`` speech content C^s, one row per speech content unit."""
    speech_mask: torch.Tensor
    """``(B, Ls)`` True on the rows that belong to each item."""
    video: torch.Tensor
    """``(B, Ls, video_content_dim)`` video content C^v, one row per speech content unit
    (the same units as C^s; the talking head spreads them over frames by the speech's
    alignment)."""
    video_mask: torch.Tensor
    """``(B, Ls)``, equal to ``speech_mask``."""
    kl: torch.Tensor
    """``(B,)`` KL of both modalities' latents."""


class ContentSynchronizer(nn.Module):
    """Reads the response text's hidden states r^t and writes the content features of the
    speech generator (C^s) and the talking-head generator (C^v).

    One shared Transformer VAE serves both modalities; what differs is the learned content
    query q_c^{s/v} (a modality vector plus a learned position per output row) and the
    output projection to each generator's feature width. Both modalities have one row per
    speech content unit (phoneme): the speech generator decides how long each unit
    sounds, and the talking head follows that timing (its alignment), so the lips are in
    sync by construction rather than by predicting a frame count. With
    ``unit_vocab_size > 0`` every query row also carries an embedding of its unit's id
    (the speech generator's phoneme id), so that what a unit does to the mouth (a vowel
    opens it, /m b p/ close it) is learnable from the row alone. Lengths are given per
    item, because they are facts of the speech generator, not something to predict here.

    How loud a unit sounds, and so how far it opens the mouth, depends on its neighbours
    as much as on itself: a vowel before a pause fades, a consonant between vowels is
    voiced through (docs/model.md measures how much). The queries' self-attention can find
    the row next door only through learned absolute positions, which takes far more steps
    than the heads get, so with
    ``unit_context > 0`` a convolution over the neighbouring rows' unit embeddings gives
    each query its context directly. It starts at zero, so a model given one later
    (:func:`~empatheia.training.content_refit.add_unit_context`) writes what it wrote
    before until it trains.
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
        if config.max_video_length < config.max_speech_length:
            raise ValueError(
                f"content_synchronizer.max_video_length ({config.max_video_length}) must be at least "
                f"max_speech_length ({config.max_speech_length}): C^v has one row per speech unit"
            )
        self.video_positions = nn.Embedding(config.max_video_length, d)
        nn.init.normal_(self.speech_positions.weight, std=0.02)
        nn.init.normal_(self.video_positions.weight, std=0.02)
        self.unit_embedding = nn.Embedding(config.unit_vocab_size, d) if config.unit_vocab_size > 0 else None
        if self.unit_embedding is not None:
            nn.init.normal_(self.unit_embedding.weight, std=0.02)
        self.unit_context = self.unit_context_layer() if self.unit_embedding is not None and config.unit_context else None
        self.speech_out = nn.Linear(d, config.speech_content_dim)
        self.video_out = nn.Linear(d, config.video_content_dim)

    def unit_context_layer(self) -> nn.Conv1d:
        """A zero convolution of width ``config.unit_context`` over the rows' unit embeddings."""
        width = self.config.unit_context
        if width < 1 or width % 2 == 0:
            raise ValueError(f"content_synchronizer.unit_context must be 0 or odd, got {width}")
        d = self.config.d_model
        layer = nn.Conv1d(d, d, width, padding=width // 2)
        nn.init.zeros_(layer.weight)
        nn.init.zeros_(layer.bias)
        return layer

    def estimate_lengths(self, num_chars: torch.Tensor) -> torch.Tensor:
        """Content lengths ``(B,)`` estimated from response lengths in characters, for use
        when no speech generator gives exact ones."""
        speech = (num_chars.float() * self.config.phonemes_per_char).round().long()
        return speech.clamp(1, self.config.max_speech_length)

    def _unit_rows(self, units: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``(B, L)`` unit ids -> ``(B, L, d)``: each row's unit embedding, plus its
        neighbours' through the context convolution when there is one."""
        embedded = self.unit_embedding(units)  # (B, L, d)
        if self.unit_context is None:
            return embedded
        # Rows past an item's length are no unit: its last row's neighbours there are nothing.
        steps = torch.arange(units.shape[1], device=units.device)
        present = (steps[None, :] < lengths[:, None].to(units.device)).unsqueeze(-1).to(embedded.dtype)  # (B, L, 1)
        return embedded + self.unit_context((embedded * present).transpose(1, 2)).transpose(1, 2)

    def _queries(self, base: torch.Tensor, positions: nn.Embedding, lengths: torch.Tensor, unit_rows) -> torch.Tensor:
        """``(B, L, d)`` query rows: modality vector + position (+ the rows' units, :meth:`_unit_rows`)."""
        steps = torch.arange(int(lengths.max()), device=lengths.device)
        queries = (base + positions(steps)).unsqueeze(0).expand(lengths.shape[0], -1, -1)  # (B, L, d)
        return queries if unit_rows is None else queries + unit_rows

    def forward(
        self,
        hidden_states: torch.Tensor,
        response_mask: torch.Tensor,
        speech_lengths: torch.Tensor,
        speech_units: Optional[torch.Tensor] = None,
    ) -> ContentOutput:
        """
        Args:
            hidden_states: ``(B, L, input_dim)`` language-model hidden states.
            response_mask: ``(B, L)`` True on the response text's tokens (r^t).
            speech_lengths: ``(B,)`` speech content units per item: rows of C^s and C^v.
            speech_units: ``(B, Ls)`` int64 unit ids (``Ls >= max(speech_lengths)``; ids
                past an item's length are ignored), required when
                ``content_synchronizer.unit_vocab_size > 0`` and refused otherwise.
        """
        empty = ~response_mask.any(1)
        if empty.any():
            rows = empty.nonzero().flatten().tolist()
            raise ValueError(f"batch rows {rows} have no response tokens for the Content Synchronizer")
        limit = self.config.max_speech_length
        if int(speech_lengths.max()) > limit:
            raise ValueError(
                f"speech content length {int(speech_lengths.max())} exceeds content_synchronizer.max_speech_length={limit}"
            )
        if int(speech_lengths.min()) < 1:
            raise ValueError(f"speech content lengths must be at least 1, got {speech_lengths.tolist()}")
        length = int(speech_lengths.max())
        units = None
        if self.unit_embedding is not None:
            if speech_units is None:
                raise ValueError("speech_units is required: content_synchronizer.unit_vocab_size > 0")
            if speech_units.dim() != 2 or speech_units.shape[0] != speech_lengths.shape[0] or speech_units.shape[1] < length:
                raise ValueError(
                    f"speech_units must be (B={speech_lengths.shape[0]}, >= {length}), got {tuple(speech_units.shape)}"
                )
            units = speech_units[:, :length].long()
            padding_rows = torch.arange(length, device=units.device)[None, :] >= speech_lengths[:, None].to(units.device)
            units = units.masked_fill(padding_rows, 0)
            if int(units.min()) < 0 or int(units.max()) >= self.config.unit_vocab_size:
                raise ValueError(
                    f"speech_units must be in [0, content_synchronizer.unit_vocab_size={self.config.unit_vocab_size}), "
                    f"got [{int(units.min())}, {int(units.max())}]"
                )
        elif speech_units is not None:
            raise ValueError("speech_units given but content_synchronizer.unit_vocab_size is 0 (no unit embedding)")
        b = hidden_states.shape[0]
        dtype = self.speech_query.dtype
        source = self.input_ffn(hidden_states.to(dtype))
        padding = torch.arange(length, device=source.device)[None, :] >= speech_lengths.to(source.device)[:, None]  # (B, Ls)
        # Both modalities go through the shared VAE in one call, stacked on the batch axis.
        unit_rows = None if units is None else self._unit_rows(units, speech_lengths)
        queries = torch.cat(
            [
                self._queries(self.speech_query, self.speech_positions, speech_lengths, unit_rows),
                self._queries(self.video_query, self.video_positions, speech_lengths, unit_rows),
            ]
        )
        out = self.vae(
            source.repeat(2, 1, 1),
            queries.to(dtype),
            source_padding_mask=(~response_mask).repeat(2, 1),
            query_padding_mask=padding.repeat(2, 1),
        )
        return ContentOutput(
            speech=self.speech_out(out.features[:b]),
            speech_mask=~padding,
            video=self.video_out(out.features[b:]),
            video_mask=~padding,
            kl=out.kl[:b] + out.kl[b:],
        )
