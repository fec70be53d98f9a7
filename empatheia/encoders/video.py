"""The frozen video encoder (§4.1): a CLIP ViT built with open_clip (the paper's) or
torchvision's MobileNetV2 (the ``small`` preset's), pooled over time to a fixed number of
tokens."""

from __future__ import annotations

from typing import Optional

import open_clip
import torch

from ..config import IMAGENET_MEAN, IMAGENET_STD, VIDEO_BACKENDS, VideoEncoderConfig
from ..pretrained import resolve_pretrained
from .frozen import FrozenEncoder, outside_cpu_autocast
from .pooling import pool_to_tokens


class VideoEncoder(FrozenEncoder):
    """Face frames in, ``num_tokens`` tokens per utterance out.

    Each sampled frame is encoded to one image embedding by ``self.visual``: an open_clip
    vision tower (``backend: open_clip``) or MobileNetV2's pooled features
    (``backend: mobilenet_v2``); an utterance's embeddings are average-pooled over time
    into ``num_tokens`` tokens.
    """

    def __init__(self, config: VideoEncoderConfig):
        super().__init__()
        self.config = config
        if config.backend == "mobilenet_v2":
            self._build_mobilenet(config)
        elif config.backend == "open_clip":
            self._build_open_clip(config)
        else:
            raise ValueError(
                f"video_encoder.backend: unknown backend {config.backend!r}; choose one of {list(VIDEO_BACKENDS)}"
            )
        self.freeze()

    def _build_mobilenet(self, config: VideoEncoderConfig) -> None:
        from .mobilenet import MobileNetV2Features

        weights = resolve_pretrained(config.pretrained) if config.pretrained else None
        self.visual = MobileNetV2Features(weights, image_size=config.image_size)
        if self.visual.output_dim != config.embed_dim:
            raise ValueError(
                f"video_encoder.embed_dim is {config.embed_dim} but MobileNetV2 embeds to {self.visual.output_dim}"
            )
        # The ImageNet weights only mean something on inputs prepared as they were trained.
        if config.image_size != 224:
            raise ValueError(f"video_encoder.image_size is {config.image_size}; MobileNetV2's ImageNet weights expect 224")
        if not _close(config.mean, IMAGENET_MEAN) or not _close(config.std, IMAGENET_STD):
            raise ValueError(
                f"video_encoder.mean/std are {config.mean}/{config.std}; MobileNetV2's ImageNet weights expect "
                f"mean {IMAGENET_MEAN} and std {IMAGENET_STD}"
            )

    def _build_open_clip(self, config: VideoEncoderConfig) -> None:
        if config.pretrained:
            clip = open_clip.create_model(config.model_name, pretrained=resolve_pretrained(config.pretrained))
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

    @property
    def hidden_size(self) -> int:
        return self.config.embed_dim

    @torch.no_grad()
    @outside_cpu_autocast
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


def _close(values, reference, tolerance: float = 1e-3) -> bool:
    return len(values) == len(reference) and all(abs(a - b) <= tolerance for a, b in zip(values, reference))
