"""Bad media files: every problem is a DataError naming the file and 'audio' or 'video'.

Small files are written in tmp_path with soundfile and PyAV (which ships its own FFmpeg);
real clips come from ``../shared/data/media``.
"""

from __future__ import annotations

import re
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile
import torch

from empatheia import Dialogue, Turn
from empatheia.data import DataError, NoFaceError
from empatheia.media import MAX_CHANNELS, MIN_DURATION, MIN_SAMPLE_RATE, SILENCE_PEAK, load_audio, load_video_frames, prepare_waveform, sample_times
from empatheia.prompts import PromptMode

from .conftest import shared_data

MEAD_CLIP = "media/mead_faces/video/M030_front_happy_level3_001.mp4"


# ====================================================================== helpers
def tone(seconds: float, rate: int, channels: int = 1, amplitude: float = 0.3) -> np.ndarray:
    """``(T, channels)`` float32 sine, channel c at amplitude ``amplitude / (c + 1)``."""
    t = np.arange(int(round(seconds * rate))) / rate
    wave = amplitude * np.sin(2 * np.pi * 220 * t)
    return np.stack([wave / (c + 1) for c in range(channels)], 1).astype(np.float32)


def write_wav(path: Path, data: np.ndarray, rate: int = 16000, subtype: str = "FLOAT") -> Path:
    # FLOAT keeps tiny amplitudes that 16-bit PCM would round to zero
    soundfile.write(path, data, rate, subtype=subtype)
    return path


def write_video(path: Path, frames: int = 50, rate: int = 25, container: str = None, codec: str = "libx264", size=(64, 48)) -> Path:
    """A clip whose frame k is flat grey of brightness 5k: the picture tells its frame number."""
    if codec not in av.codecs_available:
        pytest.skip(f"PyAV has no {codec} encoder")
    width, height = size
    with av.open(str(path), "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        out.start_encoding()
        for k in range(frames):
            image = np.full((height, width, 3), 5 * k, dtype=np.uint8)
            out.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        out.mux(stream.encode())
    return path


def frame_numbers(frames: torch.Tensor) -> list:
    """The frame numbers painted by :func:`write_video` (codec noise is a grey level or two)."""
    return [round(float(frame.float().mean()) / 5) for frame in frames]


def write_audio_only_mp4(path: Path) -> Path:
    """An AAC track in an MP4 container: a valid media file without a video stream."""
    with av.open(str(path), "w", format="mp4") as out:
        stream = out.add_stream("aac", rate=16000)
        samples = (np.sin(np.arange(16000) * 0.1) * 8000).astype(np.int16)[None]
        frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.sample_rate = 16000
        out.mux(stream.encode(frame))
        out.mux(stream.encode())
    return path


def where(path, field: str) -> str:
    """The regex of the start of a DataError message naming a file and its field."""
    return "^" + re.escape(f"{path}, field '{field}': ")


def clip_duration(path: Path) -> float:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return float(stream.duration * stream.time_base)


@pytest.fixture
def face_model(model):
    model.config.video_encoder.face_crop = True
    return model


def no_face_video(path: Path) -> Path:
    """A real-looking clip with no face in it: a moving colour gradient."""
    if "libx264" not in av.codecs_available:
        pytest.skip("PyAV has no libx264 encoder")
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=25)
        stream.width, stream.height, stream.pix_fmt = 128, 96, "yuv420p"
        y, x = np.mgrid[0:96, 0:128]
        for k in range(25):
            image = np.stack([(x * 2 + k * 4) % 256, (y * 2) % 256, np.full_like(x, 120)], -1).astype(np.uint8)
            out.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        out.mux(stream.encode())
    return path


# ====================================================================== audio
def test_missing_audio_file(tmp_path):
    path = tmp_path / "nowhere.wav"
    with pytest.raises(DataError, match=where(path, "audio") + "audio file not found$"):
        load_audio(path, 16000)


def test_corrupt_audio(tmp_path):
    path = tmp_path / "noise.wav"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(DataError, match=where(path, "audio") + re.escape("cannot read audio (corrupt or not an audio file)")):
        load_audio(path, 16000)


def test_zero_length_audio(tmp_path):
    no_bytes = tmp_path / "nothing.wav"
    no_bytes.write_bytes(b"")
    with pytest.raises(DataError, match=where(no_bytes, "audio") + "cannot read audio"):
        load_audio(no_bytes, 16000)
    # a valid WAV header with no samples
    no_samples = write_wav(tmp_path / "empty.wav", np.zeros((0, 1), np.float32))
    with pytest.raises(DataError, match=where(no_samples, "audio") + re.escape("audio is empty (0 samples)")):
        load_audio(no_samples, 16000)


def test_too_short_audio(tmp_path):
    path = write_wav(tmp_path / "blip.wav", tone(0.010, 16000))
    message = f"audio is 0.010 s long, shorter than the {MIN_DURATION} s minimum"
    with pytest.raises(DataError, match=where(path, "audio") + re.escape(message)):
        load_audio(path, 16000)
    # just long enough is fine
    assert load_audio(write_wav(tmp_path / "ok.wav", tone(MIN_DURATION, 16000)), 16000).shape == (1600,)


@pytest.mark.parametrize(
    "amplitude", [0.0, 1e-5], ids=["all-zeros", "minus-100-dBFS"],
)
def test_silent_audio(tmp_path, amplitude):
    wave = amplitude * np.random.default_rng(0).uniform(-1, 1, (16000, 1)).astype(np.float32)
    path = write_wav(tmp_path / "silence.wav", wave)
    assert float(np.abs(soundfile.read(path)[0]).max()) == pytest.approx(float(np.abs(wave).max()), rel=1e-6)
    with pytest.raises(DataError, match=where(path, "audio") + r"audio is silent \(peak amplitude"):
        load_audio(path, 16000)


def test_quiet_but_not_silent_audio_is_accepted(tmp_path):
    amplitude = 10 * SILENCE_PEAK  # -60 dBFS
    wave = load_audio(write_wav(tmp_path / "quiet.wav", tone(0.5, 16000, amplitude=amplitude)), 16000)
    assert wave.shape == (8000,) and float(wave.abs().max()) == pytest.approx(amplitude, rel=1e-3)


def test_sample_rate_too_low(tmp_path):
    path = write_wav(tmp_path / "phone.wav", tone(1.0, 4000), rate=4000)
    message = f"sample rate 4000 Hz is below the {MIN_SAMPLE_RATE} Hz minimum"
    with pytest.raises(DataError, match=where(path, "audio") + re.escape(message)):
        load_audio(path, 16000)
    # the minimum itself is upsampled
    assert load_audio(write_wav(tmp_path / "narrow.wav", tone(0.5, MIN_SAMPLE_RATE), rate=MIN_SAMPLE_RATE), 16000).shape == (8000,)


def test_44k_stereo_becomes_16k_mono(tmp_path):
    # left channel at 0.3, right at 0.15, in phase: the mono mix peaks near 0.225
    path = write_wav(tmp_path / "cd.wav", tone(0.75, 44100, channels=2), rate=44100)
    wave = load_audio(path, 16000)
    assert wave.dtype == torch.float32 and wave.shape == (12000,)
    assert float(wave.abs().max()) == pytest.approx(0.225, abs=0.01)
    spectrum = torch.fft.rfft(wave).abs()
    assert abs(int(spectrum.argmax()) * 16000 / len(wave) - 220) <= 2


def test_too_many_channels(tmp_path):
    assert MAX_CHANNELS == 2
    path = write_wav(tmp_path / "surround.wav", tone(0.5, 16000, channels=6))
    with pytest.raises(DataError, match=where(path, "audio") + re.escape("has 6 channels; expected mono or stereo")):
        load_audio(path, 16000)
    stereo = write_wav(tmp_path / "stereo.wav", tone(0.5, 16000, channels=2))
    assert load_audio(stereo, 16000).shape == (8000,)


def test_stereo_that_cancels_to_silence(tmp_path):
    left = tone(0.5, 16000)
    path = write_wav(tmp_path / "inverted.wav", np.concatenate([left, -left], 1))
    with pytest.raises(DataError, match=where(path, "audio") + "audio is silent"):
        load_audio(path, 16000)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
def test_non_finite_samples(bad):
    wave = torch.from_numpy(tone(0.5, 16000)[:, 0].copy())
    wave[100] = bad
    with pytest.raises(DataError, match=where("take3.wav", "audio") + "audio contains NaN or infinite samples"):
        prepare_waveform(wave, 16000, 16000, source="take3.wav")
    # without a file the message still names the field
    with pytest.raises(DataError, match=r"^field 'audio': audio contains NaN or infinite samples"):
        prepare_waveform(wave.numpy(), 16000, 16000)


def test_waveform_in_time_by_channel_layout_is_rejected():
    # (T, C) instead of (C, T): read as thousands of channels, not silently mixed
    with pytest.raises(DataError, match=r"has 8000 channels; expected mono or stereo \(shape is \(channels, T\)\)"):
        prepare_waveform(tone(0.5, 16000, channels=2), 16000, 16000)


# ====================================================================== video
def test_missing_video_file(tmp_path):
    path = tmp_path / "nowhere.mp4"
    with pytest.raises(DataError, match=where(path, "video") + "video file not found$"):
        load_video_frames(path)


def test_corrupt_video(tmp_path):
    path = tmp_path / "noise.mp4"
    path.write_bytes(np.random.default_rng(1).integers(0, 256, 8192, dtype=np.uint8).tobytes())
    with pytest.raises(DataError, match=where(path, "video") + re.escape("cannot decode video (corrupt or not a video file)")):
        load_video_frames(path)


def test_audio_only_file_has_no_video_stream(tmp_path):
    path = write_audio_only_mp4(tmp_path / "voice.mp4")
    with av.open(str(path)) as container:  # it is a valid file, just without video
        assert container.streams.audio and not container.streams.video
    with pytest.raises(DataError, match=where(path, "video") + "has no video stream$"):
        load_video_frames(path)


def test_video_stream_without_frames(tmp_path):
    # MP4 drops an empty track, AVI keeps it: a video stream with zero frames
    path = write_video(tmp_path / "empty.mp4", frames=0, container="avi", codec="mpeg4")
    with av.open(str(path)) as container:
        assert len(container.streams.video) == 1
    with pytest.raises(DataError, match=where(path, "video") + "video has no frames$"):
        load_video_frames(path)


def test_video_without_a_face_through_the_processor(face_model, tmp_path):
    path = no_face_video(tmp_path / "wall.mp4")
    with pytest.raises(NoFaceError, match=where(path, "video") + "no face found") as caught:
        face_model.processor.load_video(path)
    assert isinstance(caught.value, DataError)
    # a real talking head goes through: num_frames face crops at the encoder's size
    frames = face_model.processor.load_video(shared_data(MEAD_CLIP))
    cfg = face_model.config.video_encoder
    assert frames.shape == (cfg.num_frames, 3, cfg.image_size, cfg.image_size) == (4, 3, 32, 32)


@pytest.mark.parametrize("clip", [MEAD_CLIP, "media/mead_faces/video/W009_front_surprised_level3_001.mp4"])
def test_frame_rate_sampling_on_real_clips(clip):
    path = shared_data(clip)
    duration = clip_duration(path)
    assert 3.0 <= duration <= 5.0
    assert len(load_video_frames(path, max_frames=8, frame_rate=2)) == min(8, int(duration * 2))
    assert len(load_video_frames(path, max_frames=20, frame_rate=2)) == int(duration * 2)  # not capped
    assert len(load_video_frames(path, max_frames=5, frame_rate=None)) == 5
    assert load_video_frames(path, max_frames=3, frame_rate=None).shape == (3, 256, 256, 3)


@pytest.mark.parametrize(
    "container, suffix", [("mp4", ".mp4"), ("h264", ".h264")], ids=["mp4", "raw-h264-no-duration"]
)
@pytest.mark.parametrize(
    "frame_rate, max_frames, expected",
    [
        (2, 8, [6, 18, 31, 43]),  # (i + 0.5) / 2 s: 0.25, 0.75, 1.25, 1.75
        (1, 8, [12, 37]),  # 0.5, 1.5 s
        (None, 6, [4, 12, 20, 29, 37, 45]),  # 6 spread over 2 s: (i + 0.5) / 3 s
        (25, 50, list(range(50))),  # every frame, once
    ],
)
def test_frames_are_taken_at_the_expected_times(tmp_path, container, suffix, frame_rate, max_frames, expected):
    path = write_video(tmp_path / f"counter{suffix}", frames=50, rate=25, container=container)
    times = sample_times(2.0, frame_rate, max_frames)
    if frame_rate is not None:
        assert times == pytest.approx([(i + 0.5) / frame_rate for i in range(len(expected))])
    assert [int(t * 25) for t in times] == expected  # the frame on screen at each time
    frames = load_video_frames(path, max_frames=max_frames, frame_rate=frame_rate)
    assert frame_numbers(frames) == expected


# ====================================================================== through the processor
def test_processor_names_the_dialogue_and_turn_of_a_corrupt_audio_file(model, tmp_path):
    path = tmp_path / "turn0.wav"
    path.write_bytes(b"RIFF" + bytes(range(256)) * 8)
    dialogue = Dialogue(
        [Turn("speaker", "I lost my wallet.", audio=path), Turn("listener", "Oh no, where?")], id="wallet-7"
    )
    message = re.escape(f"{path}, record wallet-7, field 'turns[0].audio': cannot read audio")
    with pytest.raises(DataError, match="^" + message) as caught:
        model.processor.encode(dialogue, PromptMode.FULL)
    assert (caught.value.file, caught.value.record, caught.value.field) == (str(path), "wallet-7", "turns[0].audio")
    # text-only layouts do not read media at all
    assert model.processor.encode(dialogue, PromptMode.TEXT).audio == []


def test_processor_names_the_turn_of_a_video_without_a_face(face_model, tmp_path):
    path = no_face_video(tmp_path / "wall.mp4")
    speech = write_wav(tmp_path / "ok.wav", tone(0.5, 16000))
    dialogue = Dialogue(
        [
            Turn("speaker", "Look at this.", audio=speech),
            Turn("listener", "What is it?"),
            Turn("speaker", "My new wallpaper.", video=path),
        ],
        id="wall-1",
    )
    message = re.escape(f"{path}, record wall-1, field 'turns[2].video': no face found")
    with pytest.raises(DataError, match="^" + message):
        face_model.processor.encode(dialogue, PromptMode.FULL)
