"""What a user hands the avatar, checked before the model sees it.

An upload is accepted for what it decodes as, never for its name or declared type: audio
must decode (FFmpeg, through PyAV) to a sound stream, a video to a moving picture (not a
still image in a video's name), a portrait to an image. Durations are counted while
decoding, so a header that lies about the length does not get past the limit, and a long
file is refused as soon as decoding passes the limit rather than after reading all of it.
The length limit is the media readers' own policy (:class:`~empatheia.config.MediaLimits`,
which :class:`UploadLimits` extends): 30 s by default, refused (413) unless ``trim``.
Each problem is an :class:`UploadError` naming the field and what was wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, Optional

import av
import cv2
import numpy as np

from ..config import MediaLimits
from ..errors import DataError
from ..media import prepare_waveform, within_limits

# Image demuxers: FFmpeg opens a PNG or JPEG as a one-frame "video".
_STILL_IMAGE_FORMATS = ("image2", "_pipe")
_VIDEO_SIDE = 640
"""Longer side kept of uploaded video frames: the face finder and the encoders work on
far smaller images, and it bounds a session's memory."""
_FALLBACK_FRAME_RATE = 4.0
"""Frames kept per second when the model samples a fixed number over the clip instead."""


@dataclass(frozen=True)
class UploadLimits(MediaLimits):
    """The media length policy (``max_seconds``, ``trim``: longest audio or video, and
    whether a longer one is refused or cut) and what only uploads have."""

    max_bytes: int = 16 * 1024 * 1024
    """Largest file per field."""
    max_text_chars: int = 2000
    max_image_side: int = 4096
    """Largest side of a portrait."""


class UploadError(ValueError):
    """A request the server refuses: ``field`` is the form field (or ``None``),
    ``status`` the HTTP status that says why (400 malformed, 404 unknown, 413 too large,
    415 not the kind of media asked for, 422 not decodable as the media it claims)."""

    def __init__(self, field: Optional[str], reason: str, status: int = 400):
        self.field, self.reason, self.status = field, reason, status
        super().__init__(f"{field}: {reason}" if field else reason)


@dataclass
class AudioUpload:
    samples: np.ndarray
    """``(T,)`` float32 mono at :attr:`sample_rate`."""
    sample_rate: int

    @property
    def seconds(self) -> float:
        return self.samples.shape[0] / self.sample_rate


@dataclass
class VideoUpload:
    frames: np.ndarray
    """``(F, H, W, 3)`` uint8 RGB: the frames the model samples, taken at its frame rate."""
    seconds: float


def check_size(field: str, size: int, limits: UploadLimits) -> None:
    if size > limits.max_bytes:
        raise UploadError(field, f"{size / 2**20:.1f} MiB is over the {limits.max_bytes / 2**20:.0f} MiB limit", 413)
    if size == 0:
        raise UploadError(field, "the file is empty")


def check_text(text: str, limits: UploadLimits) -> str:
    if len(text) > limits.max_text_chars:
        raise UploadError("text", f"{len(text)} characters, over the {limits.max_text_chars}-character limit", 413)
    return text.strip()


def _open(field: str, source: BinaryIO, kind: str):
    source.seek(0)
    try:
        return av.open(source, mode="r")
    except Exception:  # PyAV raises a family of FFmpeg errors for undecodable input
        raise UploadError(field, f"cannot be decoded as {kind} (not a media file FFmpeg reads)", 422) from None


def decode_audio(field: str, source: BinaryIO, sample_rate: int, limits: UploadLimits) -> AudioUpload:
    """The first audio stream of ``source`` as mono float32 at ``sample_rate``; any
    container FFmpeg reads (WAV, FLAC, MP3, Ogg, the WebM/Opus a browser records, a
    video's sound track)."""
    with _open(field, source, "audio") as container:
        if not container.streams.audio:
            raise UploadError(field, "has no audio stream", 415)
        _refuse_long_header(field, "audio", container, limits)
        stream = container.streams.audio[0]
        resampler = av.AudioResampler(format="flt", layout="mono", rate=sample_rate)
        limit = int(limits.max_seconds * sample_rate)
        pieces, total = [], 0
        try:
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    piece = out.to_ndarray().reshape(-1)
                    pieces.append(piece)
                    total += piece.shape[0]
                if total > limit and not _within(field, "audio", total / sample_rate, limits, complete=False):
                    break
            else:
                for out in resampler.resample(None):
                    pieces.append(out.to_ndarray().reshape(-1))
        except UploadError:
            raise
        except Exception as error:
            raise UploadError(field, f"audio stream is corrupt ({error})", 422) from None
    samples = np.concatenate(pieces).astype(np.float32)[:limit] if pieces else np.zeros(0, np.float32)
    try:
        prepare_waveform(samples, sample_rate, sample_rate)  # empty, too short, silent, non-finite
    except DataError as error:
        raise UploadError(field, error.reason, 422) from None
    return AudioUpload(samples, sample_rate)


def decode_video(field: str, source: BinaryIO, frame_rate: Optional[float], limits: UploadLimits) -> VideoUpload:
    """The first video stream of ``source``, keeping one frame per ``1 / frame_rate``
    seconds (each the picture at the middle of its interval, as the model samples files)
    with the longer side at most 640 pixels."""
    rate = frame_rate or _FALLBACK_FRAME_RATE
    with _open(field, source, "video") as container:
        name = container.format.name or ""
        if not container.streams.video or any(part in name for part in _STILL_IMAGE_FORMATS):
            raise UploadError(field, f"is not a video (it decodes as {name or 'something else'})", 415)
        _refuse_long_header(field, "video", container, limits)
        stream = container.streams.video[0]
        period = float(1 / stream.average_rate) if stream.average_rate else 0.04
        start, kept, count, last_time, last = None, [], 0, 0.0, None
        try:
            for frame in container.decode(stream):
                t = float(frame.pts * stream.time_base) if frame.pts is not None else count * period
                start = t if start is None else start
                t -= start
                if t > limits.max_seconds and not _within(field, "video", t, limits, complete=False):
                    break
                count, last_time, last = count + 1, t, frame
                if t + period > (len(kept) + 0.5) / rate:
                    kept.append(_small_rgb(frame))
        except UploadError:
            raise
        except Exception as error:
            raise UploadError(field, f"video stream is corrupt ({error})", 422) from None
    if count < 2:
        raise UploadError(field, f"has {count} frame(s): a still picture, not a video", 415)
    if not kept:
        kept.append(_small_rgb(last))
    return VideoUpload(np.stack(kept), last_time + period)


def _small_rgb(frame) -> np.ndarray:
    image = frame.to_ndarray(format="rgb24")
    side = max(image.shape[:2])
    if side > _VIDEO_SIDE:
        scale = _VIDEO_SIDE / side
        image = cv2.resize(image, (round(image.shape[1] * scale), round(image.shape[0] * scale)), interpolation=cv2.INTER_AREA)
    return image


def _refuse_long_header(field: str, kind: str, container, limits: UploadLimits) -> None:
    # A header that states the length refuses a long file before any decoding (a second
    # of slack for the padding some encoders count); trimming, decoding stops at the limit.
    if not limits.trim and container.duration is not None and container.duration / 1_000_000 > limits.max_seconds + 1:
        _within(field, kind, container.duration / 1_000_000, limits)


def _within(field: str, kind: str, seconds: float, limits: UploadLimits, complete: bool = True) -> bool:
    """:func:`~empatheia.media.within_limits`, its refusal an :class:`UploadError` (413)."""
    try:
        return within_limits(seconds, limits, kind, complete=complete)
    except DataError as error:
        raise UploadError(field, error.reason, 413) from None


def decode_image(field: str, data: bytes, limits: UploadLimits) -> np.ndarray:
    """A PNG, JPEG or other still image OpenCV reads, as ``(H, W, 3)`` uint8 RGB."""
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if image is None:
        raise UploadError(field, "cannot be decoded as an image (PNG, JPEG, WebP...)", 422)
    if max(image.shape[:2]) > limits.max_image_side:
        raise UploadError(field, f"{image.shape[1]}x{image.shape[0]} pixels, over {limits.max_image_side} on a side", 413)
    return np.ascontiguousarray(image[..., ::-1])
