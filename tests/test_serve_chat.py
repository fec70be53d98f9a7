"""``empatheia chat``: a multi-turn conversation in the terminal with one loaded model, and
the conversation window that chat and serve share."""

from __future__ import annotations

import io

import numpy as np

from empatheia import Empatheia
from empatheia.cli import main
from empatheia.dialogue import Turn
from empatheia.serve.chat import Chat
from empatheia.serve.conversation import Conversation

from .conftest import wav_bytes


def test_chat_answers_turn_after_turn_and_writes_the_voice(tmp_path, monkeypatch, capsys):
    clip = tmp_path / "me.wav"
    clip.write_bytes(wav_bytes(1.5))
    lines = f"I lost my keys again.\n/audio {clip}\nIt was the third time this week.\n/video {clip}\n/reset\nHello?\n/quit\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(lines))
    out = tmp_path / "chat"
    assert main(["chat", "--preset", "tiny", "--speak", "--max-new-tokens", "4", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("avatar> ") == 3
    assert "(audio attached to the next turn: 1.5 s)" in printed
    assert "error:" in printed and "is not a video" in printed  # a WAV is no video: said, and the chat goes on
    assert "(a new conversation)" in printed
    for n in (1, 2, 3):
        assert (out / f"turn-{n}" / "response.wav").is_file() and (out / f"turn-{n}" / "response.json").is_file()
        assert f"voice: {out / f'turn-{n}' / 'response.wav'}" in printed
    second = (out / "turn-2" / "index.html").read_text()
    assert "I lost my keys again." in second and "third time" in second
    third = (out / "turn-3" / "index.html").read_text()
    assert "Hello?" in third and "keys" not in third


def test_chat_with_text_only_writes_no_media(tmp_path):
    said = []
    chat = Chat(Empatheia.from_preset("tiny"), tmp_path, max_new_tokens=3, write=said.append)
    chat.run(io.StringIO("Hi there.\n"))
    assert any(line.startswith("avatar> ") for line in said)
    assert (tmp_path / "turn-1" / "response.json").is_file() and not (tmp_path / "turn-1" / "response.wav").exists()


def test_the_window_starts_with_the_user_and_keeps_the_last_turns(tmp_path):
    conversation = Conversation(tmp_path, max_turns=4)  # even: one less, so the window opens with the user
    assert conversation.max_turns == 3

    class Answer:
        text = ""

    for i in range(4):
        turn = Turn("speaker", f"turn {i}", audio=np.ones(1600, np.float32), sample_rate=16000)
        dialogue = conversation.dialogue(turn)
        assert dialogue.turns[0].role == "speaker" and len(dialogue.turns) == min(3, 2 * i + 1)
        conversation.record(turn, Answer())
    assert [t.text for t in conversation.dialogue(Turn("speaker", "next")).turns] == ["turn 3", "...", "next"]
    assert conversation.answered == 4
