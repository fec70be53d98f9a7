"""Dataset readers, the emotion fold and label sets.

Real files come from ``../shared/data`` (read-only); every bad-input case writes a small
file with good records around one broken record and checks both ``on_error`` modes.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import soundfile

from empatheia.data import DataError, read_dataset
from empatheia.labels import ED_EMOTIONS, EMOTION_FOLD, EMOTION_LABELS, LabelSets, UnknownEmotionError, fold_emotion, normalize_label
from empatheia.prompts import chain_is_complete

from .conftest import shared_data
from .test_dialogue_and_media import TRAIN_CONVERSATION

ED_CONVERSATIONS = "ed/ed_valid_conversations.jsonl"
ED_RESPONSES = "ed/ed_valid_response_examples.jsonl"
AVAMERG_EXCERPT = "avamerg/challenge_test_excerpt.json"
MEAD_CLIP = "media/mead_faces/video/W009_front_sad_level3_001.mp4"

# The label sets of a made-up avatar dataset: two emotions, one profile attribute.
CALM_LABELS = LabelSets(emotions=["calm", "stressed"], profile={"accent": ["us", "uk"]}, emotion_fold={"relaxed": "calm"})


# ====================================================================== helpers
def write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data, indent=1))
    return path


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def write_wav(path: Path, seconds: float = 0.3, rate: int = 16000) -> Path:
    t = np.arange(int(seconds * rate)) / rate
    path.parent.mkdir(parents=True, exist_ok=True)
    soundfile.write(path, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate)
    return path


def copy_mp4(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(shared_data(MEAD_CLIP), path)
    return path


def setting(*keys, value):
    """A breakage that sets ``record[k0][k1]...[kn] = value``."""

    def breakage(record):
        for key in keys[:-1]:
            record = record[key]
        record[keys[-1]] = value

    return breakage


def removing(*keys):
    """A breakage that deletes ``record[k0][k1]...[kn]``."""

    def breakage(record):
        for key in keys[:-1]:
            record = record[key]
        del record[keys[-1]]

    return breakage


# Each builder writes three records and breaks the middle one (records "00000"-"00002",
# "conv:0"-"conv:2" or "a0"-"a2"). Unbroken, an AvaMERG conversation and an ED conversation
# give 2 examples each, an ED response line and an avatar line 1 each.
def avamerg_conversation(cid: str) -> dict:
    conversation = copy.deepcopy(TRAIN_CONVERSATION)
    conversation["conversation_id"] = cid
    return conversation


def avamerg_file(tmp_path: Path, breakage) -> Path:
    conversations = [avamerg_conversation(f"0000{i}") for i in range(3)]
    breakage(conversations[1])
    return write_json(tmp_path / "train.json", conversations)


def ed_conversation(conv_id: str) -> dict:
    return {
        "conv_id": conv_id,
        "situation": "My dog ran away during the storm.",
        "utterances": ["My dog ran off last night.", "Oh no, did you find him?", "Not yet, I'm worried sick.", "I hope he turns up soon."],
        "roles": ["speaker", "listener", "speaker", "listener"],
        "emotion": "anxious",
    }


def ed_conversations_file(tmp_path: Path, breakage) -> Path:
    records = [ed_conversation(f"conv:{i}") for i in range(3)]
    breakage(records[1])
    return write_jsonl(tmp_path / "ed.jsonl", records)


def ed_response(conv_id: str) -> dict:
    return {
        "conv_id": conv_id,
        "situation": "I passed my exam.",
        "context": ["I passed my driving test!", "Congratulations!", "Thanks, I was so nervous."],
        "response": "All that practice paid off.",
        "emotion": "proud",
    }


def ed_responses_file(tmp_path: Path, breakage) -> Path:
    records = [ed_response(f"conv:{i}") for i in range(3)]
    breakage(records[1])
    return write_jsonl(tmp_path / "responses.jsonl", records)


def avatar_record(example_id: str) -> dict:
    return {
        "id": example_id,
        "context": "A long week at work.",
        "speaker": {"accent": "uk"},
        "listener": {"accent": "us"},
        "history": [
            {"role": "speaker", "text": "Finally the weekend."},
            {"role": "listener", "text": "Any plans?"},
            {"role": "speaker", "text": "Just doing nothing at all."},
        ],
        "response": {"text": "That sounds like exactly what you need."},
        "emotion": "relaxed",
    }


def avatar_file(tmp_path: Path, breakage) -> Path:
    records = [avatar_record(f"a{i}") for i in range(3)]
    breakage(records[1])
    return write_jsonl(tmp_path / "avatar.jsonl", records)


BUILDER_LABELS = {avatar_file: CALM_LABELS}


def where(file, record, field=None) -> str:
    """The regex of a DataError message's start: ``FILE, record R, field 'F': ``."""
    text = f"{file}, record {record}" + (f", field '{field}'" if field else "")
    return "^" + re.escape(text + ": ")


def check_bad_record(path: Path, skipped, reason: str, kept: int, file=None, **options) -> DataError:
    """Reading ``path`` raises a DataError naming the file and the first ``(record, field)``
    of ``skipped``; with ``on_error="skip"`` exactly the ``skipped`` examples are reported,
    with that reason, and ``kept`` examples are read."""
    file = file or path
    record, field = skipped[0]
    with pytest.raises(DataError, match=where(file, record, field) + reason) as caught:
        read_dataset(path, **options)
    error = caught.value
    assert (error.file, error.record, error.field) == (str(file), record, field)

    corpus = read_dataset(path, on_error="skip", **options)
    report = corpus.skipped.skipped
    assert [(s.file, s.record, s.field) for s in report] == [(str(file), r, f) for r, f in skipped]
    assert report[0].reason == error.reason and str(report[0]) == str(error)
    assert all(re.match(reason, s.reason) for s in report)
    assert len(corpus) == kept
    assert not {r for r, _ in skipped} & {d.id for d in corpus}
    assert corpus.skipped.summary().endswith(f"{len(skipped)} sample(s) skipped")
    return error


def check_file_error(path: Path, message: str, **options) -> None:
    """A file-level problem: an error in both modes, since no record can be read."""
    for on_error in ("raise", "skip"):
        with pytest.raises(DataError, match=message):
            read_dataset(path, on_error=on_error, **options)


# ====================================================================== emotion fold
@pytest.fixture(scope="module")
def ed_rows() -> list:
    with open(shared_data(ED_CONVERSATIONS), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_every_ed_emotion_folds_to_one_of_the_seven_classes():
    assert len(ED_EMOTIONS) == 32
    for emotion, cls in ED_EMOTIONS.items():
        assert fold_emotion(emotion) == cls
        assert cls in EMOTION_LABELS
    # ED reaches every class (contempt only through "jealous")
    assert set(ED_EMOTIONS.values()) == set(EMOTION_LABELS)


def test_real_ed_file_uses_exactly_the_32_labels(ed_rows):
    assert len(ed_rows) == 2770
    assert {row["emotion"] for row in ed_rows} == set(ED_EMOTIONS)


def test_fold_differs_from_the_files_emotion7_only_where_documented(ed_rows):
    disagreements = {
        (row["emotion"], row["emotion7"], fold_emotion(row["emotion"]))
        for row in ed_rows
        if fold_emotion(row["emotion"]) != row["emotion7"]
    }
    # (label, public AvaMERG fold, this project's fold), see empatheia/labels.py
    assert disagreements == {("anxious", "sad", "fear"), ("devastated", "surprised", "sad")}


@pytest.mark.parametrize(
    "label, normalised, cls",
    [
        ("Grossed_Out.", "grossed out", "disgusted"),
        ("grossed-out", "grossed out", "disgusted"),
        ("grossed   out", "grossed out", "disgusted"),
        (" SADNESS ", "sadness", "sad"),
        ("terrified!", "terrified", "fear"),
        ("Apprehensive?", "apprehensive", "fear"),
        ('"Jealous"', "jealous", "contempt"),
        ("Surprised,", "surprised", "surprised"),
    ],
)
def test_label_variants_normalise(label, normalised, cls):
    assert normalize_label(label) == normalised
    assert fold_emotion(label) == cls


def test_class_names_map_to_themselves_and_the_fold_maps_only_onto_classes():
    for cls in EMOTION_LABELS:
        assert fold_emotion(cls) == cls
        assert fold_emotion(cls.upper()) == cls
    assert set(EMOTION_FOLD.values()) == set(EMOTION_LABELS)
    # keys are stored normalised, otherwise they could never be looked up
    assert all(normalize_label(key) == key for key in EMOTION_FOLD)


@pytest.mark.parametrize("label, named", [("neutral", "'neutral'"), ("bananas", "'bananas'"), (3, "int 3"), (None, "NoneType None")])
def test_unknown_emotions_raise_naming_the_label(label, named):
    with pytest.raises(UnknownEmotionError, match=re.escape(named)):
        fold_emotion(label)
    assert issubclass(UnknownEmotionError, ValueError)


# ====================================================================== label sets
def test_default_label_sets_index_and_canonical_spelling():
    labels = LabelSets()
    assert [labels.emotion_index(cls) for cls in EMOTION_LABELS] == list(range(7))
    assert labels.emotion_class("Anxious") == "fear"
    assert labels.emotion_index("devastated") == EMOTION_LABELS.index("sad")
    for spelling in ("Middle aged", "middle_aged", "MIDDLE-AGED", "middleaged"):
        assert labels.profile_value("age", spelling) == "middle-aged"
    assert labels.profile_index("gender", "Female") == 1
    assert labels.profile_index("timbre", "low") == 2


def test_custom_label_sets():
    labels = CALM_LABELS
    assert labels.emotion_index("calm") == 0
    assert labels.emotion_index("Stressed!") == 1
    assert labels.emotion_class("Relaxed") == "calm"  # through the fold
    assert labels.profile_value("accent", "UK") == "uk"
    assert labels.profile_index("accent", "us") == 0
    # the AvaMERG fold belongs to the AvaMERG classes only
    with pytest.raises(UnknownEmotionError, match="'sad'"):
        labels.emotion_class("sad")
    # without a fold a custom set knows its class names only
    with pytest.raises(UnknownEmotionError, match="'relaxed'"):
        LabelSets(emotions=["calm", "stressed"]).emotion_class("relaxed")


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda l: l.profile_index("accent", "fr"), r"unknown accent 'fr' \(expected one of \['us', 'uk'\]\)"),
        (lambda l: l.profile_index("accent", 3), r"unknown accent 3"),
        (lambda l: l.profile_value("accent", "fr"), r"unknown accent 'fr'"),
        (lambda l: l.profile_index("age", "young"), r"unknown profile attribute 'age' \(known: \['accent'\]\)"),
    ],
    ids=["value", "non-string", "value-spelling", "attribute"],
)
def test_custom_label_sets_name_unknown_values_and_attributes(call, message):
    with pytest.raises(ValueError, match=message):
        call(CALM_LABELS)


def test_profile_value_of_unknown_attribute_is_a_value_error():
    with pytest.raises(ValueError, match=r"unknown profile attribute 'age'"):
        CALM_LABELS.profile_value("age", "young")


def test_label_sets_reject_a_fold_onto_a_non_class_and_no_emotions():
    with pytest.raises(ValueError, match=r"emotion_fold maps onto \['happy'\], which are not among the emotions \['calm', 'stressed'\]"):
        LabelSets(emotions=["calm", "stressed"], emotion_fold={"relaxed": "calm", "joyful": "happy"})
    with pytest.raises(ValueError, match="at least one emotion"):
        LabelSets(emotions=[])


# ====================================================================== real files
@pytest.fixture(scope="module")
def ed_corpus():
    return read_dataset(shared_data(ED_CONVERSATIONS))


def test_ed_conversations_give_one_example_per_listener_utterance(ed_corpus, ed_rows):
    assert ed_corpus.format == "ed-conversations"
    assert ed_corpus.conversations == 2770 and len(ed_corpus) == 5738 and not ed_corpus.skipped
    rows = {row["conv_id"]: row for row in ed_rows}
    per_conversation = Counter()
    for d in ed_corpus:
        conv_id, position = d.id.rsplit("/", 1)
        row, i = rows[conv_id], int(position)
        per_conversation[conv_id] += 1
        assert row["roles"][i] == "listener" and d.response == row["utterances"][i]
        assert [t.text for t in d.turns] == row["utterances"][:i]
        assert [t.role for t in d.turns] == row["roles"][:i]
        assert d.emotion == row["emotion"] and d.context == row["situation"]
    expected = {c: sum(r == "listener" for r in row["roles"][1:]) for c, row in rows.items()}
    assert per_conversation == +Counter(expected)


def test_ed_conversation_chain_names_all_four_steps(ed_corpus, ed_rows):
    first = ed_corpus[0]
    row = ed_rows[0]
    assert first.id == f"{row['conv_id']}/1" == "hit:3_conv:6/1"
    assert [t.text for t in first.turns] == row["utterances"][:1]
    # The situation told in the third person (the rules: tests/test_chain_targets.py).
    assert first.chain.event_scenario == "The speaker had a tire burst in the middle of a busy road."
    assert first.chain.speaker_emotion == row["emotion"] == "terrified"
    assert all(chain_is_complete(d.chain) for d in ed_corpus)


def test_ed_response_examples_match_the_conversations(ed_corpus):
    responses = read_dataset(shared_data(ED_RESPONSES))
    assert responses.format == "ed-responses" and len(responses) == 5738
    # one line per response; 2769 of the 2770 conversations have a listener turn
    assert responses.conversations == len({d.id.rsplit("/", 1)[0] for d in ed_corpus}) == 2769
    by_id = {d.id: d for d in ed_corpus}
    assert {d.id for d in responses} == set(by_id)
    for d in responses:
        twin = by_id[d.id]
        assert [t.text for t in d.turns] == [t.text for t in twin.turns]
        assert [t.role for t in d.turns] == [t.role for t in twin.turns]
        assert (d.response, d.emotion, d.chain.event_scenario) == (twin.response, twin.emotion, twin.chain.event_scenario)


def test_avamerg_test_excerpt_is_detected_and_has_no_responses():
    corpus = read_dataset(shared_data(AVAMERG_EXCERPT))
    assert corpus.format == "avamerg" and corpus.conversations == 1
    assert [d.id for d in corpus] == ["03998/0", "03998/1"]
    assert [len(d.turns) for d in corpus] == [1, 3]
    assert all(d.response is None and d.chain is None and d.emotion is None for d in corpus)
    assert all(d.listener_profile is None for d in corpus)


# ====================================================================== avatar JSONL
def test_avatar_jsonl_with_media_and_custom_labels(tmp_path):
    media = tmp_path / "media"
    write_wav(media / "s0.wav")
    copy_mp4(media / "s0.mp4")
    write_wav(media / "s2.wav", seconds=0.5, rate=22050)
    write_wav(media / "reply.wav")
    copy_mp4(media / "reply.mp4")
    first = avatar_record("ex-1")
    first["speaker"] = {"accent": "UK", "name": "Ann"}  # "name" is descriptive, not a label
    first["history"][0].update(audio="media/s0.wav", video="media/s0.mp4")
    first["history"][2].update(audio="media/s2.wav")
    first["response"].update(audio="media/reply.wav", video="media/reply.mp4")
    first["chain"] = {"event_scenario": "End of a long week.", "speaker_emotion": "relaxed"}
    second = avatar_record("ex-2")
    second["history"] = [{"role": "speaker", "audio": "media/s2.wav"}]  # a turn with audio only
    del second["emotion"], second["response"]
    second["chain"] = {"speaker_emotion": "stressed"}
    path = write_jsonl(tmp_path / "avatar.jsonl", [first, second])

    corpus = read_dataset(path, labels=CALM_LABELS)
    assert corpus.format == "avatar" and len(corpus) == 2 and not corpus.skipped
    d = corpus[0]
    assert d.id == "ex-1" and d.context == "A long week at work."
    assert [t.role for t in d.turns] == ["speaker", "listener", "speaker"]
    assert [t.text for t in d.turns] == [h["text"] for h in first["history"]]
    # media paths are relative to the file's folder
    assert [t.audio for t in d.turns] == [media / "s0.wav", None, media / "s2.wav"]
    assert [t.video for t in d.turns] == [media / "s0.mp4", None, None]
    assert d.response == "That sounds like exactly what you need."
    assert (d.response_audio, d.response_video) == (media / "reply.wav", media / "reply.mp4")
    assert d.missing_media == []
    assert d.emotion == "relaxed" and CALM_LABELS.emotion_index(d.emotion) == 0
    assert d.speaker_profile == {"accent": "UK", "name": "Ann"} and d.listener_profile == {"accent": "us"}
    assert d.turns[0].profile is d.speaker_profile and d.turns[1].profile is d.listener_profile
    assert (d.chain.event_scenario, d.chain.speaker_emotion, d.chain.emotion_cause) == ("End of a long week.", "relaxed", None)
    # no emotion field: the chain's speaker emotion is the label
    d2 = corpus[1]
    assert d2.turns[0].text == "" and d2.turns[0].audio == media / "s2.wav"
    assert d2.response is None and d2.emotion == "stressed" and CALM_LABELS.emotion_index(d2.emotion) == 1

    # media_root overrides the file's folder
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(media, elsewhere / "media")
    assert read_dataset(path, labels=CALM_LABELS, media_root=elsewhere)[0].turns[0].audio == elsewhere / "media" / "s0.wav"
    # the default (AvaMERG) label sets do not know "relaxed"
    check_bad_record(path, [("ex-1", "emotion")], r"unknown emotion 'relaxed'", kept=1)


# ====================================================================== bad input
# File-level problems: nothing in the file can be read, so skipping cannot help.
def test_malformed_json_list_names_the_line_and_column(tmp_path):
    intact = json.dumps(avamerg_conversation("00000"))
    path = tmp_path / "train.json"
    path.write_text(f'[{intact},\n {{"conversation_id": "00001", "turns": ]}}\n]')
    check_file_error(path, "^" + re.escape(f"{path}: invalid JSON at line 2, column 40: Expecting value"))


def broken_jsonl(tmp_path: Path) -> Path:
    lines = [json.dumps(ed_conversation(f"conv:{i}")) for i in range(4)]
    lines[2] = '{"conv_id": "conv:2", '
    path = tmp_path / "ed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_malformed_jsonl_line_names_the_line(tmp_path):
    path = broken_jsonl(tmp_path)
    with pytest.raises(DataError, match=where(path, "line 3") + "invalid JSON at column 23"):
        read_dataset(path)


def test_malformed_jsonl_line_is_skipped_on_request(tmp_path):
    corpus = read_dataset(broken_jsonl(tmp_path), on_error="skip")
    assert len(corpus) == 6
    assert [(s.record, s.field) for s in corpus.skipped.skipped] == [("line 3", None)]


@pytest.mark.parametrize("content", ["", "\n   \n\n"], ids=["zero-bytes", "blank-lines"])
def test_empty_file(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    check_file_error(path, "^" + re.escape(f"{path}: no records (the file is empty)"))


def test_empty_json_list(tmp_path):
    path = write_json(tmp_path / "train.json", [])
    check_file_error(path, "^" + re.escape(f"{path}: no records"))


def test_file_not_found_and_not_utf8(tmp_path):
    check_file_error(tmp_path / "nowhere.jsonl", "^" + re.escape(f"{tmp_path / 'nowhere.jsonl'}: file not found"))
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"conv_id": "caf\xe9"}\n')
    check_file_error(latin, "^" + re.escape(f"{latin}: not UTF-8 text"))


def test_undetectable_format(tmp_path):
    path = write_jsonl(tmp_path / "odd.jsonl", [{"text": "hi", "label": "sad"}, {"text": "yo", "label": "happy"}])
    message = "cannot tell the dataset format from the first record (keys ['label', 'text']); pass format="
    check_file_error(path, where(path, "line 1") + re.escape(message))
    with pytest.raises(ValueError, match="unknown dataset format 'csv'"):
        read_dataset(path, format="csv")


# Record-level problems: each test breaks the middle of three records. AvaMERG examples are
# turns, so a broken turn loses only itself; a broken conversation-level field loses every turn.
@pytest.mark.parametrize(
    "make, breakage, skipped, reason, kept",
    [
        (avamerg_file, setting("turns", 1, "dialogue_history", 2, "role", value="narrator"),
         [("00001/1", "turns[1].dialogue_history[2].role")], "unknown role 'narrator'", 5),
        (ed_conversations_file, setting("roles", 1, value="therapist"), [("line 2", "roles[1]")], "unknown role 'therapist'", 4),
        (avatar_file, setting("history", 0, "role", value="narrator"), [("a1", "history[0].role")], "unknown role 'narrator'", 2),
    ],
    ids=["avamerg", "ed", "avatar"],
)
def test_unknown_role(tmp_path, make, breakage, skipped, reason, kept):
    check_bad_record(make(tmp_path, breakage), skipped, reason, kept, labels=BUILDER_LABELS.get(make))


@pytest.mark.parametrize(
    "make, breakage, skipped, kept",
    [
        (avamerg_file, setting("turns", 0, "chain_of_empathy", "speaker_emotion", value="bananas"),
         [("00001/0", "turns[0].chain_of_empathy.speaker_emotion")], 5),
        # one ED conversation has one label for all its examples
        (ed_conversations_file, setting("emotion", value="bananas"), [("conv:1/1", "emotion"), ("conv:1/3", "emotion")], 4),
        (ed_responses_file, setting("emotion", value="bananas"), [("conv:1/3", "emotion")], 2),
        (avatar_file, setting("emotion", value="bananas"), [("a1", "emotion")], 2),
        (avatar_file, lambda r: (r.pop("emotion"), r.update(chain={"speaker_emotion": "bananas"})), [("a1", "chain.speaker_emotion")], 2),
    ],
    ids=["avamerg", "ed", "ed-responses", "avatar", "avatar-chain"],
)
def test_unknown_emotion_label(tmp_path, make, breakage, skipped, kept):
    check_bad_record(make(tmp_path, breakage), skipped, "unknown emotion 'bananas'", kept, labels=BUILDER_LABELS.get(make))


def test_unknown_profile_value(tmp_path):
    path = avamerg_file(tmp_path, setting("listener_profile", "age", value="ancient"))
    reason = re.escape("unknown age 'ancient' (expected one of ['child', 'young', 'middle-aged', 'elderly'])")
    # the profile belongs to the conversation: both of its turns are lost
    check_bad_record(path, [("00001/0", "listener_profile.age"), ("00001/1", "listener_profile.age")], reason, kept=4)


def test_profile_values_in_other_spellings_are_accepted(tmp_path):
    path = avamerg_file(tmp_path, setting("listener_profile", "age", value="Middle_Aged"))
    assert len(read_dataset(path)) == 6


def test_unknown_profile_value_in_avatar_file_names_its_field(tmp_path):
    path = avatar_file(tmp_path, setting("speaker", "accent", value="fr"))
    check_bad_record(path, [("a1", "speaker.accent")], "unknown accent 'fr'", 2, labels=CALM_LABELS)


@pytest.mark.parametrize(
    "make, breakage, skipped, reason, kept",
    [
        (avamerg_file, setting("turns", 1, "dialogue_history", value="oops"),
         [("00001/1", "turns[1].dialogue_history")], "should be list, got str", 5),
        (avamerg_file, setting("turns", 0, "dialogue_history", 0, "index", value="zero"),
         [("00001/0", "turns[0].dialogue_history[0].index")], "should be an integer, got 'zero'", 5),
        # a conversation-level field is reported once, for the whole conversation
        (avamerg_file, setting("speaker_profile", value="Ann"),
         [("00001", "speaker_profile")], "should be an object, got str", 4),
        (ed_conversations_file, setting("utterances", value="hello"), [("line 2", "utterances")], "should be list, got str", 4),
        (ed_conversations_file, setting("utterances", 2, value=7), [("line 2", "utterances[2]")], "should be a non-empty string", 4),
        (ed_conversations_file, setting("roles", value=["speaker"]), [("line 2", "roles")],
         re.escape("should be a list as long as 'utterances' (4)"), 4),
        (ed_responses_file, setting("context", value="hi"), [("line 2", "context")], "should be list, got str", 2),
        (avatar_file, setting("history", 0, "text", value=5), [("a1", "history[0].text")], "should be a string, got int", 2),
        (avatar_file, setting("speaker", value="Ann"), [("a1", "speaker")], "should be an object, got str", 2),
        (avatar_file, setting("history", 1, "audio", value=3), [("a1", "history[1].audio")], "should be a file path, got 3", 2),
        (avatar_file, setting("chain", value={"goal_to_response": ["x"]}), [("a1", "chain.goal_to_response")], "should be a string, got list", 2),
        (avatar_file, setting("chain", value={"mood": "calm"}), [("a1", "chain")], re.escape("unknown keys ['mood']"), 2),
    ],
    ids=[
        "avamerg-history", "avamerg-index", "avamerg-profile", "ed-utterances", "ed-utterance", "ed-roles",
        "ed-responses-context", "avatar-text", "avatar-profile", "avatar-media-path", "avatar-chain-value", "avatar-chain-key",
    ],
)
def test_wrong_field_type(tmp_path, make, breakage, skipped, reason, kept):
    check_bad_record(make(tmp_path, breakage), skipped, reason, kept, labels=BUILDER_LABELS.get(make))


@pytest.mark.parametrize("make, kept", [(ed_conversations_file, 4), (ed_responses_file, 2)], ids=["ed", "ed-responses"])
def test_non_string_situation(tmp_path, make, kept):
    check_bad_record(make(tmp_path, setting("situation", value=5)), [("line 2", "situation")], "should be", kept)


def test_avamerg_record_that_is_not_an_object(tmp_path):
    path = write_json(tmp_path / "train.json", [avamerg_conversation("00000"), 7, avamerg_conversation("00002")])
    check_bad_record(path, [("item 1", None)], "should be an object, got int", kept=4)


@pytest.mark.parametrize(
    "make, breakage, skipped, reason, kept",
    [
        (avamerg_file, removing("turns"), [("00001", "turns")], "missing or empty", 4),
        (avamerg_file, removing("turns", 1, "dialogue_history", 0, "utterance"),
         [("00001/1", "turns[1].dialogue_history[0].utterance")], "missing", 5),
        (avamerg_file, removing("turns", 0, "dialogue_history", 0, "role"), [("00001/0", "turns[0].dialogue_history[0].role")], "missing", 5),
        (ed_conversations_file, removing("emotion"), [("line 2", "emotion")], "missing", 4),
        (ed_conversations_file, removing("utterances"), [("line 2", "utterances")], "missing", 4),
        (ed_responses_file, removing("response"), [("line 2", "response")], "missing", 2),
        (ed_responses_file, setting("context", value=[]), [("line 2", "context")], "is empty", 2),
        (avatar_file, removing("id"), [("line 2", "id")], "missing or not a non-empty string", 2),
        (avatar_file, removing("history"), [("a1", "history")], "missing, empty or not a list", 2),
        (avatar_file, setting("response", "text", value=" "), [("a1", "response.text")], "missing or empty", 2),
        (avatar_file, setting("history", 2, "text", value=""), [("a1", "history[2]")], "a turn needs text, audio or video", 2),
    ],
    ids=[
        "avamerg-turns", "avamerg-utterance", "avamerg-role", "ed-emotion", "ed-utterances", "ed-responses-response",
        "ed-responses-context", "avatar-id", "avatar-history", "avatar-response-text", "avatar-turn-content",
    ],
)
def test_missing_required_field(tmp_path, make, breakage, skipped, reason, kept):
    check_bad_record(make(tmp_path, breakage), skipped, reason, kept, labels=BUILDER_LABELS.get(make))


def test_avamerg_empty_utterance(tmp_path):
    path = avamerg_file(tmp_path, setting("turns", 0, "dialogue_history", 0, "utterance", value=""))
    check_bad_record(path, [("00001/0", "turns[0].dialogue_history[0].utterance")], "", kept=5)


def avamerg_media(root: Path, cids) -> Path:
    """Real small media for every utterance (and gold response) of TRAIN_CONVERSATION copies."""
    for cid in cids:
        for index in range(4):  # utterances 0-2 and the response of the last turn
            avatar = "7" if index % 2 == 0 else "3"
            write_wav(root / f"dia{cid}utt{index}_{avatar}.wav", seconds=0.2)
            copy_mp4(root / f"dia{cid}utt{index}_{avatar}.mp4")
    return root


def test_missing_media_avamerg(tmp_path):
    path = write_json(tmp_path / "train.json", [avamerg_conversation("00000"), avamerg_conversation("00001")])
    root = avamerg_media(tmp_path / "media", ["00000", "00001"])
    complete = read_dataset(path, media_root=root)
    assert complete[0].turns[0].audio == root / "dia00000utt0_7.wav"
    assert (complete[0].response_audio, complete[0].response_video) == (root / "dia00000utt1_3.wav", root / "dia00000utt1_3.mp4")

    gone = root / "dia00001utt1_3.mp4"  # turn 0's gold response and an utterance of turn 1's history
    gone.unlink()
    skipped = [("00001/0", "turns[0].response (video)"), ("00001/1", "turns[1].dialogue_history[1] (video)")]
    check_bad_record(path, skipped, "video file not found", kept=2, file=gone, media_root=root)

    lenient = read_dataset(path, media_root=root, require_media=False)
    assert len(lenient) == 4 and not lenient.skipped
    by_id = {d.id: d for d in lenient}
    assert by_id["00001/0"].missing_media == [str(gone)] and by_id["00001/0"].response_video is None
    assert by_id["00001/1"].missing_media == [str(gone)] and by_id["00001/1"].turns[1].video is None
    assert by_id["00001/1"].turns[1].audio == root / "dia00001utt1_3.wav"
    assert by_id["00000/1"].missing_media == []


@pytest.mark.parametrize(
    "breakage, field, kind",
    [
        (setting("history", 0, "audio", value="media/gone.wav"), "history[0].audio", "audio"),
        (setting("response", "video", value="media/gone.wav"), "response.video", "video"),
    ],
    ids=["turn-audio", "response-video"],
)
def test_missing_media_avatar(tmp_path, breakage, field, kind):
    write_wav(tmp_path / "media" / "here.wav")

    def break_it(record):
        record["history"][1]["audio"] = "media/here.wav"
        breakage(record)

    path = avatar_file(tmp_path, break_it)
    gone = tmp_path / "media" / "gone.wav"
    check_bad_record(path, [("a1", field)], f"{kind} file not found", kept=2, file=gone, labels=CALM_LABELS)

    lenient = read_dataset(path, labels=CALM_LABELS, require_media=False)
    assert len(lenient) == 3 and not lenient.skipped
    d = lenient[1]
    assert d.id == "a1" and d.missing_media == [str(gone)]
    assert d.turns[0].audio is None and d.response_video is None
    assert d.turns[1].audio == tmp_path / "media" / "here.wav"
    assert all(other.missing_media == [] for other in (lenient[0], lenient[2]))
