"""respond(), save/load round trips, and the response files."""

from __future__ import annotations

import json

import pytest
import torch

from empatheia import Empatheia, EmpatheticResponse

from .conftest import full_batch, make_dialogue


def _check_response(model, response, dialogue):
    cs, sd = model.config.content_synchronizer, model.config.style_disentangler
    assert isinstance(response, EmpatheticResponse)
    assert response.dialogue_id == dialogue.id
    assert isinstance(response.text, str) and isinstance(response.generated_text, str)
    assert response.emotion.label in sd.emotion_labels
    assert set(response.emotion.probabilities) == set(sd.emotion_labels)
    assert sum(response.emotion.probabilities.values()) == pytest.approx(1.0, abs=1e-4)
    assert set(response.profile) == {"age", "gender", "timbre"}
    for name, prediction in response.profile.items():
        assert prediction.label in sd.profile_labels[name]
    assert response.speech_content.dim() == 2 and response.speech_content.shape[1] == cs.speech_content_dim
    assert response.video_content.dim() == 2 and response.video_content.shape[1] == cs.video_content_dim
    assert response.speech_style.shape == (sd.speech_style_dim,)
    assert response.video_style.shape == (sd.video_style_dim,)
    for tensor in (response.speech_content, response.video_content, response.speech_style, response.video_style):
        assert torch.isfinite(tensor).all()
    chain = response.chain
    for field in ("event_scenario", "speaker_emotion", "emotion_cause", "goal_to_response", "raw", "parsed"):
        assert hasattr(chain, field)
    assert chain.raw == response.generated_text


@pytest.mark.parametrize("turns", [1, 3])
@pytest.mark.parametrize("media", [False, True])
def test_respond_returns_every_field(model, turns, media):
    dialogue = make_dialogue(turns, audio=media, video=media, gold=False)
    response = model.respond(dialogue, max_new_tokens=12)
    _check_response(model, response, dialogue)


def test_respond_with_only_one_modality(model):
    dialogue = make_dialogue(2, audio=True, video=False)
    _check_response(model, model.respond(dialogue, max_new_tokens=6), dialogue)


def test_batched_respond_matches_one_at_a_time(model):
    dialogues = [make_dialogue(3, seed=1), make_dialogue(1, audio=False, video=False, seed=2), make_dialogue(2, seed=3)]
    batched = model.respond(dialogues, max_new_tokens=10)
    assert len(batched) == 3
    for dialogue, response in zip(dialogues, batched):
        _check_response(model, response, dialogue)
        alone = model.respond(dialogue, max_new_tokens=10)
        assert alone.generated_text == response.generated_text
        torch.testing.assert_close(alone.speech_style, response.speech_style, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(alone.video_content, response.video_content, rtol=1e-4, atol=1e-5)
        assert alone.emotion.label == response.emotion.label


def test_content_rows_are_the_speech_generators_units(model):
    # C^s and C^v both have one row per unit the voice will read (unit ids feed the
    # queries on this preset, so the generator decides the length).
    assert model.config.content_synchronizer.unit_vocab_size > 0
    response = model.respond(make_dialogue(1), max_new_tokens=5)
    units = max(1, model.generators()[0].content_length(response.text))
    assert response.speech_content.shape[0] == response.video_content.shape[0] == units
    with pytest.raises(ValueError, match="speech_lengths"):
        model.respond(make_dialogue(1), max_new_tokens=5, speech_lengths=[units + 3])


def test_respond_keeps_training_mode(model):
    model.train()
    model.respond(make_dialogue(1, audio=False, video=False), max_new_tokens=3)
    assert model.training
    assert not model.speech_encoder.training and not model.video_encoder.training


def test_response_save_writes_json_and_features(model, tmp_path):
    response = model.respond(make_dialogue(2), max_new_tokens=8)
    response.save(tmp_path / "out")
    data = json.loads((tmp_path / "out" / "response.json").read_text())
    assert data["text"] == response.text
    assert data["emotion"]["label"] == response.emotion.label
    assert set(data["chain_of_empathy"]) >= {"event_scenario", "speaker_emotion", "emotion_cause", "goal_to_response"}
    assert data["features"]["speech_style"] == [model.config.style_disentangler.speech_style_dim]
    from safetensors.torch import load_file

    features = load_file(str(tmp_path / "out" / "features.safetensors"))
    torch.testing.assert_close(features["video_style"], response.video_style)


def _perturb_trained_parts(model):
    """Give every trained tensor a value a fresh model would not have."""
    g = torch.Generator().manual_seed(123)
    with torch.no_grad():
        for group in ("lora", "signal_rows", "projectors", "content_synchronizer", "style_disentangler"):
            for _, param in model.parameter_groups()[group]:
                param.add_(torch.randn(param.shape, generator=g) * 0.05)


def test_save_load_round_trip_gives_identical_outputs(model, tmp_path):
    _perturb_trained_parts(model)
    model.eval()
    batch = full_batch(model)
    dialogue = make_dialogue(3, gold=False)
    with torch.no_grad():
        before = model(batch, stage=4)
    response_before = model.respond(dialogue, max_new_tokens=10)

    model.save_pretrained(tmp_path / "ckpt")
    saved = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert saved == ["adapter_config.json", "adapter_model.safetensors", "config.yaml", "empatheia.safetensors", "tokenizer"]
    # only trained parts are saved: far smaller than the whole model
    size = sum((tmp_path / "ckpt" / name).stat().st_size for name in ("adapter_model.safetensors", "empatheia.safetensors"))
    trained = sum(p.numel() for g in ("lora", "signal_rows", "projectors", "content_synchronizer",
                                       "style_disentangler") for _, p in model.parameter_groups()[g])
    assert size < 4 * trained + 100_000 < 4 * sum(p.numel() for p in model.parameters())

    loaded = Empatheia.from_pretrained(tmp_path / "ckpt").eval()
    with torch.no_grad():
        after = loaded(batch, stage=4)
    for key in before:
        torch.testing.assert_close(after[key], before[key], rtol=0, atol=0)
    response_after = loaded.respond(dialogue, max_new_tokens=10)
    assert response_after.generated_text == response_before.generated_text
    torch.testing.assert_close(response_after.speech_content, response_before.speech_content, rtol=0, atol=0)
    torch.testing.assert_close(response_after.video_style, response_before.video_style, rtol=0, atol=0)

    fresh = Empatheia.from_preset("tiny").eval()
    with torch.no_grad():
        assert not torch.equal(fresh(batch, stage=4)["loss"], before["loss"])


def test_loading_a_mismatched_checkpoint_names_the_problem(model, tmp_path):
    model.save_pretrained(tmp_path / "ckpt")
    with pytest.raises(FileNotFoundError, match="config.yaml"):
        Empatheia.from_pretrained(tmp_path)
    state = model.trained_state_dict()
    state["style_disentangler.extra.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match="unexpected.*extra.weight"):
        model.load_trained_state_dict(state)
    with pytest.raises(ValueError, match="style_disentangler.queries|missing"):
        model.load_trained_state_dict({k: v for k, v in model.trained_state_dict().items() if "queries" not in k})


def test_weights_are_rebuilt_from_the_seed_without_touching_global_rng():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    a = Empatheia.from_preset("tiny")
    assert torch.equal(torch.rand(3), expected)
    b = Empatheia.from_preset("tiny")
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(pa, pb), name


def test_chain_emotion_is_the_language_models_distribution_at_the_step():
    from empatheia.config import EmpatheiaConfig
    from empatheia.modeling import chain_emotion_token_ids
    from empatheia.processing import Target
    from empatheia.prompts import PromptMode

    labels = ["anxious", "happy", "sad", "proud", "lonely"]
    config = EmpatheiaConfig.from_preset("tiny", {"language_model.chain_emotions": labels})
    model = Empatheia(config).eval()
    dialogues = [make_dialogue(2, audio=False, video=False), make_dialogue(1, audio=False, video=False, seed=1)]
    dialogues[1].chain.speaker_emotion = None  # a row without the step
    encoded = [model.processor.encode(d, PromptMode.FULL, Target(response=d.response, chain=d.chain, signals=True))
               for d in dialogues]
    batch = model.processor.collate(encoded)
    with torch.no_grad():
        predictions = model.chain_emotion_predictions(model.hidden_states(batch), batch["emotion_slot"])
        logits = model.language_model(input_ids=encoded[0].input_ids[None]).logits[0]
    assert predictions[1] is None
    at = int(encoded[0].emotion_slot.nonzero())
    expected = logits[at, chain_emotion_token_ids(model.tokenizer, labels)].softmax(-1)
    got = torch.tensor([predictions[0].probabilities[label] for label in labels])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert predictions[0].label == labels[int(expected.argmax())]


def test_respond_reports_the_chain_emotion_only_when_labels_are_configured(model):
    assert model.config.language_model.chain_emotions is None
    assert model.respond(make_dialogue(1), max_new_tokens=4).chain_emotion is None


def test_chain_emotions_that_share_a_first_token_are_an_error(model):
    from empatheia.modeling import chain_emotion_token_ids

    first = model.tokenizer.convert_ids_to_tokens(model.tokenizer.encode(" anxious", add_special_tokens=False))
    if len(first) < 2:
        pytest.skip("the tiny tokenizer writes 'anxious' as one token")
    twin = model.tokenizer.convert_tokens_to_string(first[:1]).strip() + "zzq"
    with pytest.raises(ValueError, match=r"chain_emotions: \[\['anxious', '" + twin + r"'\]\] share a first token"):
        chain_emotion_token_ids(model.tokenizer, ["anxious", twin, "happy"])


def test_respond_in_stages_hands_over_text_then_voice_then_face(model):
    dialogue = make_dialogue(1, video=False, gold=False)
    staged = list(model.respond_in_stages(dialogue, max_new_tokens=3, animate=True))
    assert [stage for stage, _ in staged] == ["text", "speech", "video"]
    response = staged[-1][1]
    assert all(r is response for _, r in staged)  # one answer, filled in further
    whole = model.respond(dialogue, max_new_tokens=3, animate=True)
    assert response.text == whole.text and response.avatar == whole.avatar
    torch.testing.assert_close(response.audio.samples, whole.audio.samples)
    assert response.video.frames.shape == whole.video.frames.shape
    assert [stage for stage, _ in model.respond_in_stages(dialogue, max_new_tokens=3)] == ["text"]


def test_respond_in_stages_speaks_with_the_avatar_it_is_given(model):
    import numpy as np

    from empatheia.generators.base import Avatar

    mine = Avatar(key="mine", portrait=np.full((64, 64, 3), 90, np.uint8), voice="auto", profile={"gender": "male"})
    dialogue = make_dialogue(1, audio=False, video=False)
    *_, (stage, response) = model.respond_in_stages(dialogue, max_new_tokens=3, speak=True, avatar=mine)
    assert stage == "speech" and response.avatar == "mine" and response.avatar_profile == {"gender": "male"}
    assert model.avatars().get("mine") is None  # the caller's avatar stays the caller's
