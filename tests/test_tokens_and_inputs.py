"""Signal tokens, placeholders, prompt layouts and truncation."""

from __future__ import annotations

import pytest
import torch

from empatheia import Dialogue, Turn
from empatheia.language_model import AUDIO_PLACEHOLDER, VIDEO_PLACEHOLDER, audio_signal_tokens, video_signal_tokens
from empatheia.processing import IGNORE_INDEX, Target
from empatheia.prompts import PromptMode

from .conftest import full_batch, make_dialogue


def test_every_signal_token_is_one_id(model):
    tokens = [AUDIO_PLACEHOLDER, VIDEO_PLACEHOLDER] + audio_signal_tokens(16) + video_signal_tokens(16)
    ids = [model.tokenizer.encode(t, add_special_tokens=False) for t in tokens]
    assert all(len(i) == 1 for i in ids)
    assert len({i[0] for i in ids}) == len(tokens)
    # in running text too, e.g. a target that ends with the signal tokens
    text = "Finally, the response is: ok\n" + "".join(tokens[2:])
    encoded = model.tokenizer.encode(text, add_special_tokens=False)
    assert encoded[-32:] == [i[0] for i in ids[2:]]
    assert list(model.token_ids.signals) == [i[0] for i in ids[2:]]


def test_placeholders_are_replaced_by_projected_features(model):
    batch = full_batch(model)
    audio, video = model.encode_media(batch)
    assert audio.shape == (5, model.config.speech_encoder.num_tokens, model.config.language_model.hidden_size)
    assert video.shape == (5, model.config.video_encoder.num_tokens, model.config.language_model.hidden_size)
    embeddings = model.embed_inputs(batch["input_ids"], audio, video)
    ids = batch["input_ids"]
    torch.testing.assert_close(embeddings[ids == model.token_ids.audio_placeholder], audio.reshape(-1, audio.shape[-1]))
    torch.testing.assert_close(embeddings[ids == model.token_ids.video_placeholder], video.reshape(-1, video.shape[-1]))
    plain = model.language_model.get_input_embeddings()(ids)
    other = (ids != model.token_ids.audio_placeholder) & (ids != model.token_ids.video_placeholder)
    torch.testing.assert_close(embeddings[other], plain[other])


def test_placeholder_count_mismatch_is_a_clear_error(model):
    batch = full_batch(model)
    audio, video = model.encode_media(batch)
    with pytest.raises(ValueError, match=r"<Aud> placeholders per row \(5 in all.*carries 4 clips"):
        model.embed_inputs(batch["input_ids"], audio[:4], video)
    with pytest.raises(ValueError, match="<Vid>"):
        model.embed_inputs(batch["input_ids"], audio, None)


def test_cached_encoder_features_match_raw_media(model):
    batch = full_batch(model)
    with torch.no_grad():
        audio_features = model.speech_encoder(batch["audio"], batch["audio_lengths"])
        video_features = model.video_encoder(batch["video"])
        cached = {k: v for k, v in batch.items() if k not in ("audio", "audio_lengths", "video")}
        cached.update(audio_features=audio_features, video_features=video_features)
        model.eval()
        torch.testing.assert_close(model(cached, stage=4)["loss"], model(batch, stage=4)["loss"])


def test_speech_features_ignore_padding(model):
    wave = torch.randn(12000)
    padded = torch.zeros(2, 20000)
    padded[0, :12000] = wave
    padded[1] = torch.randn(20000)
    alone = model.speech_encoder(wave[None], torch.tensor([12000]))
    batched = model.speech_encoder(padded, torch.tensor([12000, 20000]))
    torch.testing.assert_close(batched[0], alone[0], rtol=1e-4, atol=1e-5)


def test_labels_mask_everything_but_the_target(model):
    d = make_dialogue(3)
    example = model.processor.encode(d, PromptMode.FULL, Target(response=d.response, chain=d.chain, signals=True))
    labelled = example.labels != IGNORE_INDEX
    first = int(labelled.nonzero()[0])
    assert labelled[first:].all() and not labelled[:first].any()
    target_text = model.tokenizer.decode(example.input_ids[first:])
    assert target_text.startswith("Firstly, the event scenario of this conversation is: Moving")
    assert "Finally, the response is: New places" in target_text
    assert example.input_ids[-1] == model.token_ids.eos
    response = model.tokenizer.decode(example.input_ids[example.response_mask]).strip()
    assert response == d.response


def test_prompt_layouts_of_the_stages(model):
    d = make_dialogue(3)
    text = model.processor.prompt_text(d, PromptMode.TEXT)
    assert "Speaker: I finally got the keys" in text and "<Aud>" not in text
    style = model.processor.prompt_text(d, PromptMode.STYLE)
    assert "Speaker: <Aud> <Vid>" in style and "keys" not in style
    full = model.processor.prompt_text(d, PromptMode.FULL)
    assert "Speaker: I finally got the keys to my first apartment today! <Aud> <Vid>" in full
    no_media = make_dialogue(2, audio=False, video=False)
    assert "<Aud>" not in model.processor.prompt_text(no_media, PromptMode.FULL)


def test_long_dialogues_drop_the_oldest_turns_first(model):
    d = make_dialogue(5, audio=False, video=False)
    target = Target(response=d.response, chain=d.chain)
    whole = model.processor.encode(d, PromptMode.TEXT, target)
    model.config.language_model.max_length = len(whole.input_ids) - 5
    cut = model.processor.encode(d, PromptMode.TEXT, target)
    assert cut.first_turn == 1
    assert len(cut.input_ids) <= model.config.language_model.max_length
    assert "I finally got the keys" not in model.tokenizer.decode(cut.input_ids)
    assert torch.equal(cut.labels[cut.labels != IGNORE_INDEX], whole.labels[whole.labels != IGNORE_INDEX])


def test_a_target_that_cannot_fit_is_an_error_not_a_cut(model):
    model.config.language_model.max_length = 40
    d = make_dialogue(1, audio=False, video=False)
    with pytest.raises(ValueError, match=r"record test-0-1, field .response.: .* over language_model.max_length=40"):
        model.processor.encode(d, PromptMode.TEXT, Target(response=d.response, chain=d.chain))


def test_bad_turns_are_rejected():
    with pytest.raises(ValueError, match="unknown role 'narrator'"):
        Turn("narrator", "hello")
    with pytest.raises(ValueError, match="sample_rate"):
        Turn("speaker", "hi", audio=torch.zeros(100).numpy())
    with pytest.raises(ValueError, match="needs text, audio or video"):
        Turn("speaker", "  ")
    with pytest.raises(ValueError, match="no turns"):
        Dialogue([])


def test_right_padding_needs_no_attention_mask(model):
    """Training batches are padded on the right, where a causal model's real tokens never
    see the padding: dropping the mask (for the fused causal kernel) changes nothing read."""
    from empatheia.modeling import _right_padded

    batch = full_batch(model, [make_dialogue(1, seed=0), make_dialogue(3, seed=1)])
    mask = batch["attention_mask"]
    assert _right_padded(mask) and not bool(mask.all())
    assert not _right_padded(mask.flip(-1))  # left padding (generation) keeps its mask
    model.eval()
    with torch.no_grad():
        fast = model.hidden_states(batch)
        embeddings = model.embed_inputs(batch["input_ids"], *model.encode_media(batch))
        masked = model._hf_model().base_model(inputs_embeds=embeddings, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(fast[mask.bool()], masked[mask.bool()])


def test_the_emotion_slot_is_the_token_before_the_chains_emotion(model):
    processor, tokenizer = model.processor, model.tokenizer
    dialogue = make_dialogue(2)  # gold chain: speaker_emotion "anxious"
    target = Target(response=dialogue.response, chain=dialogue.chain, signals=True)
    example = processor.encode(dialogue, PromptMode.FULL, target)
    assert int(example.emotion_slot.sum()) == 1
    at = int(example.emotion_slot.nonzero())
    assert tokenizer.decode(example.input_ids[: at + 1]).endswith("the emotion of the speaker is:")
    assert tokenizer.decode(example.input_ids[at + 1 :]).startswith(" anxious\n")
    # Left padding (generation) moves the slot with its row.
    short = processor.encode(make_dialogue(1), PromptMode.FULL, target)
    batch = processor.collate([example, short], padding_side="left")
    for row, encoded in enumerate((example, short)):
        slot = batch["emotion_slot"][row].nonzero().flatten()
        assert slot.numel() == 1
        assert batch["input_ids"][row, slot + 1] == encoded.input_ids[encoded.emotion_slot.nonzero().flatten() + 1]
    # No emotion step, no slot; prompts alone have none either.
    dialogue.chain.speaker_emotion = None
    without = processor.encode(dialogue, PromptMode.FULL, Target(response=dialogue.response, chain=dialogue.chain))
    assert not without.emotion_slot.any()
    assert not processor.encode(dialogue, PromptMode.FULL).emotion_slot.any()
