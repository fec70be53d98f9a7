"""`empatheia respond` reads every format `data check` reads (issue 26): AvaMERG JSON, avatar
JSONL (media relative to the file's folder) and EmpatheticDialogues JSONL; `--conversation`
and `--turn` pick the example, and a wrong or missing choice is one error line naming the
file and its conversations. A fine-tuned model answers with its own label sets: its
profile attributes are printed and saved, and the chain's emotion is folded by its fold."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

import empatheia.cli as cli
from empatheia import Empatheia
from empatheia.labels import LabelSets
from empatheia.prompts import ChainOfEmpathy
from empatheia.response import EmpatheticResponse, LabelPrediction

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CUSTOM = LabelSets(
    emotions=["calm", "stressed", "upbeat"],
    profile={"gender": ["male", "female"], "accent": ["us", "uk"]},
    emotion_fold={"worried": "stressed", "relaxed": "calm", "excited": "upbeat"},
)
AVATAR = [
    {"id": "clinic-7/1", "listener": {"gender": "female", "accent": "uk"},
     "history": [{"role": "speaker", "text": "Still no call from the doctor.", "audio": "clips/7-0.wav"}],
     # The gold response's clip is not there: answering does not need it.
     "response": {"text": "Waiting is the hardest part.", "audio": "clips/absent.wav"}, "emotion": "worried"},
    {"id": "clinic-7/2", "listener": {"gender": "female", "accent": "uk"},
     "history": [{"role": "speaker", "text": "Still no call from the doctor."},
                 {"role": "listener", "text": "Waiting is the hardest part."},
                 {"role": "speaker", "text": "They said Friday.", "audio": "clips/7-2.wav"}],
     "emotion": "worried"},
    {"id": "home-3", "listener": {"gender": "male"}, "history": [{"role": "speaker", "text": "We moved in!"}],
     "emotion": "excited"},
]
ED_CONVERSATIONS = [
    {"conv_id": "c1", "situation": "I lost my job.", "emotion": "sad",
     "utterances": ["I lost my job today", "I am so sorry", "Thanks, it hurts", "Things will get better"]},
    {"conv_id": "c2", "situation": "I won.", "emotion": "proud", "utterances": ["I won the prize", "Congratulations"]},
]
ED_RESPONSES = [
    {"conv_id": "r1", "context": ["I lost my keys"], "response": "Oh no!", "emotion": "annoyed"},
    {"conv_id": "r1", "context": ["I lost my keys", "Oh no!", "And my phone"], "response": "What a day.", "emotion": "annoyed"},
]


def write_jsonl(path: Path, records) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def avatar_data(folder: Path) -> Path:
    (folder / "clips").mkdir(parents=True, exist_ok=True)
    speech = (np.random.default_rng(0).standard_normal(16000) * 0.1).astype(np.float32)
    for name in ("7-0", "7-2"):
        soundfile.write(str(folder / "clips" / f"{name}.wav"), speech, 16000)
    return write_jsonl(folder / "avatar.jsonl", AVATAR)


def answered(argv, out: Path) -> dict:
    assert cli.main(argv + ["--max-new-tokens", "2", "--out", str(out)]) == 0
    return json.loads((out / "response.json").read_text())


def fails(argv, match: str) -> str:
    with pytest.raises(SystemExit) as raised:
        cli.main(argv)
    message = str(raised.value.code)
    assert message.startswith("error: ") and "\n" not in message, message
    assert re.search(match, message), message
    return message


def test_respond_answers_an_avatar_jsonl_example(answer_with, tmp_path, monkeypatch):
    data = avatar_data(tmp_path / "data")
    monkeypatch.chdir(tmp_path)  # media paths are relative to the file's folder, not to here
    argv = ["respond", str(data)]
    assert answered(argv + ["--conversation", "clinic-7"], tmp_path / "a")["dialogue_id"] == "clinic-7/2"
    assert answered(argv + ["--conversation", "clinic-7", "--turn", "0"], tmp_path / "b")["dialogue_id"] == "clinic-7/1"
    assert answered(argv + ["--conversation", "clinic-7/1"], tmp_path / "c")["dialogue_id"] == "clinic-7/1"
    assert answered(argv + ["--conversation", "home-3", "--format", "avatar"], tmp_path / "d")["dialogue_id"] == "home-3"
    (tmp_path / "data" / "clips" / "7-2.wav").unlink()
    fails(argv + ["--conversation", "clinic-7", "--out", str(tmp_path / "e")],
          rf"avatar.jsonl: {re.escape(str(tmp_path / 'data' / 'clips' / '7-2.wav'))}, record clinic-7/2, "
          r"field 'history\[2\].audio': audio file not found")


def test_respond_reads_empatheticdialogues_files(answer_with, tmp_path):
    conversations = write_jsonl(tmp_path / "ed.jsonl", ED_CONVERSATIONS)
    assert answered(["respond", str(conversations), "--conversation", "c1"], tmp_path / "a")["dialogue_id"] == "c1/3"
    assert answered(["respond", str(conversations), "--conversation", "c1", "--turn", "0"],
                    tmp_path / "b")["dialogue_id"] == "c1/1"
    responses = write_jsonl(tmp_path / "responses.jsonl", ED_RESPONSES)
    assert answered(["respond", str(responses), "--turn", "0"], tmp_path / "c")["dialogue_id"] == "r1/1"
    assert answered(["respond", str(responses)], tmp_path / "d")["dialogue_id"] == "r1/3"


def test_a_wrong_or_missing_choice_names_the_file_and_its_conversations(tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "load_system", lambda args: pytest.fail("the model was loaded"))
    data = avatar_data(tmp_path)
    out = ["--out", str(tmp_path / "out")]
    fails(["respond", str(data), *out],
          rf"{re.escape(str(data))}: holds 2 conversations \('clinic-7', 'home-3'\); choose one with --conversation ID")
    fails(["respond", str(data), "--conversation", "clinic-9", *out],
          rf"{re.escape(str(data))}: no conversation 'clinic-9': give --conversation one of 'clinic-7', 'home-3'$")
    fails(["respond", str(data), "--conversation", "clinic-7", "--turn", "2", *out],
          r"avatar.jsonl: turn 2 is out of range: conversation 'clinic-7' has 2 examples \(its lines\); "
          r"give --turn 0 to 1, or -1 for the last")
    ed = write_jsonl(tmp_path / "ed.jsonl", ED_CONVERSATIONS)
    fails(["respond", str(ed), *out], r"ed.jsonl: holds 2 conversations \('c1', 'c2'\)")
    fails(["respond", str(ed), "--format", "avamerg", "--conversation", "c1", *out], r"ed.jsonl")
    conversations = tmp_path / "dialogues.json"
    conversations.write_text((EXAMPLES / "dialogues.json").read_text())
    fails(["respond", str(conversations), *out], r"dialogues.json: holds \d+ conversations \('00001', ")
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def fine_tuned(tmp_path_factory) -> Path:
    """A tiny model fine-tuned to the user's own classes, saved as training saves it."""
    model = Empatheia.from_preset("tiny")
    model.set_label_sets(CUSTOM)
    folder = tmp_path_factory.mktemp("fine") / "final"
    model.save_pretrained(folder)
    return folder


def test_a_fine_tuned_model_answers_its_own_data_with_its_profile(fine_tuned, tmp_path, capsys):
    data = avatar_data(tmp_path / "data")
    saved = answered(["respond", str(data), "--checkpoint", str(fine_tuned), "--conversation", "clinic-7"], tmp_path / "o")
    assert set(saved["emotion"]["probabilities"]) == {"calm", "stressed", "upbeat"}
    assert set(saved["profile"]) == {"gender", "accent"}
    assert set(saved["profile"]["accent"]["probabilities"]) == {"us", "uk"}
    printed = json.loads(capsys.readouterr().out)
    assert printed["profile"] == {name: saved["profile"][name]["label"] for name in ("gender", "accent")}


def _response(emotion: str, chain_emotion: str, labels=None) -> EmpatheticResponse:
    return EmpatheticResponse(
        text="Hang in there.", chain=ChainOfEmpathy(speaker_emotion=chain_emotion),
        emotion=LabelPrediction(emotion, {emotion: 1.0}), profile={}, speech_content=torch.zeros(1, 2),
        speech_style=torch.zeros(2), video_content=torch.zeros(1, 2), video_style=torch.zeros(2), label_sets=labels,
    )


def test_style_agreement_folds_the_chain_with_the_models_label_sets(fine_tuned):
    assert "agree." in _response("stressed", "worried", CUSTOM).style_agreement()
    assert "disagree" in _response("calm", "worried", CUSTOM).style_agreement()
    # 'anxious' is no label of theirs: no reading to compare, rather than AvaMERG's fear.
    assert _response("stressed", "anxious", CUSTOM).style_agreement() is None
    assert "agree." in _response("fear", "anxious").style_agreement()  # AvaMERG's fold by default
    model = Empatheia.from_pretrained(fine_tuned)
    dialogue = _dialogue()
    assert model.respond(dialogue, max_new_tokens=2).label_sets.emotions == CUSTOM.emotions


def _dialogue():
    from empatheia import Dialogue, Turn

    return Dialogue([Turn("speaker", "They said Friday.")], id="x")
