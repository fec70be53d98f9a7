"""AvaMERG conversations, media files (real clips from ../shared/data), chain parsing."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import soundfile
import torch

from empatheia import PromptMode
from empatheia.data import DataError, avamerg_dialogue
from empatheia.media import load_audio, load_video_frames
from empatheia.prompts import ChainOfEmpathy, chain_text, parse_chain

from .conftest import shared_data

TRAIN_CONVERSATION = {
    "conversation_id": "00042",
    "speaker_profile": {"age": "young", "gender": "female", "timbre": "high", "ID": "7"},
    "listener_profile": {"age": "elderly", "gender": "male", "timbre": "low", "ID": "3"},
    "topic": "health",
    "turns": [
        {
            "turn_id": "0",
            "context": "Waiting for test results.",
            "dialogue_history": [
                {"index": 0, "role": "speaker", "utterance": "The doctor still hasn't called with my results."}
            ],
            "response": "Waiting is the hardest part. Is someone with you?",
            "chain_of_empathy": {
                "speaker_emotion": "anxious",
                "event_scenario": "Waiting for medical test results.",
                "emotion_cause": "Not knowing the outcome.",
                "goal_to_response": "Offer company and calm.",
            },
        },
        {
            "turn_id": "1",
            "context": "Waiting for test results.",
            "dialogue_history": [
                {"index": 0, "role": "speaker", "utterance": "The doctor still hasn't called with my results."},
                {"index": 1, "role": "listener", "utterance": "Waiting is the hardest part. Is someone with you?"},
                {"index": 2, "role": "speaker", "utterance": "My sister is coming over tonight."},
            ],
            "response": "I'm glad you won't be alone tonight.",
            "chain_of_empathy": {
                "speaker_emotion": "apprehensive",
                "event_scenario": "Waiting for results with family support.",
                "emotion_cause": "Uncertainty about health.",
                "goal_to_response": "Affirm the support.",
            },
        },
    ],
}


def _media_root(tmp_path, conversation, ids=("7", "3")):
    """Real speech and face clips named the AvaMERG way."""
    speech = shared_data("media/speech/sad.wav")
    face = shared_data("media/mead_faces/video/W009_front_sad_level3_001.mp4")
    root = tmp_path / "media"
    root.mkdir()
    for utterance in conversation["turns"][-1]["dialogue_history"]:
        avatar = ids[0] if utterance["role"] == "speaker" else ids[1]
        stem = f"dia{conversation['conversation_id']}utt{utterance['index']}_{avatar}"
        shutil.copy(speech, root / f"{stem}.wav")
        shutil.copy(face, root / f"{stem}.mp4")
    return root


def test_avamerg_dialogue_train_form():
    d = avamerg_dialogue(TRAIN_CONVERSATION)
    assert d.id == "00042/1"
    assert [t.role for t in d.turns] == ["speaker", "listener", "speaker"]
    assert d.turns[2].text == "My sister is coming over tonight."
    assert d.response == "I'm glad you won't be alone tonight."
    assert d.chain.speaker_emotion == "apprehensive"
    assert d.listener_profile["ID"] == "3" and d.turns[0].profile["ID"] == "7"
    assert d.context == "Waiting for test results."
    first = avamerg_dialogue(TRAIN_CONVERSATION, turn=0)
    assert len(first.turns) == 1 and first.chain.speaker_emotion == "anxious"


def test_avamerg_dialogue_released_test_form():
    conversation = json.loads(shared_data("avamerg/challenge_test_excerpt.json").read_text())[0]
    d = avamerg_dialogue(conversation)
    assert d.id == "03998/1" and len(d.turns) == 3
    assert d.response is None and d.chain is None and d.listener_profile is None


def test_avamerg_dialogue_attaches_media_and_reports_missing(tmp_path):
    root = _media_root(tmp_path, TRAIN_CONVERSATION)
    d = avamerg_dialogue(TRAIN_CONVERSATION, media_root=root)
    assert d.turns[1].audio == root / "dia00042utt1_3.wav"
    assert d.turns[2].video == root / "dia00042utt2_7.mp4"
    (root / "dia00042utt1_3.mp4").unlink()
    with pytest.raises(DataError, match=r"dia00042utt1_3.mp4, record 00042/1, field 'turns\[1\].dialogue_history\[1\] \(video\)': video file not found"):
        avamerg_dialogue(TRAIN_CONVERSATION, media_root=root)
    lenient = avamerg_dialogue(TRAIN_CONVERSATION, media_root=root, require_media=False)
    assert lenient.missing_media == [str(root / "dia00042utt1_3.mp4")]
    assert lenient.turns[1].video is None and lenient.turns[1].audio is not None


def test_test_form_media_match_any_avatar(tmp_path):
    conversation = json.loads(shared_data("avamerg/challenge_test_excerpt.json").read_text())[0]
    root = _media_root(tmp_path, conversation, ids=("12", "40"))
    d = avamerg_dialogue(conversation, media_root=root)
    assert d.turns[0].audio.name == "dia03998utt0_12.wav"


@pytest.mark.parametrize(
    "breakage, message",
    [
        (lambda c: c.pop("turns"), r"record 00042, field 'turns': missing"),
        (lambda c: c["turns"][1]["dialogue_history"][2].update(role="narrator"), r"record 00042/1, field 'turns\[1\].dialogue_history\[2\].role': unknown role 'narrator'"),
        (lambda c: c["turns"][1]["dialogue_history"][0].pop("utterance"), r"field 'turns\[1\].dialogue_history\[0\].utterance': missing"),
        (lambda c: c["turns"][1].update(dialogue_history="oops"), r"field 'turns\[1\].dialogue_history': should be list"),
        (lambda c: c["turns"][1]["chain_of_empathy"].update(speaker_emotion=3), r"field 'turns\[1\].chain_of_empathy.speaker_emotion': should be a string"),
    ],
)
def test_malformed_conversations_name_the_field(breakage, message):
    conversation = json.loads(json.dumps(TRAIN_CONVERSATION))
    breakage(conversation)
    with pytest.raises(DataError, match=message):
        avamerg_dialogue(conversation)


def test_respond_on_real_speech_and_face_clips(model, tmp_path):
    root = _media_root(tmp_path, TRAIN_CONVERSATION)
    d = avamerg_dialogue(TRAIN_CONVERSATION, media_root=root)
    example = model.processor.encode(d, PromptMode.FULL)
    assert len(example.audio) == 3 and len(example.video) == 3
    assert example.video[0].data.shape == (model.config.video_encoder.num_frames, 3, 32, 32)
    response = model.respond(d, max_new_tokens=6)
    assert response.dialogue_id == "00042/1"


def test_audio_is_read_as_16khz_mono(tmp_path):
    wave = load_audio(shared_data("media/speech/happy.wav"), 16000)
    assert wave.dim() == 1 and 3.0 < len(wave) / 16000 < 4.5
    # a 44.1 kHz stereo file becomes 16 kHz mono
    t = np.arange(44100) / 44100
    stereo = np.stack([np.sin(2 * np.pi * 440 * t), np.sin(2 * np.pi * 440 * t)], 1).astype(np.float32)
    soundfile.write(tmp_path / "stereo.wav", stereo, 44100)
    converted = load_audio(tmp_path / "stereo.wav", 16000)
    assert converted.shape == (16000,)
    spectrum = torch.fft.rfft(converted).abs()
    assert abs(int(spectrum.argmax()) - 440) <= 1


def test_video_frames_are_sampled_evenly():
    frames = load_video_frames(shared_data("media/mead_faces/video/M030_front_happy_level3_001.mp4"), 8)
    assert frames.shape == (8, 256, 256, 3) and frames.dtype == torch.uint8
    assert frames.float().std() > 10  # real picture content, not blank frames


def test_chain_round_trip_and_parse_failures():
    chain = ChainOfEmpathy("A move.", "anxious", "New place.", "Reassure.")
    text = chain_text(chain) + "You will settle in soon."
    assert text.startswith("Firstly, the event scenario of this conversation is: A move.\nSecondly,")
    parsed, response = parse_chain(text)
    assert parsed.parsed and response == "You will settle in soon."
    assert (parsed.event_scenario, parsed.speaker_emotion, parsed.emotion_cause, parsed.goal_to_response) == (
        "A move.", "anxious", "New place.", "Reassure.")
    # missing steps are left out of the target, not invented, and ordinals stay in order
    partial = chain_text(ChainOfEmpathy(event_scenario="A move.", speaker_emotion="anxious"))
    assert partial == ("Firstly, the event scenario of this conversation is: A move.\n"
                       "Secondly, the emotion of the speaker is: anxious\nFinally, the response is: ")
    # The reply is its line: what a lost core writes on the lines after it is not the reply.
    lost = text + "\nSecondly, the emotion is: ashamed\nFinally, the reply is: She"
    parsed, response = parse_chain(lost)
    assert parsed.parsed and response == "You will settle in soon." and parsed.raw == lost
    broken, response = parse_chain("I am so sorry to hear that.")
    assert not broken.parsed and broken.raw == "I am so sorry to hear that." and response == broken.raw
    only_emotion, response = parse_chain("the emotion of the speaker is: sad\nno response line")
    assert not only_emotion.parsed and only_emotion.speaker_emotion.startswith("sad")


def test_respond_reads_each_media_file_once(model, tmp_path, monkeypatch):
    import empatheia.processing as processing

    root = _media_root(tmp_path, TRAIN_CONVERSATION)
    reads = []
    for name in ("load_audio", "load_video_frames"):
        original = getattr(processing, name)
        monkeypatch.setattr(processing, name, lambda path, *a, _f=original: reads.append(path) or _f(path, *a))
    model.respond(avamerg_dialogue(TRAIN_CONVERSATION, media_root=root), max_new_tokens=4)
    assert sorted(p.name for p in reads) == sorted(p.name for p in root.iterdir())
