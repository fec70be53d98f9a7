"""`empatheia eval`: scoring files, the report, and running the tiny preset over a dataset
(resumable), through the parsers of `empatheia.evaluation.cli.add_eval_parsers`."""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import List

import pytest

from empatheia.data.readers import read_dataset
from empatheia.errors import DataError
from empatheia.evaluation.cli import add_eval_parsers
from empatheia.evaluation.model_runs import recover_predictions
from empatheia.evaluation.records import references_from_dialogues
from empatheia.evaluation.report import bar_chart_svg, heatmap_svg
from empatheia.evaluation.scoring import ScoreOptions, score, score_files
from empatheia.evaluation.text import distinct_n
from empatheia.labels import LabelSets

SVG = "{http://www.w3.org/2000/svg}svg"

# Hand-checked example. Tokens (lower case, words and punctuation):
#   a "i am sorry ."   b "that is great !"   c "i am sorry ."   d "oh no ."
# unigrams 4+4+4+3 = 15, distinct {i, am, sorry, ., that, is, great, !, oh, no} = 10
# bigrams 3+3+3+2 = 11, distinct 3+3+2 = 8 (c repeats a)
# emotions (folded): sad/sad yes, happy(joyful)/happy yes, fear/angry(furious) no,
# fear(anxious)/fear(terrified) yes -> 3/4
PREDICTIONS = [
    {"id": "a", "text": "I am sorry.", "emotion": "sad", "chain_emotion": "devastated"},
    {"id": "b", "text": "That is great!", "emotion": "joyful", "chain_emotion": None},
    {"id": "c", "text": "I am sorry.", "emotion": "fear", "chain_emotion": "angry"},
    {"id": "d", "text": "Oh no.", "emotion": "anxious", "chain_emotion": "calm"},
]
REFERENCES = [
    {"id": "a", "response": "That is so sad.", "emotion": "sad", "age": "young", "gender": "female"},
    {"id": "b", "response": "Congratulations!", "emotion": "happy", "age": "Young", "gender": "male"},
    {"id": "c", "response": "Why is that?", "emotion": "furious", "age": "elderly", "gender": "male"},
    {"id": "d", "response": "Stay calm.", "emotion": "terrified"},
]

ED_CONVERSATIONS = [
    {"conv_id": "c1", "situation": "I lost my job.", "emotion": "sad",
     "utterances": ["I lost my job today", "I am so sorry", "Thanks, it hurts", "Things will get better"]},
    {"conv_id": "c2", "situation": "I won a prize.", "emotion": "proud",
     "utterances": ["I won the science prize", "Congratulations"]},
    {"conv_id": "c3", "situation": "A spider.", "emotion": "terrified",
     "utterances": ["There is a huge spider", "Oh no, stay calm", "It is moving", "Call someone to help"]},
]
ED_IDS = ["c1/1", "c1/3", "c2/1", "c3/1", "c3/3"]


def run_cli(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="empatheia")
    add_eval_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.run(args)


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def read_jsonl(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def pair(tmp_path):
    return write_jsonl(tmp_path / "pred.jsonl", PREDICTIONS), write_jsonl(tmp_path / "ref.jsonl", REFERENCES)


# ---------------------------------------------------------------------- scoring files
def test_score_files_end_to_end(tmp_path, pair, capsys):
    predictions, references = pair
    out = tmp_path / "out"
    assert run_cli(["eval", "--predictions", str(predictions), "--references", str(references), "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["count"] == 4
    assert metrics["emotion_accuracy"] == pytest.approx(0.75)
    assert metrics["dist_1"] == pytest.approx(10 / 15)
    assert metrics["dist_2"] == pytest.approx(8 / 11)
    # chain emotions: devastated->sad yes, null no, angry vs angry yes, calm->happy vs fear no
    assert metrics["chain_emotion_accuracy"] == pytest.approx(0.5)
    emotion = metrics["emotion"]
    rows, columns = emotion["confusion_rows"], emotion["confusion_columns"]
    assert rows[:7] == ["sad", "happy", "angry", "fear", "surprised", "contempt", "disgusted"]
    assert emotion["confusion"][rows.index("angry")][columns.index("fear")] == 1
    assert emotion["confusion"][rows.index("fear")][columns.index("fear")] == 1
    assert sum(map(sum, emotion["confusion"])) == 4
    assert emotion["per_class"]["angry"]["accuracy"] == 0.0 and emotion["per_class"]["sad"]["accuracy"] == 1.0
    # Speaker age/gender in the label sets' spelling and order; "d" has none and is left out.
    assert emotion["by_group"]["age"] == {
        "young": {"accuracy": 1.0, "correct": 2, "n": 2}, "elderly": {"accuracy": 0.0, "correct": 0, "n": 1}}
    assert list(emotion["by_group"]["gender"]) == ["male", "female"]
    assert emotion["by_group"]["gender"]["male"] == {"accuracy": 0.5, "correct": 1, "n": 2}
    assert metrics["missing"] == {"without_reference": [], "without_prediction": []}
    printed = json.loads(capsys.readouterr().out)
    assert printed["emotion_accuracy"] == pytest.approx(0.75)

    # The report: Markdown linking the SVG files beside it, HTML embedding them inline.
    svgs = ["confusion_matrix.svg", "per_emotion_accuracy.svg", "accuracy_by_age.svg", "accuracy_by_gender.svg"]
    for name in svgs:
        assert ET.parse(out / name).getroot().tag == SVG
    markdown = (out / "report.md").read_text()
    for name in svgs:
        assert f"]({name})" in markdown
    assert "| Emotion accuracy (Acc) | 0.7500 (75.00%) |" in markdown
    html = (out / "report.html").read_text()
    assert html.count("<svg") == 4 and "<!DOCTYPE html>" in html


def test_no_group_plots_without_profiles(tmp_path):
    references = [{k: v for k, v in r.items() if k not in ("age", "gender")} for r in REFERENCES]
    out = tmp_path / "out"
    run_cli(["eval", "--predictions", str(write_jsonl(tmp_path / "p.jsonl", PREDICTIONS)),
             "--references", str(write_jsonl(tmp_path / "r.jsonl", references)), "--out", str(out)])
    assert json.loads((out / "metrics.json").read_text())["emotion"]["by_group"] == {}
    assert not list(out.glob("accuracy_by_*.svg")) and (out / "confusion_matrix.svg").is_file()


def test_records_given_directly_score_the_hand_values():
    """score() on records, without files, gives the same hand-checked numbers."""
    metrics = score(PREDICTIONS, REFERENCES)
    assert metrics["emotion_accuracy"] == pytest.approx(0.75)
    assert metrics["dist_1"] == pytest.approx(10 / 15) and metrics["dist_2"] == pytest.approx(8 / 11)
    assert metrics["emotion"]["by_group"]["age"]["young"] == {"accuracy": 1.0, "correct": 2, "n": 2}
    assert distinct_n(["hi"], 2) == 0.0 and distinct_n(["a b a b"], 1) == 0.5


def test_missing_ids_are_an_error_unless_allowed(tmp_path, capsys):
    predictions = write_jsonl(tmp_path / "p.jsonl", PREDICTIONS[:3] + [{"id": "zz", "text": "Hello.", "emotion": "sad"}])
    references = write_jsonl(tmp_path / "r.jsonl", REFERENCES)
    argv = ["eval", "--predictions", str(predictions), "--references", str(references), "--out", str(tmp_path / "o")]
    with pytest.raises(SystemExit) as error:
        run_cli(argv)
    message = str(error.value)
    assert "1 prediction id(s) not in" in message and "'zz'" in message
    assert "1 reference id(s)" in message and "'d'" in message and "--allow-missing" in message
    assert not (tmp_path / "o" / "metrics.json").exists()

    assert run_cli(argv + ["--allow-missing"]) == 0
    metrics = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert metrics["count"] == 3
    assert metrics["missing"] == {"without_reference": ["zz"], "without_prediction": ["d"]}
    assert "Ids left out" in (tmp_path / "o" / "report.md").read_text()
    assert "left out: 1 prediction(s) without reference" in capsys.readouterr().err


@pytest.mark.parametrize(
    "lines, message",
    [
        (['{"id": "a", "text": "x", "emotion": "sad"}', '{"id": "b", "emotion": "sad"}'],
         r"pred.jsonl, record line 2, field 'text': missing"),
        (['{"id": "a", "text": "x", "emotion": "sad"}', "{not json"], r"pred.jsonl, record line 2: invalid JSON"),
        (['{"id": "a", "text": 3, "emotion": "sad"}'], r"record line 1, field 'text': should be a string, got an integer"),
        (['{"id": "a", "text": "x", "emotion": null}'], r"record line 1, field 'emotion': is null"),
        (['{"id": "a", "text": "x", "emotion": "sad"}', "", '{"id": "a", "text": "y", "emotion": "sad"}'],
         r"record line 3, field 'id': duplicate id 'a' \(first at line 1\)"),
        (['["a", "x"]'], r"record line 1: should be a JSON object"),
        (['{"id": "a", "text": "x", "emotion": "sad", "speech_style": [0.5, "x"]}'],
         r"record line 1, field 'speech_style\[1\]': should be a finite number, got 'x'"),
        (['{"id": "a", "text": "x", "emotion": "sad"}', '{"id": "b", "text": "x", "emotion": "sad", "video_style_realised": 3}'],
         r"pred.jsonl, record line 2, field 'video_style_realised': should be a list, got an integer"),
        (['{"id": "a", "text": "x", "emotion": "sad", "video_style": [1, true]}'],
         r"record line 1, field 'video_style\[1\]': should be a finite number, got True"),
        (['{"id": "a", "text": "x", "emotion": "sad", "speech_style_realised": [NaN]}'],
         r"record line 1, field 'speech_style_realised\[0\]': should be a finite number, got nan"),
        (['{"id": "a", "text": "x", "emotion": "sad", "speech_style": []}'],
         r"record line 1, field 'speech_style': is empty"),
        ([], r"pred.jsonl: no predictions \(the file is empty\)"),
    ],
)
def test_bad_predictions_name_file_line_and_field(tmp_path, lines, message):
    predictions = tmp_path / "pred.jsonl"
    predictions.write_text("".join(line + "\n" for line in lines))
    references = write_jsonl(tmp_path / "ref.jsonl", REFERENCES)
    with pytest.raises(SystemExit, match=message):
        run_cli(["eval", "--predictions", str(predictions), "--references", str(references), "--out", str(tmp_path / "o")])


def test_bad_references_and_bad_option_mixes(tmp_path, pair):
    predictions, _ = pair
    references = tmp_path / "ref.jsonl"
    references.write_text('{"id": "a", "response": "x", "emotion": "sad", "age": 7}\n')
    with pytest.raises(SystemExit, match=r"ref.jsonl, record line 1, field 'age': should be a string"):
        run_cli(["eval", "--predictions", str(predictions), "--references", str(references), "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="needs both --predictions and --references"):
        run_cli(["eval", "--predictions", str(predictions), "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="not both"):
        run_cli(["eval", "--predictions", str(predictions), "--references", str(references), "--preset", "tiny",
                 "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="--data FILE"):
        run_cli(["eval", "--preset", "tiny", "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="ref.jsonl: file not found"):
        run_cli(["eval", "--predictions", str(predictions), "--references", str(tmp_path / "nope" / "ref.jsonl"),
                 "--out", str(tmp_path / "o")])


def test_svgs_escape_labels():
    svg = heatmap_svg([[1, 0], [2, 3]], ["<a&b>", "c"], ["<a&b>", "c"], 'title "x" & <y>')
    root = ET.fromstring(svg)
    assert root.tag == SVG
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "<a&b>" in texts and "3" in texts
    bars = ET.fromstring(bar_chart_svg([("x<y", 0.5, 2), ("none", None, 0)], "t"))
    texts = [t.text for t in bars.iter("{http://www.w3.org/2000/svg}text")]
    assert "x<y" in texts and "50.0%" in texts and "n/a" in texts


# ---------------------------------------------------------------------- running a model
def test_checkpoint_run_resumes_without_predicting_twice(tmp_path, capsys):
    data = write_jsonl(tmp_path / "ed.jsonl", ED_CONVERSATIONS)
    out = tmp_path / "run"
    base = ["eval", "--preset", "tiny", "--data", str(data), "--out", str(out), "--max-new-tokens", "4",
            "--batch-size", "2", "--no-progress"]

    assert run_cli(base + ["--limit", "2"]) == 0  # "interrupted" after two examples
    first = read_jsonl(out / "predictions.jsonl")
    assert [p["id"] for p in first] == ED_IDS[:2]
    assert json.loads((out / "metrics.json").read_text())["count"] == 2

    assert run_cli(base) == 0  # resumes: only the three others are answered
    predictions = read_jsonl(out / "predictions.jsonl")
    ids = [p["id"] for p in predictions]
    assert ids == ED_IDS and len(set(ids)) == len(ids)
    assert predictions[:2] == first
    assert "5 example(s): 2 predicted by an earlier run, 3 now" in capsys.readouterr().err
    for p in predictions:
        assert isinstance(p["text"], str) and p["emotion"] in LabelSets().emotions
        assert set(p) == {"id", "text", "emotion", "chain_emotion", "chain_of_empathy", "emotion_probabilities", "profile",
                          "profile_probabilities", "seconds"}
        assert set(p["profile"]) == set(LabelSets().profile) == set(p["profile_probabilities"])
        assert p["seconds"] >= 0

    references = read_jsonl(out / "references.jsonl")
    assert [r["id"] for r in references] == ED_IDS
    assert references[2] == {"id": "c2/1", "response": "Congratulations", "emotion": "happy", "emotion_label": "proud",
                             "history": ["I won the science prize"], "history_roles": ["speaker"], "age": None,
                             "gender": None}
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["count"] == 5 and metrics["run"]["resumed"] == 2 and metrics["run"]["generated"] == 3
    gold = [r["emotion"] for r in references]
    expected = sum(p["emotion"] == g for p, g in zip(predictions, gold)) / 5
    assert metrics["emotion_accuracy"] == pytest.approx(expected)
    assert 0.0 <= metrics["dist_1"] <= 1.0 and 0.0 <= metrics["dist_2"] <= 1.0
    assert (out / "report.html").is_file() and ET.parse(out / "confusion_matrix.svg").getroot().tag == SVG

    # A rerun has nothing left to do; other settings are refused rather than mixed in.
    assert run_cli(base) == 0
    assert [p["id"] for p in read_jsonl(out / "predictions.jsonl")] == ED_IDS
    with pytest.raises(SystemExit, match=r"holds predictions of another run \(max_new_tokens: was 4, now 5\)"):
        run_cli([a if a != "4" else "5" for a in base])
    # A smaller selection scores only itself and says how many others the file holds.
    assert run_cli(base + ["--limit", "1"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["count"] == 1 and metrics["sources"]["predictions_outside_selection"] == 4


def test_recover_predictions_drops_a_line_cut_by_a_kill(tmp_path):
    path = tmp_path / "predictions.jsonl"
    assert recover_predictions(path) == []
    good = '{"id": "a", "text": "x", "emotion": "sad"}\n'
    path.write_text(good + '{"id": "b", "te')
    assert [p["id"] for p in recover_predictions(path)] == ["a"]
    assert path.read_text() == good
    path.write_text(good + "{broken}\n" + good.replace('"a"', '"c"'))
    with pytest.raises(ValueError, match=r"predictions.jsonl, record line 2: invalid JSON"):
        recover_predictions(path)


def test_references_carry_the_speakers_age_and_gender(tmp_path):
    """Figure 6 breaks accuracy down by the user, i.e. AvaMERG's speaker (not the avatar)."""
    record = {
        "id": "demo/1",
        "speaker": {"age": "Middle aged", "gender": "female"},
        "listener": {"age": "elderly", "gender": "male", "timbre": "low"},
        "history": [{"role": "speaker", "text": "My cat ran away."}],
        "response": {"text": "I hope she comes back soon."},
        "emotion": "worried",
    }
    data = write_jsonl(tmp_path / "avatar.jsonl", [record])
    labels = LabelSets()
    (reference,) = references_from_dialogues(read_dataset(data, labels=labels).dialogues, labels)
    assert reference == {"id": "demo/1", "response": "I hope she comes back soon.", "emotion": "fear",
                         "emotion_label": "worried", "history": ["My cat ran away."], "history_roles": ["speaker"],
                         "age": "middle-aged", "gender": "female",
                         # The avatar's: what the profile predictions are scored against.
                         "listener_profile": {"age": "elderly", "gender": "male", "timbre": "low"}}


def test_references_name_the_gold_response_clip(tmp_path):
    """An example whose gold response has a talking head gives its reference a ``video``
    (absolute, so the references file can be written anywhere); others have none."""
    (tmp_path / "clips").mkdir()
    (tmp_path / "clips" / "gold.mp4").write_bytes(b"")  # the reader only checks that it exists
    with_clip = {"id": "v/1", "history": [{"role": "speaker", "text": "I passed!"}],
                 "response": {"text": "Well done!", "video": "clips/gold.mp4"}, "emotion": "proud"}
    without = {"id": "v/2", "history": [{"role": "speaker", "text": "I failed."}], "response": {"text": "Oh no."},
               "emotion": "sad"}
    data = write_jsonl(tmp_path / "avatar.jsonl", [with_clip, without])
    labels = LabelSets()
    first, second = references_from_dialogues(read_dataset(data, labels=labels).dialogues, labels)
    assert first["video"] == str((tmp_path / "clips" / "gold.mp4").resolve()) and "video" not in second
    # Such a reference line validates; a non-string video does not.
    score([{"id": "v/1", "text": "Great.", "emotion": "happy"}], [first])
    with pytest.raises(ValueError, match=r"record line 1, field 'video': should be a string"):
        score([{"id": "v/1", "text": "Great.", "emotion": "happy"}], [dict(first, video=3)])


def test_run_model_refuses_examples_without_gold(tmp_path):
    conversation = dict(ED_CONVERSATIONS[1], utterances=["Only the speaker talks"])
    data = write_jsonl(tmp_path / "ed.jsonl", [conversation])
    with pytest.raises(SystemExit, match="no examples to evaluate"):
        run_cli(["eval", "--preset", "tiny", "--data", str(data), "--out", str(tmp_path / "o"), "--no-progress"])


def test_polarity_needs_the_dialogue_history(tmp_path, pair):
    pytest.importorskip("vaderSentiment")
    predictions, references = pair
    with pytest.raises(SystemExit, match=r"ref.jsonl, field 'history': the polarity metrics need .* 4 lack it"):
        run_cli(["eval", "--predictions", str(predictions), "--references", str(references), "--out", str(tmp_path / "o"),
                 "--polarity"])
    with_history = write_jsonl(tmp_path / "h.jsonl", [dict(r, history=["I have news."]) for r in REFERENCES])
    assert run_cli(["eval", "--predictions", str(predictions), "--references", str(with_history),
                    "--out", str(tmp_path / "o"), "--polarity"]) == 0
    polarity = json.loads((tmp_path / "o" / "metrics.json").read_text())["polarity"]
    assert set(polarity) == {"emotion", "sentiment", "empathy"}
    assert polarity["empathy"] == pytest.approx((polarity["emotion"] + polarity["sentiment"]) / 2)


def test_references_raw_labels_score_under_another_label_set():
    """With ``emotion_label`` the gold class follows the label sets in use: the same
    references give 7-class accuracy by default and ED's 32 labels with ed32.yaml."""
    ed32 = LabelSets.from_yaml(Path(__file__).resolve().parents[1] / "configs" / "labels" / "ed32.yaml")
    assert len(ed32.emotions) == 32
    references = [
        {"id": "a", "response": "Well done!", "emotion": "happy", "emotion_label": "proud"},
        {"id": "b", "response": "Oh no.", "emotion": "sad", "emotion_label": "lonely"},
        {"id": "c", "response": "Yikes.", "emotion": "fear"},  # no raw label: its emotion counts
    ]
    predictions = [
        {"id": "a", "text": "Great job", "emotion": "happy", "chain_emotion": "grateful"},  # right class, wrong label
        {"id": "b", "text": "I am sorry", "emotion": "sad", "chain_emotion": "lonely"},
        {"id": "c", "text": "Scary", "emotion": "fear", "chain_emotion": "fear"},
    ]
    seven = score(predictions, references)
    assert seven["emotion_accuracy"] == 1.0 and seven["chain_emotion_accuracy"] == 1.0
    # c's "fear" is no ED label: an error naming it, or left out and counted when asked.
    with pytest.raises(DataError, match="record id 'c', field 'emotion'"):
        score(predictions, references, ScoreOptions(labels=ed32))
    fine = score(predictions, references, ScoreOptions(labels=ed32, unknown_gold="skip"))
    # a: proud vs grateful (wrong); b: lonely (right).
    assert fine["chain_emotion_accuracy"] == pytest.approx(1 / 2) and fine["skipped_unknown_gold"] == 1


def test_answers_that_repeat_the_listeners_earlier_words_are_counted_and_bad_roles_named(tmp_path):
    predictions = [{"id": "a", "text": "I'm so sorry. How are you holding up?", "emotion": "sad"},
                   {"id": "b", "text": "How are you doing now?", "emotion": "sad"},
                   {"id": "c", "text": "How are you holding up?", "emotion": "sad"}]
    history = ["I lost my job.", "That's awful. How are you holding up?", "Not great."]
    references = [{"id": "a", "response": "x", "emotion": "sad", "history": history,
                   "history_roles": ["speaker", "listener", "speaker"]},
                  {"id": "b", "response": "x", "emotion": "sad", "history": history,
                   "history_roles": ["speaker", "listener", "speaker"]},
                  # The speaker said it: no echo of the listener, and no listener turn to count.
                  {"id": "c", "response": "x", "emotion": "sad", "history": ["How are you holding up?"],
                   "history_roles": ["speaker"]}]
    metrics = score(predictions, references)
    assert (metrics["listener_echo_count"], metrics["listener_echo_answers"]) == (1, 2)
    assert metrics["listener_echo_share"] == 0.5
    assert "listener_echo_share" not in score(predictions, [{k: v for k, v in r.items() if k != "history_roles"}
                                                            for r in references])
    bad = write_jsonl(tmp_path / "ref.jsonl", [dict(references[0], history_roles=["speaker"])])
    with pytest.raises(DataError, match=r"ref.jsonl.*line 1.*history_roles.*1 roles for 3 history turns"):
        score_files(write_jsonl(tmp_path / "pred.jsonl", predictions[:1]), bad)
