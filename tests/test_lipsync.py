"""Lips in sync by construction: the speech generator reports which content unit sounds
at each sample, C^v has one row per unit, and the talking head spreads the rows over the
frames by that alignment (silence closes the mouth)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("piper", reason="the Piper voice needs piper-tts")
pytest.importorskip("onnx", reason="Piper's alignment is read from its graph with onnx")

from empatheia.generators import prosody  # noqa: E402
from empatheia.generators.avatar_face import EMOTIONS, GEOMETRY_COLUMNS, default_portrait, face_geometry  # noqa: E402
from empatheia.generators.avatar_renderer import AvatarRenderer  # noqa: E402
from empatheia.generators.base import (  # noqa: E402
    Avatar,
    Waveform,
    _UnitVideoContent,
    alignment_from_runs,
    alignment_path,
    alignment_runs,
    expand_units,
    frame_units,
    gold_feature_extractors,
)
from empatheia.generators.piper_speech import PiperSpeech, encode_style  # noqa: E402

MOUTH_OPEN = GEOMETRY_COLUMNS.index("mouth_dark_area")
PORTRAIT = default_portrait({"gender": "female", "age": "young"}, 2)
TWO_SENTENCES = "I am so sorry to hear that. Please tell me what happened next."
ONE_SENTENCE = "I really think you should take some time for yourself and rest for a while"


@pytest.fixture(scope="module")
def speech() -> PiperSpeech:
    return PiperSpeech(content_dim=24, style_dim=12)


@pytest.fixture(scope="module")
def renderer() -> AvatarRenderer:
    return AvatarRenderer(content_dim=20, style_dim=10)


def paused_style(ratio: float = 0.4) -> torch.Tensor:
    """S^s asking for the reference prosody with ``ratio`` of the utterance in pauses."""
    return encode_style(prosody.Prosody(rate=11.0, pitch_hz=150.0, pitch_range=2.5, energy_db=-24.0, pause_ratio=ratio), 12)


def plain(key: str = "plain") -> Avatar:
    return Avatar(key, PORTRAIT, "en_US-joe-medium", {})


def runs_of(labels: np.ndarray):
    """``(R, 3)`` rows ``[label, start, end)``."""
    return alignment_runs(torch.from_numpy(labels)).tolist()


def assert_complete_alignment(wave: Waveform, units: int) -> np.ndarray:
    labels = wave.alignment.numpy()
    assert labels.shape == wave.samples.shape
    spoken = labels[labels >= 0]
    # Every unit 0..Ls-1 sounds, in the order of C^s's rows.
    assert np.array_equal(np.unique(spoken), np.arange(units))
    assert (np.diff(spoken) >= 0).all()
    return labels


@pytest.mark.parametrize("voice", ["plain", "auto"])
def test_piper_alignment_covers_every_unit_in_order(speech, voice):
    avatar = plain() if voice == "plain" else Avatar("a-1", PORTRAIT, "auto", {"gender": "female", "age": "child"})
    if voice == "auto":
        assert speech.voice_variant(avatar).formant != 1.0  # the timbre resampling runs
    wave = speech.synthesize(TWO_SENTENCES, None, paused_style(0.4), avatar)
    units = speech.content_length(TWO_SENTENCES)
    assert speech.content_units(TWO_SENTENCES).shape == (units,)
    labels = assert_complete_alignment(wave, units)
    # The sentence gap: silence labelled -1 between the sentences' units.
    first_sentence = len(speech._phoneme_ids(TWO_SENTENCES)[0])
    boundary = np.flatnonzero(labels == first_sentence)[0]
    before = labels[:boundary]
    assert (before[before >= 0] < first_sentence).all()
    gap = [r for r in runs_of(labels[:boundary]) if r[0] == -1 and r[1] > 0]
    assert gap and max(end - start for _, start, end in gap) >= 0.05 * wave.sample_rate
    # What -1 labels is silence: far quieter than the units.
    samples = wave.samples.numpy()
    silent_rms = np.sqrt(np.mean(samples[labels < 0] ** 2))
    spoken_rms = np.sqrt(np.mean(samples[labels >= 0] ** 2))
    assert silent_rms < 0.1 * spoken_rms, (silent_rms, spoken_rms)


def test_pauses_piper_opens_between_words_are_silence_labelled_minus_one(speech):
    wave = speech.synthesize(ONE_SENTENCE, None, paused_style(0.45), plain())
    labels = assert_complete_alignment(wave, speech.content_length(ONE_SENTENCE))
    spoken = np.flatnonzero(labels >= 0)
    inner = [r for r in runs_of(labels[spoken[0] : spoken[-1]]) if r[0] == -1]
    # The sentence has no punctuation: any long -1 run inside it is a pause the re-timing
    # inserted, and it is exact digital silence.
    long_runs = [(start, end) for _, start, end in inner if end - start >= 0.1 * wave.sample_rate]
    assert long_runs
    for start, end in long_runs:
        assert float(wave.samples[spoken[0] + start : spoken[0] + end].abs().max()) == 0.0


def test_pause_edit_moves_labels_with_the_samples():
    rate = 16000
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(rate) * 0.3, np.zeros(rate // 2), rng.standard_normal(rate) * 0.3])
    labels = np.concatenate([np.zeros(rate, int), np.full(rate // 2, -1), np.ones(rate, int)])
    for ratio in (0.05, 0.5):
        edit = prosody.pause_edit(x, rate, ratio)
        out, out_labels = edit.apply(x), edit.apply_to_labels(labels)
        assert np.array_equal(out, prosody.retime_pauses(x, rate, ratio))
        assert out_labels.shape == out.shape
        # Speech keeps its unit, inserted silence is -1 and silent.
        assert np.abs(out[out_labels == -1]).max() < 1e-6
        assert np.array_equal(np.unique(out_labels[out_labels >= 0]), [0, 1])
    resampled = prosody.resample_labels(labels, 1.2)
    assert resampled.shape == prosody.resample(x, 1.2).shape


def test_alignment_runs_round_trip():
    labels = torch.tensor([-1, -1, 0, 0, 0, 1, -1, 2, 2])
    runs = alignment_runs(labels)
    assert runs.tolist() == [[-1, 0, 2], [0, 2, 5], [1, 5, 6], [-1, 6, 7], [2, 7, 9]]
    assert torch.equal(alignment_from_runs(runs, 9), labels)


def test_gold_per_unit_content_keeps_the_mouth_in_sync(speech, renderer):
    """Per-unit C^v that is the gold content of the very speech, spread back by its
    alignment, gives a measured lip-sync offset within one frame."""
    from empatheia.evaluation.video import lip_sync

    texts = [
        "Oh no, that sounds awful.",
        "I am really glad you told me about this.",
        "That must have been so hard. Do you want to talk about what happened next?",
    ]
    for text in texts:
        wave = speech.synthesize(text, None, torch.zeros(12), plain())
        units = speech.content_length(text)
        gold = renderer.unit_content(wave, units)
        assert gold.shape == (units, 20)
        video = renderer.animate(wave, gold, torch.zeros(10), PORTRAIT)
        assert video.frames.shape[0] == renderer.frame_count(wave)
        synced = lip_sync(video, wave)
        driven = lip_sync(renderer.animate(wave, None, torch.zeros(10), PORTRAIT), wave)
        assert -1 <= synced.offset <= 1, (text, synced.offset)
        # As clear a peak as the renderer driven by the speech itself, within a margin.
        assert synced.confidence > 0.5 * driven.confidence, (synced.confidence, driven.confidence)


def test_silence_in_the_speech_closes_the_mouth(speech, renderer):
    wave = speech.synthesize(TWO_SENTENCES, None, paused_style(0.45), plain())
    units = speech.content_length(TWO_SENTENCES)
    # A C^v asking for a wide-open mouth on every unit.
    loud = torch.ones(units, 20)
    frames = renderer.animate(wave, loud, torch.zeros(10), PORTRAIT).frames.numpy()
    closed = renderer.animate(wave, torch.zeros(units, 20), torch.zeros(10), PORTRAIT).frames.numpy()
    labels = frame_units(wave.alignment, wave.sample_rate, frames.shape[0], renderer.fps).numpy()
    silent = labels < 0
    assert silent.sum() >= 5 and (~silent).sum() >= 5
    opening = face_geometry(frames)[:, MOUTH_OPEN]
    closed_opening = face_geometry(closed)[:, MOUTH_OPEN]
    np.testing.assert_allclose(opening[silent], closed_opening[silent], atol=1e-9)
    assert opening[~silent].mean() > closed_opening[~silent].mean() + 0.1


def face(emotion: str, intensity: float = 1.0) -> torch.Tensor:
    """The 10-d S^v of one emotion alone."""
    style = torch.zeros(10)
    style[EMOTIONS.index(emotion)], style[len(EMOTIONS)] = 1.0, intensity
    return style


@pytest.mark.parametrize("emotion", ["surprised", "fear"])
def test_the_mouth_keeps_sync_under_a_strong_expression(speech, renderer, emotion):
    """Under an expression that opens and stretches the mouth, the speech still drives
    the jaw: an answer animated from its per-unit C^v is in sync within one frame, as
    clearly as the mouth driven by the speech itself (a surprised jaw that rested open near
    its limit used to leave speech almost nothing to move)."""
    from empatheia.evaluation.video import lip_sync

    text = "That must have been so hard. Do you want to talk about what happened next?"
    wave = speech.synthesize(text, None, torch.zeros(12), plain())
    gold = renderer.unit_content(wave, speech.content_length(text))
    synced = lip_sync(renderer.animate(wave, gold, face(emotion), PORTRAIT), wave)
    driven = lip_sync(renderer.animate(wave, None, face(emotion), PORTRAIT), wave)
    assert -1 <= synced.offset <= 1 and -1 <= driven.offset <= 1, (synced.offset, driven.offset)
    assert synced.confidence > 0.8 * driven.confidence, (synced.confidence, driven.confidence)


def test_a_pause_closes_the_jaw_to_the_expressions_rest(speech, renderer):
    """In a pause the mouth goes back to the expression's own rest (surprise rests a
    little open), whatever C^v asks for; while speaking it opens past that rest."""
    wave = speech.synthesize(TWO_SENTENCES, None, paused_style(0.45), plain())
    units = speech.content_length(TWO_SENTENCES)
    loud = renderer.animate(wave, torch.ones(units, 20), face("surprised"), PORTRAIT).frames.numpy()
    rest = renderer.animate(wave, torch.zeros(units, 20), face("surprised"), PORTRAIT).frames.numpy()
    neutral = renderer.animate(Waveform(torch.zeros(640), 16000), None, torch.zeros(10), PORTRAIT).frames.numpy()
    silent = frame_units(wave.alignment, wave.sample_rate, loud.shape[0], renderer.fps).numpy() < 0
    assert silent.sum() >= 5 and (~silent).sum() >= 5
    opening, rest_opening, shut = (face_geometry(f)[:, MOUTH_OPEN] for f in (loud, rest, neutral))
    np.testing.assert_allclose(opening[silent], rest_opening[silent], atol=1e-9)
    assert rest_opening.mean() > shut[0] + 0.05
    assert opening[~silent].mean() > rest_opening[~silent].mean() + 0.1


def test_a_frame_shows_every_unit_that_sounds_in_it():
    """Per-unit C^v is spread over the frames by the samples each unit sounds in a frame,
    so a unit shorter than a frame still counts, and silence counts as zeros."""
    from empatheia.generators.avatar_renderer import spread_units

    rate, fps = 16000, 25.0  # 640 samples a frame
    alignment = np.concatenate([np.full(320, -1), np.zeros(160, int), np.ones(800, int), np.full(640, -1)])
    content = np.array([[1.0, 2.0], [0.5, 4.0]], dtype=np.float32)
    spread = spread_units(content, alignment, rate, 4, fps)
    assert spread.shape == (4, 2) and spread.dtype == np.float32
    np.testing.assert_allclose(spread[0], (160 * content[0] + 160 * content[1]) / 640)
    np.testing.assert_allclose(spread[1], content[1])
    np.testing.assert_allclose(spread[2:], 0.0)  # silence, then past the speech's end


def test_content_without_alignment_is_still_a_time_series(speech, renderer):
    wave = speech.synthesize("Hello there.", None, torch.zeros(12), plain())
    bare = Waveform(wave.samples, wave.sample_rate)
    per_frame = renderer.speech_content(bare)
    video = renderer.animate(bare, per_frame[::2], torch.zeros(10), PORTRAIT)
    assert video.frames.shape[0] == renderer.frame_count(bare)
    with pytest.raises(ValueError, match="one row per speech content unit"):
        expand_units(torch.zeros(3, 20), wave, renderer.frame_count(wave), 25.0, torch.zeros(20))


def test_gold_video_content_per_unit_from_sidecar_or_even_spread(speech, renderer, tmp_path):
    import soundfile

    text = "That must have been so hard."
    wave = speech.synthesize(text, None, torch.zeros(12), plain())
    clip = tmp_path / "utt0.wav"
    soundfile.write(str(clip), wave.samples.numpy(), wave.sample_rate)
    units = speech.content_length(text)
    extractor = next(e for e in gold_feature_extractors(speech, renderer) if e.name == "video_content")
    assert isinstance(extractor, _UnitVideoContent) and extractor.input == "speech"
    (fallback,) = extractor([(text, clip)])
    np.save(alignment_path(clip), alignment_runs(wave.alignment))
    (aligned,) = extractor([(text, clip)])
    assert fallback.shape == aligned.shape == (units, 20)
    # The sidecar's pooling is the in-memory one, up to the file's 16-bit rounding (which
    # moves the brightness of near-silent frames, so that column is compared on average).
    in_memory = renderer.unit_content(wave, units).numpy()
    np.testing.assert_allclose(aligned.numpy()[:, 0], in_memory[:, 0], atol=0.01)
    assert np.abs(aligned.numpy() - in_memory).mean() < 0.01
    (ids,) = next(e for e in gold_feature_extractors(speech, renderer) if e.name == "speech_units")([text])
    assert torch.equal(ids.reshape(-1), speech.content_units(text))


def test_tiny_model_answers_with_per_unit_video_content():
    from empatheia.modeling import Empatheia

    from .conftest import make_dialogue

    model = Empatheia.from_preset("tiny")
    response = model.respond(make_dialogue(1), max_new_tokens=12, animate=True)
    units = max(1, model.generators()[0].content_length(response.text))
    assert response.video_content.shape[0] == response.speech_content.shape[0] == units
    assert response.audio.alignment is not None and response.audio.alignment.shape == response.audio.samples.shape
    assert int(response.audio.alignment.max()) < units
    talking_head = model.generators()[1]
    assert response.video.frames.shape[0] == talking_head.frame_count(response.audio)


def test_a_text_reads_as_the_same_units_whatever_was_read_before():
    # espeak-ng carries clause state across calls: after a text ending in "..", the next
    # one used to read as other phonemes, so a rendered clip's alignment and the units
    # extracted later in another process disagreed.
    speech = PiperSpeech(content_dim=8, style_dim=6)
    text = "Have you ever felt really ashamed?"
    alone = speech.content_units(text)
    speech.content_units("The interviewer was really impressed..")
    assert torch.equal(speech.content_units(text), alone)


def test_per_unit_loudness_above_the_loud_frames_level_is_brought_down():
    """C^v loudness is relative to the utterance's loud frames (1 there): a request whose
    speaking frames sit above that as a whole is shifted down to the anchor, a quieter one
    is kept, and silence is left out of the percentile."""
    from empatheia.generators.avatar_renderer import UNIT_LOUDNESS_ANCHOR, anchor_loudness

    speaking = np.array([False] + [True] * 20 + [False])
    content = np.zeros((22, 5), dtype=np.float32)
    content[1:21, 0] = np.linspace(0.5, 1.3, 20)
    content[1:21, 1] = 0.3
    anchored = anchor_loudness(content, speaking)
    assert np.percentile(anchored[speaking, 0], 95) == pytest.approx(UNIT_LOUDNESS_ANCHOR)
    np.testing.assert_allclose(anchored[1:21, 0] - content[1:21, 0], anchored[1, 0] - content[1, 0], atol=1e-6)
    np.testing.assert_array_equal(anchored[:, 1:], content[:, 1:])
    quiet = content * 0.5
    np.testing.assert_array_equal(anchor_loudness(quiet, speaking), quiet)
    np.testing.assert_array_equal(anchor_loudness(content, np.zeros(22, dtype=bool)), content)
