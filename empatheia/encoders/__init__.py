"""Frozen modality encoders: audio and face video into fixed numbers of feature tokens."""

from .mobilenet import MobileNetV2Features
from .pooling import pool_to_tokens
from .speech import SpeechEncoder
from .video import VideoEncoder
from .whisper import WhisperCT2Encoder

__all__ = ["MobileNetV2Features", "SpeechEncoder", "VideoEncoder", "WhisperCT2Encoder", "pool_to_tokens"]
