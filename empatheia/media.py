"""Reading audio and video into the tensors the encoders take."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F


def load_audio(path: Union[str, Path], sample_rate: int) -> torch.Tensor:
    """Read an audio file as a ``(T,)`` float32 mono waveform at ``sample_rate``."""
    import soundfile

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"audio file {path} not found")
    try:
        data, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    except Exception as error:  # soundfile raises its own LibsndfileError and RuntimeError
        raise ValueError(f"{path}: cannot read audio: {error}") from error
    return prepare_waveform(torch.from_numpy(data.T.copy()), rate, sample_rate, source=str(path))


def prepare_waveform(
    waveform: Union[np.ndarray, torch.Tensor], rate: int, sample_rate: int, source: str = "waveform"
) -> torch.Tensor:
    """``(T,)`` or ``(C, T)`` audio at ``rate`` -> ``(T,)`` float32 mono at ``sample_rate``."""
    wave = torch.as_tensor(waveform, dtype=torch.float32)
    if wave.dim() == 2:
        wave = wave.mean(0)
    elif wave.dim() != 1:
        raise ValueError(f"{source}: audio must be (T,) or (channels, T), got shape {tuple(wave.shape)}")
    if wave.numel() == 0:
        raise ValueError(f"{source}: audio is empty")
    if not torch.isfinite(wave).all():
        raise ValueError(f"{source}: audio contains NaN or infinite samples")
    if rate != sample_rate:
        import torchaudio.functional

        wave = torchaudio.functional.resample(wave, int(rate), int(sample_rate))
    return wave.contiguous()


def load_video_frames(path: Union[str, Path], num_frames: int) -> torch.Tensor:
    """Decode a video and sample ``num_frames`` frames evenly over its length.

    Returns ``(num_frames, H, W, 3)`` uint8 RGB.
    """
    import av

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"video file {path} not found")
    try:
        with av.open(str(path)) as container:
            frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    except Exception as error:  # PyAV raises a family of FFmpeg errors
        raise ValueError(f"{path}: cannot decode video: {error}") from error
    if not frames:
        raise ValueError(f"{path}: video has no frames")
    return sample_frames(torch.from_numpy(np.stack(frames)), num_frames)


def sample_frames(frames: torch.Tensor, num_frames: int) -> torch.Tensor:
    """Pick ``num_frames`` frames evenly spaced over ``(F, H, W, 3)`` frames."""
    if frames.dim() != 4 or frames.shape[-1] != 3:
        raise ValueError(f"video frames must be (F, H, W, 3), got shape {tuple(frames.shape)}")
    index = torch.linspace(0, frames.shape[0] - 1, num_frames).round().long()
    return frames[index]


def frames_to_clip_input(frames: torch.Tensor, size: int, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """``(F, H, W, 3)`` uint8 RGB -> ``(F, 3, size, size)`` float, shorter side resized to
    ``size``, centre-cropped and normalised with the encoder's mean and std."""
    x = torch.as_tensor(frames).permute(0, 3, 1, 2).float().div_(255.0)
    h, w = x.shape[-2:]
    scale = size / min(h, w)
    new_h, new_w = max(size, round(h * scale)), max(size, round(w * scale))
    x = F.interpolate(x, size=(new_h, new_w), mode="bicubic", align_corners=False, antialias=True)
    top, left = (new_h - size) // 2, (new_w - size) // 2
    x = x[..., top : top + size, left : left + size].clamp_(0.0, 1.0)
    return (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
