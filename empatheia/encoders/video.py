"""CLIP ViT video encoder (§4.1), frozen, built with open_clip."""

from __future__ import annotations

from typing import Optional

import open_clip
import torch

from ..config import VideoEncoderConfig
from .frozen import FrozenEncoder
from .pooling import pool_to_tokens


class VideoEncoder(FrozenEncoder):
    """Face frames in, ``num_tokens`` tokens per utterance out.

    Each sampled frame is encoded to its CLIP image embedding; an utterance's embeddings
    are average-pooled over time into ``num_tokens`` tokens.
    """

    def __init__(self, config: VideoEncoderConfig):
        super().__init__()
        self.config = config
        if config.pretrained:
            clip = open_clip.create_model(config.model_name, pretrained=config.pretrained)
            self.visual = clip.visual  # the text tower is not needed
            embed_dim = clip.visual.output_dim
        else:
            model_cfg = open_clip.get_model_config(config.model_name)
            if model_cfg is None:
                raise ValueError(f"open_clip knows no model {config.model_name!r}")
            vision_cfg = {**model_cfg["vision_cfg"], **config.vision_cfg}
            self.visual = open_clip.model._build_vision_tower(config.embed_dim, vision_cfg)
            embed_dim = self.visual.output_dim
        if embed_dim != config.embed_dim:
            raise ValueError(
                f"video_encoder.embed_dim is {config.embed_dim} but {config.model_name} embeds to {embed_dim}"
            )
        image_size = self.visual.image_size
        image_size = image_size[0] if isinstance(image_size, (tuple, list)) else image_size
        if image_size != config.image_size:
            raise ValueError(f"video_encoder.image_size is {config.image_size} but the tower expects {image_size}")
        self.freeze()

    @property
    def hidden_size(self) -> int:
        return self.config.embed_dim

    @torch.no_grad()
    def forward(self, frames: torch.Tensor, lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
        """
        Args:
            frames: ``(N, F, 3, S, S)`` normalised frames, zero-padded after ``lengths``.
            lengths: ``(N,)`` valid frames per utterance (default: all ``F``).

        Returns:
            ``(N, num_tokens, embed_dim)`` features.
        """
        n, f = frames.shape[:2]
        dtype = next(self.visual.parameters()).dtype
        if lengths is None:
            lengths = torch.full((n,), f, device=frames.device)
        lengths = lengths.to(frames.device)
        valid = torch.arange(f, device=frames.device)[None, :] < lengths[:, None]  # (N, F)
        # Padding frames are never encoded: only the valid ones go through the tower.
        encoded = self.visual(frames[valid].to(dtype))
        embeddings = encoded.new_zeros(n, f, encoded.shape[-1])
        embeddings[valid] = encoded
        return pool_to_tokens(embeddings, lengths, self.config.num_tokens)
