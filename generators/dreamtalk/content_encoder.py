"""The audio content encoder: a window of wav2vec2 frames around each video frame -> one
``d_model`` vector per window position.

Its output, flattened window-major (``11 x 256 = 2816``), is Empatheia's video content
feature C^v: the decoder reads nothing else from the audio.
"""

from __future__ import annotations

import torch
from torch import nn

from .config import DreamTalkConfig
from .layers import PositionTable, transformer_encoder


def audio_windows(features: torch.Tensor, num_frames: int, window: int) -> torch.Tensor:
    """Cut the wav2vec2 window of every video frame.

    wav2vec2 runs at 50 Hz and the video at 25 fps, so frame ``i`` is centred on audio
    frame ``2 * i``; positions before the start or past the end are zeros.

    Args:
        features: ``(N, C)`` wav2vec2 frames of one recording.
        num_frames: video frames ``L``.
        window: frames on each side of the centre.

    Returns:
        ``(L, 2 * window + 1, C)``.
    """
    offsets = torch.arange(-window, window + 1, device=features.device)
    index = 2 * torch.arange(num_frames, device=features.device)[:, None] + offsets[None]  # (L, W)
    inside = (index >= 0) & (index < features.shape[0])
    gathered = features[index.clamp(0, max(features.shape[0] - 1, 0))]  # (L, W, C)
    return gathered * inside[..., None].to(features.dtype)


class AudioContentEncoder(nn.Module):
    """Projects each wav2vec2 frame to ``d_model``, adds window positions and runs a
    transformer encoder over each window on its own (windows never see each other).

    Checkpoint names: ``increase_embed_dim`` (Linear ``audio_feature_dim -> d_model``),
    ``pos_embed.pos_table`` ``(1, 2 * window + 1, d_model)``, ``encoder.layers.{i}.*``.
    """

    def __init__(self, config: DreamTalkConfig):
        super().__init__()
        self.increase_embed_dim = nn.Linear(config.audio_feature_dim, config.d_model)
        self.pos_embed = PositionTable(config.d_model, config.window_frames)
        self.encoder = transformer_encoder(
            config.d_model, config.num_heads, config.ffn_dim, config.content_layers, config.dropout
        )

    def forward(self, windows: torch.Tensor) -> torch.Tensor:
        """
        Args:
            windows: ``(B, L, W, audio_feature_dim)`` wav2vec2 windows.

        Returns:
            ``(B, L, W, d_model)`` content.
        """
        batch, frames, width, _ = windows.shape
        x = self.increase_embed_dim(windows).reshape(batch * frames, width, -1)
        x = self.encoder(x + self.pos_embed(width))
        return x.reshape(batch, frames, width, -1)
