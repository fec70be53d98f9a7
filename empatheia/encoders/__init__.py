"""Frozen modality encoders: audio and face video into fixed numbers of feature tokens."""

from .pooling import pool_to_tokens
from .speech import SpeechEncoder
from .video import VideoEncoder

__all__ = ["SpeechEncoder", "VideoEncoder", "pool_to_tokens"]
