"""The pipeline baseline and E3RG on the shipped ``small`` parts: a 3-turn dialogue with
and without real media (shared/data speech and MEAD faces), answered end to end with
speech and video."""

from __future__ import annotations

import pytest

from empatheia import Dialogue, Empatheia, Turn
from empatheia.labels import ED_EMOTIONS, EMOTION_LABELS
from empatheia.variants.build import build_e3rg, build_pipeline

from .conftest import shared_data


@pytest.fixture(scope="module")
def pipeline():
    return build_pipeline("small")


@pytest.fixture(scope="module")
def e3rg(tmp_path_factory):
    return build_e3rg(Empatheia.from_preset("small"), memory=tmp_path_factory.mktemp("e3rg-memory"))


def frightened(media: bool) -> Dialogue:
    voice = shared_data("media/speech/fearful.wav") if media else None
    face = shared_data("media/mead_faces/video/W011_front_fear_level3_001.mp4") if media else None
    return Dialogue(
        [Turn("speaker", "The car skidded on the ice on my way home and nearly hit a tree.", audio=voice, video=face),
         Turn("listener", "Oh no, are you alright?"),
         Turn("speaker", "I'm fine, but my hands are still shaking.", audio=voice, video=face)],
        id="frightened/3",
        listener_profile={"gender": "female", "age": "young", "timbre": "mid"},
    )


@pytest.mark.parametrize("media", [True, False])
def test_pipeline_answers_with_its_written_emotion_voice_and_face(pipeline, media):
    response = pipeline.respond(frightened(media), animate=True)
    # The shipped pipeline core writes the meta-response it was tuned on.
    assert response.chain.parsed and response.chain.speaker_emotion in ED_EMOTIONS
    assert response.text.strip() and "Emotion:" not in response.text
    assert response.emotion.label in EMOTION_LABELS and response.chain_emotion is not None
    assert response.audio.duration > 0.5 and response.video.frames.shape[0] >= 10


@pytest.mark.parametrize("media", [True, False])
def test_e3rg_answers_with_the_voted_emotion_voice_and_face(e3rg, media):
    response = e3rg.respond(frightened(media), animate=True)
    vote = e3rg.last_votes[0]
    assert response.text.strip() and response.emotion.label == vote.label
    readers = {name for name, reading in vote.readings.items() if reading is not None}
    assert readers == ({"chain", "text", "face", "prosody"} if media else {"chain", "text"})
    assert response.audio.duration > 0.5 and response.video.frames.shape[0] >= 10


def test_the_docs_example_runs(tmp_path, monkeypatch, capsys):
    import re
    from pathlib import Path

    doc = Path(__file__).resolve().parents[1] / "docs" / "variants.md"
    # The walk-through at the top (the later block records how the comparison's ablations
    # were assembled from training runs).
    block = re.findall(r"```python\n(.*?)```", doc.read_text(), re.S)[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "variants.md", "exec"), {"__name__": "__doc_example__"})
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[0] for line in lines[:2]] == ["pipeline", "e3rg"]
    assert all(line.split()[1] in EMOTION_LABELS for line in lines[:2])
    assert lines[2] == "['chain', 'text']" and (tmp_path / "e3rg-memory" / "users").is_dir()
