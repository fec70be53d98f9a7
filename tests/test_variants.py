"""The field's other systems over the same parts: the pipeline baseline and E3RG
(docs/variants.md), and what they are built from (meta-response, style tables, vote,
memory)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from empatheia import Dialogue, Empatheia, Turn
from empatheia.cli import main
from empatheia.labels import EMOTION_LABELS
from empatheia.processing import Target
from empatheia.prompts import MetaResponse, PromptMode, meta_text, parse_meta
from empatheia.stages import get_stage
from empatheia.variants.build import build_pipeline, pipeline_styles
from empatheia.variants.e3rg import E3RGSystem
from empatheia.variants.memory import EmpathyMemory, user_key
from empatheia.variants.pipeline import PipelineSystem
from empatheia.variants.styles import StyleTable
from empatheia.variants.vote import emotion_vote

from .conftest import make_dialogue, shared_data


# ---------------------------------------------------------------- meta-response
def test_meta_response_round_trips_and_tolerates_free_text():
    text = meta_text("anxious", {"gender": "female", "age": "young"}) + "It will get easier."
    assert text == "Emotion: anxious\nProfile: age=young, gender=female\nResponse: It will get easier."
    assert parse_meta(text) == MetaResponse("anxious", {"age": "young", "gender": "female"}, "It will get easier.")
    assert parse_meta("Emotion: Sad.\nResponse: Oh no.").emotion == "sad"
    unparsed = parse_meta("just some words")
    assert not unparsed.parsed and unparsed.response == "just some words" and unparsed.emotion is None


def test_pipeline_prompt_has_no_chain_and_its_target_writes_emotion_and_profile(model):
    dialogue = make_dialogue()
    dialogue.emotion = "anxious"
    encoded = model.processor.encode(dialogue, PromptMode.PIPELINE, Target.for_mode(dialogue, PromptMode.PIPELINE))
    text = model.tokenizer.decode(encoded.input_ids)
    assert "Reason through the steps" not in text and "the event scenario" not in text.lower()
    assert "<AUD" not in text and not encoded.audio and not encoded.video  # text only, no signal tokens
    target = model.tokenizer.decode(encoded.input_ids[encoded.labels != -100])
    assert target.startswith("Emotion: anxious\nProfile: age=young, gender=female, timbre=mid\nResponse: New places")
    assert model.tokenizer.decode(encoded.input_ids[encoded.emotion_slot]).strip() == ":"


def test_pipeline_stage_trains_the_lora_alone_on_the_meta_response(model):
    stage = get_stage("pipeline_text")
    assert stage.trains == ("lora",) and stage.layout is PromptMode.PIPELINE and not stage.reads_media
    model.set_stage("pipeline_text")
    trainable = {key for key, params in model.parameter_groups().items() if any(p.requires_grad for _, p in params)}
    assert trainable == {"lora"}
    dialogue = make_dialogue()
    batch = model.processor([dialogue], stage)
    out = model(batch)
    assert set(out) >= {"loss", "loss_emp"} and torch.isfinite(out["loss"])
    out["loss"].backward()
    grads = [p.grad for _, p in model.parameter_groups()["lora"] if p.grad is not None]
    assert grads and any(float(g.abs().sum()) > 0 for g in grads)


# ---------------------------------------------------------------- style tables
def test_style_table_round_trips_and_refuses_other_widths(tmp_path):
    table = StyleTable({"sad": torch.arange(3.0)}, {"sad": torch.ones(2)}, {"sad": {"speech": "x", "video": "y"}}, "g")
    loaded = StyleTable.load(table.save(tmp_path / "t.json"))
    assert torch.equal(loaded.speech["sad"], table.speech["sad"]) and loaded.sources == table.sources
    with pytest.raises(ValueError, match="widths"):
        loaded.check_widths(4, 2)
    with pytest.raises(KeyError, match="no style for emotion 'happy'"):
        loaded.styles("happy")


def test_shipped_tiny_table_belongs_to_the_tiny_generators_and_separates_the_emotions(model):
    table = pipeline_styles(model)  # measured on these generators, so no measuring here
    assert table.classes == list(EMOTION_LABELS)
    faces = torch.stack([table.video[c] for c in EMOTION_LABELS])
    # The avatar renderer's style opens with the emotion mix: each row's own emotion leads.
    assert faces[:, : len(EMOTION_LABELS)].argmax(1).tolist() == list(range(len(EMOTION_LABELS)))


# ---------------------------------------------------------------- recording generators
class Recording:
    """Wraps a generator and records what each call received."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def synthesize(self, text, content, style, avatar):
        self.calls.append({"text": text, "content": content, "style": style.clone(), "voice": avatar.voice, "avatar": avatar})
        return self.inner.synthesize(text, content, style, avatar)

    def animate(self, speech, content, style, portrait):
        self.calls.append({"content": content, "style": style.clone(), "portrait": portrait})
        return self.inner.animate(speech, content, style, portrait)


def _recording(system):
    speech, head = system.generators()
    speech, head = Recording(speech), Recording(head)
    system.set_generators(speech, head)
    return speech, head


@pytest.fixture(scope="module")
def tiny_pipeline() -> PipelineSystem:
    return build_pipeline("tiny")


@pytest.mark.parametrize("media", [True, False])
def test_pipeline_answers_a_three_turn_dialogue_with_speech_and_video(tiny_pipeline, media):
    dialogue = make_dialogue(3, audio=media, video=media)
    response = tiny_pipeline.respond(dialogue, max_new_tokens=12, animate=True)
    assert response.emotion.label in EMOTION_LABELS and response.audio.duration > 0
    assert response.video.frames.shape[0] > 0 and response.video.frames.shape[-1] == 3
    assert response.speech_content.shape[0] == 0 and response.video_content.shape[0] == 0


def test_pipeline_generators_receive_no_model_features(tiny_pipeline):
    speech, head = _recording(tiny_pipeline)
    responses = tiny_pipeline.respond([make_dialogue(3), make_dialogue(3, seed=1)], max_new_tokens=12, animate=True)
    assert len(speech.calls) == 2 and len(head.calls) == 2
    for response, said, shown in zip(responses, speech.calls, head.calls):
        # The text alone drives the voice, the speech alone the face; the styles are the
        # table's row of the emotion it wrote, nothing the model computed.
        assert said["content"] is None and shown["content"] is None and said["text"] == response.text
        speech_style, video_style = tiny_pipeline.styles.styles(response.emotion.label)
        assert torch.equal(said["style"], speech_style) and torch.equal(shown["style"], video_style)


def test_pipeline_style_follows_the_written_emotion(tiny_pipeline, monkeypatch):
    from empatheia.modeling import GeneratedText

    def written(items, *args, **kwargs):
        texts = ["Emotion: furious\nResponse: That is not fair.", "Emotion: terrified\nResponse: You are safe now."]
        prompts = [SimpleNamespace(first_turn=0) for _ in items]  # every turn read
        return GeneratedText(prompts, (None, None), torch.zeros(2, 1, dtype=torch.long), texts[: len(items)], [])

    monkeypatch.setattr(tiny_pipeline.model, "generate_text", written)
    angry, afraid = tiny_pipeline.respond([make_dialogue(3), make_dialogue(3, seed=1)])
    assert (angry.emotion.label, afraid.emotion.label) == ("angry", "fear")
    assert angry.chain.speaker_emotion == "furious" and angry.text == "That is not fair."
    assert torch.equal(angry.speech_style, tiny_pipeline.styles.speech["angry"])
    assert torch.equal(afraid.video_style, tiny_pipeline.styles.video["fear"])


# ---------------------------------------------------------------- the vote
def test_vote_is_the_weighted_mean_of_the_readers_that_read():
    sad, happy = {"sad": 1.0}, {"happy": 1.0}
    result = emotion_vote({"chain": sad, "text": happy, "face": None}, {"chain": 1.0, "text": 3.0, "face": 5.0})
    assert result.label == "happy" and result.weights == {"chain": 1.0, "text": 3.0}
    assert result.probabilities["happy"] == pytest.approx(0.75) and result.probabilities["sad"] == pytest.approx(0.25)
    # Soft: a split face does not outvote a sure text of equal weight.
    split = emotion_vote({"text": {"fear": 1.0}, "face": {"surprised": 0.5, "fear": 0.1, "happy": 0.4}},
                         {"text": 1.0, "face": 1.0})
    assert split.label == "fear" and split.probabilities["fear"] == pytest.approx(0.55)
    # A tie goes to the class listed first.
    assert emotion_vote({"a": {"angry": 1.0}, "b": {"sad": 1.0}}, {"a": 1.0, "b": 1.0}).label == "sad"


def test_vote_refuses_what_it_cannot_count():
    with pytest.raises(ValueError, match="no reader voted"):
        emotion_vote({"face": None, "text": {"sad": 1.0}}, {"text": 0.0})
    with pytest.raises(ValueError, match="negative"):
        emotion_vote({"text": {"sad": 1.0}}, {"text": -1.0})
    with pytest.raises(ValueError, match="outside"):
        emotion_vote({"text": {"neutral": 1.0}})


# ---------------------------------------------------------------- memory
def test_memory_recalls_the_users_earlier_turns_across_sessions(tmp_path):
    first = Dialogue([Turn("speaker", "My dog Biscuit has been sick all week."), Turn("listener", "Oh no."),
                      Turn("speaker", "The vet bills are piling up too.")], id="conv-1/3", speaker_profile={"ID": "u/../x"})
    EmpathyMemory(tmp_path).remember(first)
    later = Dialogue([Turn("speaker", "Biscuit is still sick and I am worried about my dog.")], id="conv-9/1",
                     speaker_profile={"ID": "u/../x"})
    memory = EmpathyMemory(tmp_path)  # a new session
    assert memory.recall(later, k=1) == ["My dog Biscuit has been sick all week."]
    extended = memory.with_recalled(later, k=1)
    assert [t.text for t in extended.turns][0] == "My dog Biscuit has been sick all week." and len(extended.turns) == 2
    # What the dialogue already holds is not recalled again; a user id never becomes a path.
    assert memory.recall(first) == []
    assert [p.parent.name for p in tmp_path.rglob("*.jsonl")] == ["users"]
    assert user_key(Dialogue([Turn("speaker", "hi")], id="c/2")) == "conversation:c"


# ---------------------------------------------------------------- E3RG
class FixedReader:
    def __init__(self, name, reading):
        self.name, self.reading, self.seen = name, reading, []

    def read(self, dialogue):
        self.seen.append(dialogue.id)
        return self.reading


def _e3rg(model, readers, memory=None, weights=None):
    bank = pipeline_styles(model)
    return E3RGSystem(model, bank, readers, EmpathyMemory(memory), weights=weights)


@pytest.mark.parametrize("media", [True, False])
def test_e3rg_answers_a_three_turn_dialogue_with_speech_and_video(model, media):
    system = _e3rg(model, [FixedReader("face", {"fear": 1.0}), FixedReader("prosody", None)])
    response = system.respond(make_dialogue(3, audio=media, video=media), max_new_tokens=12, animate=True)
    assert response.audio.duration > 0 and response.video.frames.shape[0] > 0
    assert set(system.last_votes[0].readings) == {"chain", "face", "prosody"}


def test_e3rg_styles_follow_the_vote(model):
    speech, head = None, None
    system = _e3rg(model, [FixedReader("face", {"angry": 1.0}), FixedReader("text", {"angry": 1.0})],
                   weights={"chain": 0.1, "face": 1.0, "text": 1.0})
    speech, head = _recording(system)
    response = system.respond(make_dialogue(3), max_new_tokens=8, animate=True)
    assert response.emotion.label == "angry"
    assert torch.equal(speech.calls[0]["style"], system.bank.speech["angry"]) and speech.calls[0]["content"] is None
    assert torch.equal(head.calls[0]["style"], system.bank.video["angry"]) and head.calls[0]["content"] is None


def test_e3rg_avatar_keeps_its_own_voice_and_never_the_users(model, tmp_path):
    clip = shared_data("media/speech/sad.wav")
    dialogue = Dialogue([Turn("speaker", "I lost my job today.", audio=clip), Turn("listener", "I'm so sorry."),
                         Turn("speaker", "I don't know what to do.", audio=clip)], id="c-7/3",
                        listener_profile={"ID": "nurse", "gender": "female", "age": "young"})
    system = _e3rg(model, [FixedReader("prosody", {"sad": 1.0})], memory=tmp_path)
    speech, _ = _recording(system)
    first = system.respond(dialogue, max_new_tokens=8, speak=True)
    again = _e3rg(model, [FixedReader("text", {"sad": 1.0})], memory=tmp_path)  # a later session, same memory
    speech_again, _ = _recording(again)
    second = again.respond(dialogue, max_new_tokens=8, speak=True)
    voices = [call["voice"] for call in speech.calls + speech_again.calls]
    assert str(clip) not in voices and all(Path(v).resolve() != clip.resolve() for v in voices if Path(v).exists())
    assert first.avatar == second.avatar and voices[0] == voices[1]
    assert (speech.calls[0]["avatar"].portrait == speech_again.calls[0]["avatar"].portrait).all()


# ---------------------------------------------------------------- command line
def test_respond_command_runs_each_system(tmp_path, capsys):
    conversation = shared_data("avamerg/challenge_test_excerpt.json")
    for system in ("pipeline", "e3rg"):
        out = tmp_path / system
        code = main(["respond", str(conversation), "--preset", "tiny", "--system", system, "--max-new-tokens", "8",
                     "--memory", str(tmp_path / "memory"), "--out", str(out)])
        assert code == 0
        record = json.loads((out / "response.json").read_text())
        assert record["emotion"]["label"] in EMOTION_LABELS
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["emotion"] in EMOTION_LABELS


@pytest.mark.parametrize("system_name", ["pipeline", "e3rg"])
def test_serve_answers_a_turn_with_each_system(system_name, tiny_pipeline, tmp_path):
    from .conftest import wav_bytes
    from .serve_helpers import Server, mp4_bytes

    system = tiny_pipeline if system_name == "pipeline" else _e3rg(
        Empatheia.from_preset("tiny"), [FixedReader("text", {"happy": 1.0})], memory=tmp_path / "memory",
        weights={"chain": 0.0, "text": 1.0})
    server = Server(system, root=tmp_path / "sessions", max_new_tokens=6)
    try:
        reply = server.post("/api/turns", {"text": "I got the job!"},
                            files={"audio": ("voice.wav", wav_bytes(1.0)), "video": ("face.mp4", mp4_bytes(tmp_path))})
        assert reply.status == 200, reply.body
        turn = reply.json()
        assert turn["stage"] == "done" and turn["emotion"]["label"] in EMOTION_LABELS
        assert server.get(turn["audio_url"]).status == 200 and server.get(turn["video_url"]).body[4:8] == b"ftyp"
        if system_name == "e3rg":
            assert turn["emotion"]["label"] == "happy"  # the vote, not the Style Disentangler
    finally:
        server.stop()


def test_bank_takes_real_clips_where_they_read_as_their_class(model):
    from empatheia.variants.styles import measure_clip_styles

    speech, head = model.generators()
    faces = shared_data("media/mead_faces/video")
    fallback = pipeline_styles(model)
    bank = measure_clip_styles(
        speech, head,
        {"sad": [shared_data("media/speech/sad.wav")]},
        {"happy": sorted(faces.glob("*_happy_*.mp4")), "contempt": sorted(faces.glob("*_contempt_*.mp4"))},
        fallback,
    )
    assert bank.sources["sad"]["speech"] == "real clips (relative to their mean): sad.wav"
    assert bank.sources["happy"]["video"].startswith("real clips (read by FER)")
    assert not torch.equal(bank.video["happy"], fallback.video["happy"])
    # FER reads these contempt clips as another emotion: the generators' row stands in.
    assert bank.sources["contempt"]["video"].startswith("FER reads its clips as")
    assert torch.equal(bank.video["contempt"], fallback.video["contempt"])
    assert torch.equal(bank.speech["fear"], fallback.speech["fear"]) and "no real clip" in bank.sources["fear"]["speech"]


def test_chat_with_e3rg_recalls_the_users_turns_of_an_earlier_session(model, tmp_path, monkeypatch):
    import io

    from empatheia.serve.chat import Chat

    prompts = []
    respond = model.respond

    def spy(dialogues, *args, **kwargs):
        prompts.append([t.text for t in dialogues[0].turns])
        return respond(dialogues, *args, **kwargs)

    monkeypatch.setattr(model, "respond", spy)
    for folder, line in (("one", "My cat Miso ran away last night."), ("two", "I still cannot find Miso, my cat.")):
        system = _e3rg(model, [FixedReader("text", {"sad": 1.0})], memory=tmp_path / "memory")
        chat = Chat(system, tmp_path / folder, max_new_tokens=4, write=lambda text: None, user="ana")
        assert chat.run(io.StringIO(f"{line}\n/quit\n")) == 0
    # The second session's prompt opens with what the user said in the first.
    assert prompts[0] == ["My cat Miso ran away last night."]
    assert prompts[1] == ["My cat Miso ran away last night.", "I still cannot find Miso, my cat."]


def test_train_pipeline_then_export_and_load_its_core(tmp_path, capsys):
    """`empatheia train --system pipeline` trains the meta-response; `variants
    export-pipeline` writes what a preset ships; loaded into a fresh model it answers as
    the trained one."""
    from empatheia.variants.pipeline import load_pipeline_core

    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"conv_id": "c1", "emotion": "proud", "situation": "I won.",
                                "utterances": ["I won the race today!", "Congratulations, you must be proud!"]}) + "\n")
    code = main(["train", "--system", "pipeline", "--set", "model.preset=tiny", f"data.train={data}",
                 f"output_dir={tmp_path / 'run'}", "max_steps=2", "deepspeed=null", "optim.batch_size=1",
                 "optim.gradient_accumulation_steps=1", "save_steps=2", "data.num_workers=0", "model.dtype=null",
                 "optim.learning_rate=0.05", "tensorboard=false", "progress=false"])
    assert code == 0
    assert main(["variants", "export-pipeline", str(tmp_path / "run"), "--out", str(tmp_path / "core.safetensors")]) == 0
    trained = Empatheia.from_pretrained(tmp_path / "run" / "final")
    fresh = Empatheia.from_preset("tiny", trained=False)
    load_pipeline_core(fresh, tmp_path / "core.safetensors")
    table = pipeline_styles(fresh)
    dialogue = make_dialogue(1, audio=False, video=False)
    a = PipelineSystem(trained, table).respond(dialogue, max_new_tokens=8)
    b = PipelineSystem(fresh, table).respond(dialogue, max_new_tokens=8)
    assert a.generated_text == b.generated_text
    with pytest.raises(SystemExit, match="training-free"):
        main(["train", "--system", "e3rg"])


def test_each_systems_page_says_who_answered_and_how_it_reasoned(tiny_pipeline, model, tmp_path):
    from empatheia.page import response_page

    dialogue = make_dialogue(3, audio=False, video=False)
    pipeline_page = response_page(tiny_pipeline.respond(dialogue, max_new_tokens=8), dialogue)
    assert "<h1>Pipeline baseline response</h1>" in pipeline_page and "Chain of Empathy</h2>" not in pipeline_page
    assert "has no Chain of Empathy" in pipeline_page
    e3rg = _e3rg(model, [FixedReader("text", {"angry": 1.0})], weights={"chain": 0.0, "text": 1.0})
    response = e3rg.respond(dialogue, max_new_tokens=8)
    page = response_page(response, dialogue)
    assert "<h1>E3RG response</h1>" in page and "Chain of Empathy</h2>" in page
    assert response.to_dict()["system"] == "E3RG"
    assert "Style Disentangler" not in page
    response.chain.speaker_emotion, response.chain_emotion = "lonely", None  # sad, against the vote's angry
    assert "while the vote of its emotion readers, which styles the voice and face, reads angry" in response.style_agreement()
