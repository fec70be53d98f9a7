"""respond(speak=True, animate=True) end to end on the tiny preset with the offline
generators: audio and video in the response, response.wav and response.mp4 on disk, the
avatar memory keeping one voice and one face per listener, and the CLI flags."""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile
import torch

from empatheia import Dialogue, Empatheia, Turn
from empatheia.cli import main
from empatheia.generators import AvatarRegistry, avatar_key, build_generators, gold_feature_extractors, resample_rows

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "conversation.json"


@pytest.fixture(scope="module")
def tiny():
    return Empatheia.from_preset("tiny")


def _dialogue(text: str, listener_id: str = "7") -> Dialogue:
    return Dialogue(
        [Turn("speaker", text)],
        id=f"gen-{listener_id}",
        listener_profile={"age": "young", "gender": "female", "timbre": "high", "ID": listener_id},
    )


def test_respond_speaks_and_animates(tiny, tmp_path):
    response = tiny.respond(_dialogue("I finally finished my thesis today!"), max_new_tokens=6, animate=True)
    speech, head = tiny.generators()
    assert response.audio is not None and response.video is not None
    samples = response.audio.samples
    assert samples.ndim == 1 and samples.abs().max() > 0.01  # not silent
    # The Content Synchronizer wrote exactly the phonemes the voice reads.
    assert response.speech_content.shape == (speech.content_length(response.text), tiny.config.content_synchronizer.speech_content_dim)
    video = response.video
    assert video.fps == 25 and video.frames.dtype == torch.uint8 and video.frames.shape[-1] == 3
    assert video.frames.shape[0] == head.frame_count(response.audio)
    assert abs(video.duration - response.audio.duration) < 0.1
    assert response.avatar == "id-7"

    out = response.save(tmp_path / "answer")
    data = json.loads((out / "response.json").read_text())
    assert data["audio"]["file"] == "response.wav" and data["video"]["frames"] == video.frames.shape[0]
    # C^v per speech unit, and the alignment that spread it over the frames, saved.
    assert data["features"]["video_content"][0] == data["features"]["speech_content"][0]
    from safetensors.torch import load_file

    from empatheia.generators.base import alignment_from_runs

    runs = load_file(str(out / "features.safetensors"))["speech_alignment"]
    assert torch.equal(alignment_from_runs(runs.numpy(), response.audio.samples.shape[0]), response.audio.alignment)
    wave, rate = soundfile.read(out / "response.wav")
    assert rate == response.audio.sample_rate and abs(len(wave) / rate - response.audio.duration) < 1e-3
    with av.open(str(out / "response.mp4")) as container:
        kinds = {s.type: s.codec_context.name for s in container.streams}
        assert kinds == {"video": "h264", "audio": "aac"}
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    with av.open(str(out / "response.mp4")) as container:
        audio = np.concatenate([f.to_ndarray() for f in container.decode(audio=0)], axis=1)
    assert len(frames) == video.frames.shape[0]
    assert abs(len(frames) / 25 - audio.shape[1] / rate) < 0.1
    # H.264 is lossy, but the decoded frames are the rendered ones.
    assert np.abs(frames[len(frames) // 2].astype(int) - video.frames[len(frames) // 2].numpy().astype(int)).mean() < 8


def test_speak_alone_writes_no_video(tiny, tmp_path):
    response = tiny.respond(_dialogue("My cat is sick."), max_new_tokens=4, speak=True)
    assert response.audio is not None and response.video is None
    out = response.save(tmp_path / "answer")
    assert (out / "response.wav").is_file() and not (out / "response.mp4").exists()


def test_the_same_avatar_keeps_its_voice_and_portrait_across_turns(tiny):
    speech, _ = tiny.generators()
    first = tiny.respond(_dialogue("I got the job!"), max_new_tokens=4, speak=True)
    second = tiny.respond(_dialogue("But the commute is long."), max_new_tokens=4, speak=True)
    other = tiny.respond(_dialogue("I got the job!", listener_id="8"), max_new_tokens=4, speak=True)
    assert first.avatar == second.avatar == "id-7" and other.avatar == "id-8"
    registry = tiny.avatars()
    same = registry.get("id-7")
    assert same is registry.for_profile({"ID": "7"})
    # One voice: the same words in the same style come out identical for that avatar,
    # and differently for another avatar.
    style = torch.zeros(tiny.config.style_disentangler.speech_style_dim)
    a = speech.synthesize("See you tomorrow.", None, style, same)
    b = speech.synthesize("See you tomorrow.", None, style, registry.get("id-7"))
    c = speech.synthesize("See you tomorrow.", None, style, registry.get("id-8"))
    assert torch.equal(a.samples, b.samples)
    assert a.samples.shape != c.samples.shape or not torch.equal(a.samples, c.samples)
    assert not np.array_equal(registry.get("id-7").portrait, registry.get("id-8").portrait)


def test_registered_avatars_persist_and_are_used(tiny, tmp_path):
    portrait = np.zeros((256, 256, 3), np.uint8)
    portrait[:] = (30, 120, 200)
    registry = AvatarRegistry(tmp_path / "avatars")
    registry.register("id-42", portrait, voice="default", profile={"gender": "male"})
    again = AvatarRegistry(tmp_path / "avatars").get("id-42")
    assert again is not None and np.array_equal(again.portrait, portrait) and again.profile == {"gender": "male"}
    # Met without registration: drawn once, remembered on disk, the same next session.
    drawn = AvatarRegistry(tmp_path / "avatars").for_profile({"ID": "9", "age": "elderly", "gender": "male"})
    assert np.array_equal(AvatarRegistry(tmp_path / "avatars").get("id-9").portrait, drawn.portrait)
    assert avatar_key({"age": "young", "gender": "female"}) == "profile-young-female-any"

    tiny.config.generators.avatars = str(tmp_path / "avatars")
    tiny._avatar_registry = None
    try:
        response = tiny.respond(_dialogue("Hello again.", listener_id="42"), max_new_tokens=4, animate=True)
    finally:
        tiny.config.generators.avatars = None
        tiny._avatar_registry = None
    assert response.avatar == "id-42"
    # The registered portrait shows in the frames (its colour fills the background).
    corner = response.video.frames[0, :8, :8].float().mean((0, 1))
    assert torch.allclose(corner, torch.tensor([30.0, 120.0, 200.0]), atol=25)


def test_cli_speak_and_animate(tmp_path):
    out = tmp_path / "out"
    args = ["respond", str(EXAMPLE), "--preset", "tiny", "--max-new-tokens", "6", "--animate", "--out", str(out),
            "--avatars", str(tmp_path / "avatars")]
    assert main(args) == 0
    data = json.loads((out / "response.json").read_text())
    assert (out / "response.wav").is_file() and (out / "response.mp4").is_file()
    assert data["video"]["fps"] == 25 and data["audio"]["seconds"] > 0
    assert list((tmp_path / "avatars").glob("*/portrait.png"))


def test_gold_feature_extractors_wrap_the_generators(tiny, tmp_path):
    speech, head = tiny.generators()
    extractors = gold_feature_extractors(speech, head)
    assert [(e.name, e.input) for e in extractors] == [
        ("speech_content", "text"), ("speech_style", "audio"), ("video_content", "speech"), ("video_style", "video"),
        ("speech_units", "text")]
    response = tiny.respond(_dialogue("Thank you for listening."), max_new_tokens=4, animate=True)
    out = response.save(tmp_path / "answer")
    content = extractors[0](["Thank you for listening."])[0]
    assert content.shape == (speech.content_length("Thank you for listening."), speech.features.content_dim)
    assert extractors[1]([out / "response.wav"])[0].shape == (speech.features.style_dim,)
    # Gold C^v has one row per speech unit of the text the recording reads.
    units = speech.content_length(response.text)
    assert extractors[2]([(response.text, out / "response.wav")])[0].shape == (units, head.features.content_dim)
    assert extractors[3]([out / "response.mp4"])[0].shape == (head.features.style_dim,)
    assert extractors[4]([response.text])[0].shape == (units, 1)
    assert len({e.fingerprint() for e in extractors}) == 5


def test_generator_sizes_must_match_the_heads():
    from empatheia.config import EmpatheiaConfig

    config = EmpatheiaConfig.from_preset("tiny")
    config.generators.speech = "nonsense"
    with pytest.raises(ValueError, match="generators.speech: unknown generator 'nonsense'"):
        build_generators(config)
    # StyleTTS2 reads 1024-d content and 256-d style; the tiny heads write 24 and 12.
    config.generators.speech = "styletts2"
    config.generators.styletts2 = {"preset": "tiny"}
    with pytest.raises(ValueError, match=r"generators.speech: StyleTTS2 reads content 1024-d and style 256-d, "
                                         r"but the model's heads write 24-d and 12-d"):
        build_generators(config)


def test_a_paper_model_without_dreamtalk_checkpoints_answers_and_speaks(tmp_path):
    """The paper's generators with StyleTTS2 (random weights here) and no DreamTalk
    checkpoints: the text answer needs the voice's units and speech needs the voice, so
    both work; only animating asks for DreamTalk's checkpoints, and says so."""
    from empatheia.generators.dreamtalk.checkpoints import CheckpointError

    overrides = {
        "generators.speech": "styletts2", "generators.styletts2": {"preset": "tiny"},
        "generators.talking_head": "dreamtalk", "generators.dreamtalk": {},
        # The tiny heads at StyleTTS2's sizes: 1024-d content, 256-d style, its 178 units.
        "content_synchronizer.speech_content_dim": 1024, "style_disentangler.speech_style_dim": 256,
        "content_synchronizer.unit_vocab_size": 178,
    }
    model = Empatheia.from_preset("tiny", overrides)
    dialogue = _dialogue("My sister got the job she wanted.")
    text = model.respond(dialogue, max_new_tokens=4)
    assert text.speech_content.shape[-1] == 1024 and text.audio is None
    spoken = model.respond(dialogue, max_new_tokens=4, speak=True)
    assert spoken.audio is not None and spoken.audio.samples.numel() > 0
    with pytest.raises(CheckpointError, match="DreamTalk needs both official checkpoints"):
        model.respond(dialogue, max_new_tokens=4, speak=True, animate=True)


def test_resample_rows_keeps_ends():
    rows = torch.arange(10, dtype=torch.float32).view(5, 2)
    out = resample_rows(rows, 9)
    assert out.shape == (9, 2) and torch.equal(out[0], rows[0]) and torch.equal(out[-1], rows[-1])


def test_extract_features_with_the_generators_of_a_model(tmp_path):
    from .training_helpers import write_avatar_dataset

    train = write_avatar_dataset(tmp_path / "data")
    out = tmp_path / "gold"
    assert main(["data", "extract-features", str(train), "--out", str(out), "--generators-of", "tiny"]) == 0
    from empatheia.data import GoldFeatureStore

    store = GoldFeatureStore(out)
    config = Empatheia.from_preset("tiny").config
    features = store.get("avatar/0")
    assert features["speech_content"].shape[1] == config.content_synchronizer.speech_content_dim
    assert features["video_style"].shape == (config.style_disentangler.video_style_dim,)
    with pytest.raises(SystemExit, match="either --extractor"):
        main(["data", "extract-features", str(train), "--out", str(out)])


def test_the_response_page_shows_dialogue_chain_emotions_and_player(tiny, tmp_path):
    dialogue = _dialogue("My dog <Max> ran away & I can't find him.")
    response = tiny.respond(dialogue, max_new_tokens=4, animate=True)
    page = (response.save(tmp_path / "answer", dialogue) / "index.html").read_text()
    assert "My dog &lt;Max&gt; ran away &amp; I can&#x27;t find him." in page  # escaped, never raw
    assert '<video src="response.mp4"' in page and "Chain of Empathy" in page
    for label, p in response.emotion.probabilities.items():
        assert f"<td>{label}</td><td>{p:.1%}</td>" in page


def test_the_page_shows_the_chains_most_likely_emotions_first(tiny, tmp_path):
    from empatheia.response import LabelPrediction

    dialogue = _dialogue("My dog ran away.")
    response = tiny.respond(dialogue, max_new_tokens=4)
    weights = {f"label{i}": w for i, w in enumerate([0.02, 0.3, 0.01, 0.05, 0.2, 0.1, 0.04, 0.08, 0.06, 0.14])}
    response.chain_emotion = LabelPrediction("label1", weights)
    page = (response.save(tmp_path / "answer", dialogue) / "index.html").read_text()
    assert "the 8 most likely of 10 labels" in page
    shown = [label for label in weights if f"<td>{label}</td>" in page]
    assert sorted(shown) == sorted(sorted(weights, key=weights.get)[2:])  # the two least likely are left out
    assert page.index("<td>label1</td>") < page.index("<td>label4</td>") < page.index("<td>label9</td>")
    assert '<tr class=top><td>label1</td><td>30.0%</td>' in page
    assert "Style Disentangler" in page and f"<td>{response.emotion.label}</td>" in page


def test_response_and_page_say_what_the_voice_and_face_were_given(tiny, tmp_path):
    response = tiny.respond(_dialogue("My dog died this morning."), max_new_tokens=4, animate=True)
    speech, head = tiny.generators()
    # What the generators were handed, in their own terms: the same request they realise.
    assert response.voice_style == speech.describe_style(response.speech_style)
    assert response.face_style == head.describe_style(response.video_style)
    assert set(response.voice_style) >= {"rate_per_s", "pitch_hz", "energy_dbfs", "pause_ratio"}
    assert response.face_style["emotion"] in ("neutral", "sad", "happy", "angry", "fear", "surprised", "contempt", "disgusted")
    assert response.avatar_profile["gender"] == "female"
    out = response.save(tmp_path / "answer")
    data = json.loads((out / "response.json").read_text())
    assert data["voice_style"] == response.voice_style and data["face_style"] == response.face_style
    assert data["avatar_profile"]["gender"] == "female"
    page = (out / "index.html").read_text()
    assert "What the voice and face were given" in page and "pitch hz" in page


def test_a_style_that_disagrees_with_the_chain_says_so(tiny):
    from empatheia.prompts import ChainOfEmpathy
    from empatheia.response import LabelPrediction

    response = tiny.respond(_dialogue("My dog died this morning."), max_new_tokens=4)
    response.chain = ChainOfEmpathy(speaker_emotion="devastated")
    response.chain_emotion = None
    response.emotion = LabelPrediction("happy", {"happy": 0.6, "sad": 0.4})
    note = response.style_agreement()
    assert "devastated (sad)" in note and "reads happy" in note and "disagree" in note
    response.emotion = LabelPrediction("sad", {"happy": 0.4, "sad": 0.6})
    assert "agree" in response.style_agreement() and "disagree" not in response.style_agreement()
    response.chain = ChainOfEmpathy(speaker_emotion="blorp")
    assert response.style_agreement() is None  # no emotion of the fold: nothing to compare
