"""Long dialogues: the oldest turns are dropped to fit ``language_model.max_length``, in
a number of prompt renderings that grows with the log of the dialogue's length, and the
answer says how many were dropped."""

from __future__ import annotations

import math

import pytest

from empatheia import Dialogue, Empatheia, Turn
from empatheia.errors import DataError
from empatheia.prompts import PromptMode


def long_dialogue(turns: int) -> Dialogue:
    return Dialogue([Turn("speaker" if i % 2 == 0 else "listener", f"Turn {i}: the day went on and on.")
                     for i in range(turns)], id=f"long-{turns}")


@pytest.fixture(scope="module")
def model():
    return Empatheia.from_preset("tiny")


def test_the_oldest_turns_are_dropped_by_bisection(model, monkeypatch):
    processor = model.processor
    dialogue = long_dialogue(400)
    reserve = 40
    limit = model.config.language_model.max_length

    def length_from(start):
        return len(processor._prompt_ids(processor.prompt_text(dialogue, PromptMode.FULL, start))) + reserve

    # The first kept turn is the oldest whose prompt fits (found here turn by turn, from
    # the newest, which is linear rather than quadratic).
    expected = len(dialogue.turns) - 1
    while expected > 0 and length_from(expected - 1) <= limit:
        expected -= 1
    assert expected > 0  # the dialogue is long enough to need shortening

    rendered = []
    render = processor.prompt_text
    monkeypatch.setattr(processor, "prompt_text", lambda *a, **k: rendered.append(1) or render(*a, **k))
    encoded = processor.encode(dialogue, PromptMode.FULL, reserve=reserve)
    assert encoded.first_turn == expected
    assert len(encoded.input_ids) + reserve <= limit
    assert len(rendered) <= math.ceil(math.log2(len(dialogue.turns))) + 2


def test_a_last_turn_too_long_is_still_an_error(model):
    words = " ".join(["word"] * 5000)
    dialogue = Dialogue([Turn("speaker", "hello"), Turn("listener", "hi"), Turn("speaker", words)], id="too-long")
    with pytest.raises(DataError, match="only its last turn"):
        model.processor.encode(dialogue, PromptMode.FULL)


def test_the_answer_and_the_command_line_say_how_many_turns_were_left_out(model, tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    dialogue = long_dialogue(200)
    response = model.respond(dialogue, max_new_tokens=4)
    expected = model.processor.encode(dialogue, PromptMode.FULL,
                                      reserve=4 + 2 * model.config.language_model.num_signal_tokens + 1).first_turn
    assert response.dropped_turns == expected > 0
    assert response.to_dict()["dropped_turns"] == expected

    history = [{"index": i, "role": t.role, "utterance": t.text} for i, t in enumerate(dialogue.turns)]
    conversation = {"conversation_id": "long", "speaker_profile": {}, "listener_profile": {},
                    "turns": [{"turn_id": "0", "dialogue_history": history}]}
    path = tmp_path / "long.json"
    path.write_text(json.dumps(conversation))
    result = subprocess.run(
        [sys.executable, "-m", "empatheia", "respond", str(path), "--preset", "tiny", "--max-new-tokens", "4",
         "--out", str(tmp_path / "out")],
        cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "oldest turn(s) were left out to fit language_model.max_length" in result.stderr
    saved = json.loads((tmp_path / "out" / "response.json").read_text())
    assert saved["dropped_turns"] > 0
