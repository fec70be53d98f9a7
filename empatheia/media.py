"""Reading audio and video into the tensors the encoders take.

Every problem with a file is a :class:`~empatheia.data.DataError` that names the file and
whether it was the audio or the video: missing, unreadable or corrupt, empty, silent, a
sample rate too low to resample from, more channels than mono or stereo, no frames, or
longer than :class:`~empatheia.config.MediaLimits` allows (or, with ``trim``, cut to it
with a warning).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import List, Optional, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F

from .config import MediaLimits
from .errors import DataError

logger = logging.getLogger(__name__)

MIN_SAMPLE_RATE = 8000
"""Below this, upsampling to the encoder's 16 kHz cannot bring back the speech band."""
MAX_CHANNELS = 2
"""Mono or stereo are averaged to mono; a multichannel mix has no single speaker track."""
MIN_DURATION = 0.1
"""Seconds; shorter than this is not an utterance (HuBERT needs 25 ms for one frame)."""
SILENCE_PEAK = 1e-4
"""Peak amplitude below which a clip is silent (-80 dBFS): it has nothing to encode, and
per-utterance normalisation would amplify its noise floor into features."""


def within_limits(seconds: float, limits: MediaLimits, kind: str, source=None, complete: bool = True) -> bool:
    """Whether a ``kind`` ("audio" or "video") clip of ``seconds`` may be read whole;
    ``complete=False`` says ``seconds`` is only as far as decoding has gone.

    ``False`` means cut it to ``limits.max_seconds`` (``limits.trim``; logged as a
    warning); a clip over the limit that may not be trimmed is a :class:`DataError`.
    """
    if seconds <= limits.max_seconds:
        return True
    m = limits.max_seconds
    over = f"is {seconds:.1f} s long, over the {m:g} s limit" if complete else f"is longer than the {m:g} s limit"
    if not limits.trim:
        raise DataError(f"{kind} {over}", file=source, field=kind)
    logger.warning("%s%s %s: only its first %g s are used", f"{source}: " if source is not None else "", kind, over, m)
    return False


def load_audio(path: Union[str, Path], sample_rate: int, limits: MediaLimits = MediaLimits()) -> torch.Tensor:
    """Read an audio file as a ``(T,)`` float32 mono waveform at ``sample_rate``,
    ``T <= limits.max_seconds * sample_rate``.

    The header's length is checked against ``limits`` before any sample is read, and
    at most ``max_seconds`` of samples are ever read, so memory stays bounded however
    long the file is.
    """
    import soundfile

    path = Path(path)
    if not path.is_file():
        raise DataError("audio file not found", file=path, field="audio")
    try:
        with soundfile.SoundFile(str(path)) as file:
            rate, frames = file.samplerate, file.frames
            if rate > 0 and not within_limits(frames / rate, limits, "audio", path):
                frames = int(limits.max_seconds * rate)
            # The cap holds even where the header's count is not a real length.
            data = file.read(frames=min(frames, int(limits.max_seconds * max(rate, 1)) + 1), dtype="float32", always_2d=True)
    except DataError:
        raise
    except Exception as error:  # soundfile raises its own LibsndfileError and RuntimeError
        raise DataError(f"cannot read audio (corrupt or not an audio file): {error}", file=path, field="audio") from None
    return prepare_waveform(torch.from_numpy(data.T.copy()), rate, sample_rate, source=str(path), limits=limits)


def prepare_waveform(
    waveform: Union[np.ndarray, torch.Tensor],
    rate: int,
    sample_rate: int,
    source: Optional[str] = None,
    limits: Optional[MediaLimits] = None,
) -> torch.Tensor:
    """``(T,)`` or ``(C, T)`` audio at ``rate`` -> ``(T,)`` float32 mono at ``sample_rate``.

    Raises :class:`DataError` for empty, too short, silent or non-finite audio, for a rate
    below :data:`MIN_SAMPLE_RATE` and for more than :data:`MAX_CHANNELS` channels. With
    ``limits``, a waveform longer than ``limits.max_seconds`` is refused or, with
    ``limits.trim``, cut to it; without, its length is the caller's to bound.
    """

    def fail(reason: str):
        raise DataError(reason, file=source, field="audio")

    wave = torch.as_tensor(waveform, dtype=torch.float32)
    if wave.dim() == 2:
        if wave.shape[0] > MAX_CHANNELS:
            fail(f"has {wave.shape[0]} channels; expected mono or stereo (shape is (channels, T))")
    elif wave.dim() != 1:
        fail(f"must be (T,) or (channels, T), got shape {tuple(wave.shape)}")
    if wave.numel() == 0:
        fail("audio is empty (0 samples)")
    if not rate or rate < MIN_SAMPLE_RATE:
        fail(f"sample rate {rate} Hz is below the {MIN_SAMPLE_RATE} Hz minimum; the speech band cannot be recovered")
    if wave.shape[-1] < MIN_DURATION * rate:
        fail(f"audio is {wave.shape[-1] / rate:.3f} s long, shorter than the {MIN_DURATION} s minimum")
    if limits is not None and not within_limits(wave.shape[-1] / rate, limits, "audio", source):
        wave = wave[..., : int(limits.max_seconds * rate)]
    if not torch.isfinite(wave).all():
        fail("audio contains NaN or infinite samples")
    if wave.dim() == 2:
        wave = wave.mean(0)
    # Checked on the mono mix: channels in opposite phase cancel to nothing.
    peak = float(wave.abs().max())
    if peak < SILENCE_PEAK:
        fail(f"audio is silent (peak amplitude {peak:.2e})")
    if rate != sample_rate:
        import torchaudio.functional

        wave = torchaudio.functional.resample(wave, int(rate), int(sample_rate))
    return wave.contiguous()


def sample_times(duration: float, frame_rate: Optional[float], max_frames: int) -> List[float]:
    """Times (s) at which to take frames: ``frame_rate`` per second, each from the middle
    of its interval, or, when that would exceed ``max_frames`` (or ``frame_rate`` is
    ``None``), ``max_frames`` spread evenly over the clip."""
    count = max_frames if frame_rate is None else max(1, min(max_frames, int(duration * frame_rate)))
    step = duration / count
    return [(i + 0.5) * step for i in range(count)]


def load_video_frames(
    path: Union[str, Path], max_frames: int = 8, frame_rate: Optional[float] = None, limits: MediaLimits = MediaLimits()
) -> torch.Tensor:
    """Decode a video and take frames at ``frame_rate`` per second, at most ``max_frames``
    (spread over the whole clip when it is longer or ``frame_rate`` is ``None``).

    Returns ``(F, H, W, 3)`` uint8 RGB, ``1 <= F <= max_frames``. The clip's length (from
    the header, or where it states none from the packets' timestamps, read without
    decoding) is checked against ``limits`` before any frame is decoded; a trimmed clip
    is sampled over its first ``limits.max_seconds``. Decoding stops at the last frame
    taken and only the frames taken are converted to RGB, so memory stays bounded.
    """
    import av

    path = Path(path)
    if not path.is_file():
        raise DataError("video file not found", file=path, field="video")
    frames = None
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise DataError("has no video stream", file=path, field="video")
            stream = container.streams.video[0]
            duration = _duration(container, stream)
            if duration is not None and duration > 0:
                frames = _decode_at(container, stream, _limited(duration, limits, path), frame_rate, max_frames)
            else:
                duration = _packet_duration(container, stream, limits.max_seconds)
        if frames is None:
            # The packets are spent on measuring: decode from a fresh start.
            with av.open(str(path)) as container:
                stream = container.streams.video[0]
                frames = _decode_at(container, stream, _limited(duration, limits, path, False), frame_rate, max_frames)
    except DataError:
        raise
    except Exception as error:  # PyAV raises a family of FFmpeg errors
        raise DataError(f"cannot decode video (corrupt or not a video file): {error}", file=path, field="video") from None
    if not frames:
        raise DataError("video has no frames", file=path, field="video")
    return torch.from_numpy(np.stack(frames))


def _duration(container, stream) -> Optional[float]:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / 1_000_000
    return None


def _limited(duration: float, limits: MediaLimits, path: Path, complete: bool = True) -> float:
    return duration if duration <= 0 or within_limits(duration, limits, "video", path, complete) else limits.max_seconds


def _packet_duration(container, stream, max_seconds: float) -> float:
    """Seconds the stream's packets span, demuxed without decoding; counting stops once
    past ``max_seconds`` (enough to refuse or trim), so a long file is not read through."""
    period = _period(stream)
    first, end = None, 0.0
    for packet in container.demux(stream):
        if packet.size == 0:  # the flush packet at the end
            continue
        span = _span(packet, period)
        if packet.pts is None or packet.time_base is None:
            first, end = 0.0 if first is None else first, end + span  # a raw stream: one after another
        else:
            t = float(packet.pts * packet.time_base)
            first = t if first is None else min(first, t)
            end = max(end, t + span)
        if end - first > max_seconds:
            break
    return end - first if first is not None else 0.0


def _period(stream) -> float:
    """Seconds between frames at the stream's average rate (25 fps where it has none)."""
    return float(1 / stream.average_rate) if stream.average_rate else 0.04


def _span(item, period: float) -> float:
    """Seconds a packet or frame lasts: its own duration where it has one, else ``period``."""
    duration, time_base = getattr(item, "duration", None), getattr(item, "time_base", None)
    return float(duration * time_base) if duration and time_base is not None else period


def _decode_at(container, stream, duration: float, frame_rate: Optional[float], max_frames: int) -> List[np.ndarray]:
    """The frames on screen at :func:`sample_times` over ``duration`` seconds, as
    ``(H, W, 3)`` uint8 RGB arrays; decoding stops at the last of them."""
    if duration <= 0:
        return []
    targets = sample_times(duration, frame_rate, max_frames)
    start = float(stream.start_time * stream.time_base) if stream.start_time is not None else None
    period = _period(stream)
    out: List[np.ndarray] = []
    last, position = None, 0.0
    for frame in container.decode(stream):
        if frame.pts is not None and stream.time_base is not None:
            start = float(frame.pts * stream.time_base) if start is None else start
            t = float(frame.pts * stream.time_base) - start
        else:  # a raw stream without timestamps: frames follow one another
            t = position
        position = t + _span(frame, period)
        image = None
        # A frame shows from t to t + period; it is the picture at every target in that span.
        while len(out) < len(targets) and targets[len(out)] < position:
            image = frame.to_ndarray(format="rgb24") if image is None else image
            out.append(image)
        last = frame
        if len(out) == len(targets):
            break
    if len(out) < len(targets) and last is not None:
        # The header overstated the length: the last frame stands in for the rest.
        image = last.to_ndarray(format="rgb24")
        out.extend(image for _ in range(len(targets) - len(out)))
    return out


def sample_frames(frames: torch.Tensor, num_frames: int) -> torch.Tensor:
    """Pick ``num_frames`` frames evenly spaced over ``(F, H, W, 3)`` frames."""
    if frames.dim() != 4 or frames.shape[-1] != 3:
        raise ValueError(f"video frames must be (F, H, W, 3), got shape {tuple(frames.shape)}")
    if frames.shape[0] == 0:
        raise ValueError("video has no frames")
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


# ---------------------------------------------------------------------- writing
def write_wav(path: Union[str, Path], samples: torch.Tensor, sample_rate: int) -> Path:
    """``(T,)`` float samples in [-1, 1] as 16-bit PCM."""
    import soundfile

    path = Path(path)
    soundfile.write(str(path), samples.detach().float().clamp(-1, 1).cpu().numpy(), sample_rate, subtype="PCM_16")
    return path


def write_mp4(
    path: Union[str, Path],
    frames: torch.Tensor,
    fps: float,
    audio: Optional[torch.Tensor] = None,
    sample_rate: Optional[int] = None,
) -> Path:
    """``(F, H, W, 3)`` uint8 RGB frames as H.264 (yuv420p, which every player reads),
    with ``(T,)`` float audio muxed as AAC when given."""
    import av
    from fractions import Fraction

    path = Path(path)
    video = frames.detach().cpu().numpy()
    if video.dtype != np.uint8 or video.ndim != 4 or video.shape[-1] != 3:
        raise ValueError(f"frames must be (F, H, W, 3) uint8, got {tuple(video.shape)} {video.dtype}")
    # yuv420p halves the chroma planes, so both sides must be even.
    height, width = video.shape[1] // 2 * 2, video.shape[2] // 2 * 2
    video = video[:, :height, :width]
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"crf": "20", "preset": "veryfast"}
        sound = None
        if audio is not None:
            sound = container.add_stream("aac", rate=sample_rate)
            sound.layout = "mono"
        for image in video:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        container.mux(stream.encode())
        if sound is not None:
            samples = audio.detach().float().clamp(-1, 1).cpu().numpy()[None, :]
            chunk = 1024  # AAC frames hold 1024 samples
            for start in range(0, samples.shape[1], chunk):
                piece = np.ascontiguousarray(samples[:, start : start + chunk])
                frame = av.AudioFrame.from_ndarray(piece, format="fltp", layout="mono")
                frame.sample_rate = sample_rate
                frame.pts = start
                container.mux(sound.encode(frame))
            container.mux(sound.encode())
    return path
