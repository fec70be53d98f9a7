"""The four-step Chain-of-Empathy targets (empatheia.chain_targets), the parsing of a
generated chain in today's two-step and the paper's four-step form, and
``chain_complete_share``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from empatheia.chain_targets import (GOALS, complete_chain, emotion_cause, event_scenario, goal_acts, reply_acts,
                                     response_goal, third_person)
from empatheia.data import avamerg_dialogue, read_dataset
from empatheia.evaluation.scoring import score
from empatheia.evaluation.text import chain_complete_share
from empatheia.labels import ED_EMOTIONS
from empatheia.prompts import ChainOfEmpathy, chain_is_complete, chain_text, parse_chain

from .conftest import shared_data

ED = "ed/ed_valid_conversations.jsonl"


@pytest.fixture(scope="module")
def ed_examples():
    return {d.id: d for d in read_dataset(shared_data(ED))}


# ---------------------------------------------------------------------- targets on ED
def test_every_ed_target_names_four_steps_and_no_event_copies_the_speaker(ed_examples):
    dialogues = list(ed_examples.values())
    assert len(dialogues) == 5738 and all(chain_is_complete(d.chain) for d in dialogues)

    def norm(text):
        return " ".join(text.split()).lower()

    firsts = [norm(d.turns[0].text) for d in dialogues]
    events = [norm(d.chain.event_scenario) for d in dialogues]
    # Before, the event was ED's situation: 1003 of the 5738 equalled the first utterance.
    assert sum(norm(d.context) == f for d, f in zip(dialogues, firsts)) == 1003
    assert not any(e == f for e, f in zip(events, firsts))
    # Only events "The speaker mentions that <a sentence without I/my>" still hold it.
    containing = [e for e, f in zip(events, firsts) if f in e]
    assert len(containing) < 0.002 * len(dialogues)
    assert all(e.startswith("the speaker mentions that ") for e in containing)
    assert all(d.chain.event_scenario.startswith(("The speaker", "Their")) or "speaker" in d.chain.event_scenario
               for d in dialogues)


def test_a_verbatim_situation_becomes_a_short_third_person_event(ed_examples):
    first = ed_examples["hit:3_conv:6/1"]
    assert first.context.strip() == first.turns[0].text.strip()  # ED's situation is the speaker's sentence
    assert first.chain.event_scenario == "The speaker had a tire burst in the middle of a busy road."
    assert first.chain.emotion_cause == (
        "The speaker had a tire burst in the middle of a busy road, which made them feel terrified.")
    # The listener asked "Are you fine now?": the goal is what the reply does.
    assert first.chain.goal_to_response == "Asking how the speaker is feeling."


def test_a_reply_the_rules_do_not_read_gets_the_labels_goal(ed_examples):
    chain = ed_examples["hit:354_conv:709/1"].chain  # "My dog passed away of bone cancer."
    assert chain.speaker_emotion == "devastated"
    assert chain.event_scenario == "The speaker's dog passed away of bone cancer."
    assert "dog passed away" in chain.emotion_cause
    # "it takes a strong and compassionate person ...": no act the rules read, so the goal
    # is the label's.
    assert chain.goal_to_response == "Offering comfort and sympathy for the speaker's pain."


def test_the_goal_is_what_the_reply_does_and_the_cause_is_the_when_clause(ed_examples):
    chain = ed_examples["hit:2060_conv:4120/1"].chain  # "I was so glad when I graduated college."
    assert chain.speaker_emotion == "proud"
    assert chain.event_scenario == "The speaker was so glad when they graduated college."
    assert chain.emotion_cause == "The speaker graduated college."
    # "That's such a great accomplishment ... What was your major?"
    assert chain.goal_to_response == "Congratulating the speaker and asking them for details."


def test_a_question_in_the_speakers_last_turn_asks_for_an_answer(ed_examples):
    asked = ed_examples["hit:128_conv:256/3"]
    assert [t.text for t in asked.turns if t.role == "speaker"][-1] == "Do you play Madden often?"
    assert asked.chain.goal_to_response == "Answering the speaker's question while agreeing with them."  # "Yes, every day."
    # The same conversation's first example, before the question, only does what its reply does.
    before = ed_examples["hit:128_conv:256/1"]
    assert "?" not in [t.text for t in before.turns if t.role == "speaker"][-1]
    assert before.chain.goal_to_response == "Sharing a similar experience."  # "I love to play Madden."
    advice = ed_examples["hit:2283_conv:4567/1"]  # "... Should I tell him?" -> "Why did you wait a week? ..."
    assert advice.chain.goal_to_response == "Giving the speaker advice while asking why."


def test_ed_goals_vary_with_the_reply(ed_examples):
    dialogues = list(ed_examples.values())
    goals = {d.chain.goal_to_response for d in dialogues}
    # 5,738 examples: 252 distinct goals, the label's goal for the 1,222 (21 %) whose reply
    # the rules do not read; against 32 goals, each led or not, from the labels alone.
    assert len(goals) == 252
    assert sum(not reply_acts(d.response) for d in dialogues) == 1222
    # A goal names the speaker once: later acts say "them" / "their" / "they".
    assert not any(d.chain.goal_to_response.count("the speaker") > 1 for d in dialogues)
    # Each goal reads back as the acts it was built from (none for a label's goal): what the
    # bench checks a generated reply against.
    assert all(goal_acts(d.chain.goal_to_response) == reply_acts(d.response) for d in dialogues)


def test_reply_acts_read_what_the_reply_does():
    assert reply_acts("Oh no, what happened?") == ["Expressing sympathy", "Asking what happened"]
    assert reply_acts("Congratulations! What's next?") == ["Congratulating the speaker", "Asking what the speaker will do"]
    # The first two acts, in the reply's order.
    assert reply_acts("I'm so sorry. I hope you feel better soon. Don't worry.") == [
        "Expressing sympathy", "Wishing the speaker well"]
    assert reply_acts("what kind of con was it") == ["Asking the speaker for details"]  # no question mark typed
    assert reply_acts("Are you ok?!") == ["Asking how the speaker is feeling"]
    assert reply_acts("At least nobody got hurt.") == ["Pointing out the bright side"]
    assert reply_acts("Hello") == [] and reply_acts("") == []
    # A bare "Wow." reacts; only a "wow" with praise shares the speaker's enthusiasm.
    assert reply_acts("Wow. That must have been really bad.") == [
        "Reacting with surprise", "Showing understanding of how the speaker feels"]
    assert reply_acts("Oh wow!") == ["Reacting with surprise"]
    assert reply_acts("Wow, that's awesome.") == ["Sharing the speaker's enthusiasm"]
    assert response_goal("sad", "", "Oh no, what happened?") == "Expressing sympathy and asking what happened."
    assert response_goal("sad", "", "Hello") == response_goal("sad") == GOALS["sad"] + "."
    assert response_goal("proud", "Should I throw a party?", "Congratulations! Are you going to celebrate?") == (
        "Giving the speaker advice while congratulating them and asking what they will do.")
    assert response_goal("sad", "Why?", "I get it.") == (
        "Answering the speaker's question while showing understanding of how they feel.")
    # The bench's reading of a generated goal: each act, first or later with a pronoun, in
    # the goal's order; a label's goal names none.
    assert goal_acts("Answering the speaker's question while congratulating them and asking what they will do.") == [
        "Congratulating the speaker", "Asking what the speaker will do"]
    assert goal_acts("Giving the speaker advice while congratulating them and asking what they will do.") == [
        "Congratulating the speaker", "Asking what the speaker will do"]
    assert goal_acts("expressing sympathy.") == ["Expressing sympathy"]
    assert goal_acts(GOALS["sad"]) == [] and goal_acts("Ensuring the speaker feels heard.") == []
    assert goal_acts("Asking why and expressing sympathy.") == ["Asking why", "Expressing sympathy"]


def test_ed_responses_file_gets_the_same_chains(ed_examples):
    responses = read_dataset(shared_data("ed/ed_valid_response_examples.jsonl"))
    for d in responses.dialogues[:200]:
        assert d.chain == ed_examples[d.id].chain


# ---------------------------------------------------------------------- the rules
def test_third_person_agrees_the_verb_and_names_the_speaker_once():
    assert third_person("I feel like my mom hates me") == "The speaker feels like their mom hates them"
    assert third_person("i am so proud of myself") == "The speaker is so proud of themselves"
    assert third_person("My brother and I went to the beach") == "The speaker's brother and they went to the beach"
    assert third_person("I really miss my dog.") == "The speaker really misses their dog."
    assert third_person("We just moved and I am lonely") == "They just moved and the speaker is lonely"
    assert third_person("I\u2019m moving to the US") == "The speaker is moving to the US"


def test_event_without_first_person_is_framed_and_a_leading_clause_goes():
    assert event_scenario("the rain today is frustrating") == "The speaker mentions that the rain today is frustrating."
    assert event_scenario("When I got home, I found the door wide open.") == "The speaker found the door wide open."
    # A main clause that is only the feeling keeps the clause that says what happened.
    assert event_scenario("When my son was born, I was so happy.") == "When the speaker's son was born, they were so happy."
    # Fillers and questions are not the event; the speaker's first turn stands in for a
    # missing situation.
    assert event_scenario("So, my car broke down today.") == "The speaker's car broke down today."
    assert event_scenario("Have you ever lost a pet? Mine died.", "My cat died last week.") == (
        "The speaker's cat died last week.")
    long = event_scenario("I was walking through my hallway a few weeks ago and my son was hiding under the table "
                          "and grabbed my ankle")
    # 21 words: cut before the last "and" within the limit.
    assert long == "The speaker was walking through their hallway a few weeks ago and their son was hiding under the table."
    assert event_scenario(None) is None and event_scenario("   ") is None


def test_cause_from_causal_clauses_then_the_turns_then_the_event():
    assert emotion_cause("I was nervous because my exam is tomorrow.") == "The speaker's exam is tomorrow."
    assert emotion_cause("I am so excited about my trip to Spain!") == "The speaker's trip to Spain."
    assert emotion_cause("I am proud of myself for finishing the marathon.") == "Finishing the marathon."
    assert emotion_cause("My dog died.", ["It hurts so much because we grew up together."]) == "They grew up together."
    assert emotion_cause("My dog died.", [], "sad") == "The speaker's dog died, which made them feel sad."
    assert emotion_cause("My dog died.") == "The speaker's dog died."
    assert emotion_cause(None) is None


def test_goal_table_covers_every_ed_label_and_the_classes():
    assert set(ED_EMOTIONS) <= set(GOALS)
    assert response_goal("Terrified") == response_goal("terrified") == GOALS["terrified"] + "."
    # A label outside the table goes by its class of the fold; an unknown one gets the default.
    assert response_goal("overwhelmed") == GOALS["fear"] + "."
    assert response_goal("blorp") == response_goal(None) == "Showing understanding of how the speaker feels."
    assert response_goal("sad", "Can you believe it?") == (
        "Answering the speaker's question while comforting them and showing understanding of their sadness.")
    assert response_goal("sad", "What should I do?").startswith("Giving the speaker advice while comforting them")


# ---------------------------------------------------------------------- AvaMERG
def _avamerg(chain):
    return {
        "conversation_id": "00042",
        "turns": [{
            "turn_id": "0",
            "context": "I lost my job last week.",
            "dialogue_history": [{"index": 0, "role": "speaker", "utterance": "I lost my job last week. What now?"}],
            "response": "That is hard. What kind of work are you looking for?",
            "chain_of_empathy": chain,
        }],
    }


def test_an_avamerg_chain_with_four_steps_is_kept_as_it_is():
    given = {"event_scenario": "Job loss", "speaker_emotion": "devastated",
             "emotion_cause": "Losing a job unexpectedly", "goal_to_response": "Offering support"}
    chain = avamerg_dialogue(_avamerg(dict(given))).chain
    assert {k: getattr(chain, k) for k in given} == given


def test_an_avamerg_chain_missing_steps_is_completed_and_keeps_the_rest():
    chain = avamerg_dialogue(_avamerg({"event_scenario": "Job loss", "speaker_emotion": "devastated"})).chain
    assert (chain.event_scenario, chain.speaker_emotion) == ("Job loss", "devastated")
    assert chain.emotion_cause == "The speaker lost their job last week, which made them feel devastated."
    # The goal is what the record's reply does ("That is hard. What kind of work ...?").
    assert chain.goal_to_response == (
        "Answering the speaker's question while expressing sympathy and asking them for details.")
    # An emotion is never made up: without one, that step stays empty.
    bare = avamerg_dialogue(_avamerg({"event_scenario": "Job loss"})).chain
    assert bare.speaker_emotion is None and bare.emotion_cause == "The speaker lost their job last week."
    # Test-form turns have no chain, and get none.
    test_form = _avamerg(None)
    del test_form["turns"][0]["chain_of_empathy"]
    assert avamerg_dialogue(test_form).chain is None


def test_complete_chain_returns_a_complete_chain_unchanged():
    chain = ChainOfEmpathy("An event.", "sad", "A cause.", "A goal.")
    assert complete_chain(chain, "I lost my job.", ["I lost my job."]) is chain


# ---------------------------------------------------------------------- parsing
# What the two-step small weights shipped before wrote (greedy, examples/dialogues.json and ED).
SHIPPED = [
    "Firstly, the event scenario of this conversation is: I got the letter. I got into the nursing program!\n"
    "Secondly, the emotion of the speaker is: excited\n"
    "Finally, the response is: Congratulations! That's a great accomplishment!\n",
    "Firstly, the event scenario of this conversation is: I was surprised to find my son was in my leg.\n"
    "Secondly, the emotion of the speaker is surprised\n"
    "Finally, the response is: How did you feel?\n",
]
# The paper's Appendix D.1 target.
PAPER = (
    "Firstly, the event scenario of this conversation is: Paying off overdue rent and electricity bills amid "
    "financial struggles.\n"
    "Secondly, the emotion of the speaker is: content\n"
    "Thirdly, the emotion cause is: Relief from the burden of financial stress after successfully paying bills.\n"
    "Fourthly, the goal to response is: Providing support and validation for the speaker's sense of accomplishment.\n"
    "Finally, the response is: Sorry to hear that. Well, at least this will be a weight off your shoulders."
)


def test_parse_reads_todays_two_step_chain():
    chain, response = parse_chain(SHIPPED[0])
    assert chain.parsed and response == "Congratulations! That's a great accomplishment!"
    assert (chain.event_scenario, chain.speaker_emotion) == ("I got the letter. I got into the nursing program!", "excited")
    assert chain.emotion_cause is None and chain.goal_to_response is None and not chain_is_complete(chain)
    # Written back in the template it is the same text, token for token.
    assert chain_text(chain) + response == SHIPPED[0].strip()
    # A step label without its colon, as the shipped weights sometimes write it, is still a step.
    chain, response = parse_chain(SHIPPED[1])
    assert (chain.event_scenario, chain.speaker_emotion, response) == (
        "I was surprised to find my son was in my leg.", "surprised", "How did you feel?")


def test_parse_reads_the_four_step_chain_and_writes_it_back():
    chain, response = parse_chain(PAPER)
    assert chain.parsed and chain_is_complete(chain)
    assert chain.speaker_emotion == "content"
    assert chain.emotion_cause == "Relief from the burden of financial stress after successfully paying bills."
    assert chain.goal_to_response.startswith("Providing support and validation")
    assert response == "Sorry to hear that. Well, at least this will be a weight off your shoulders."
    assert chain_text(chain) + response == PAPER


def test_the_target_names_the_four_steps_in_the_papers_order(ed_examples):
    text = chain_text(ed_examples["hit:3_conv:6/1"].chain)
    labels = [line.split(":")[0] for line in text.split("\n")]
    assert labels == ["Firstly, the event scenario of this conversation is", "Secondly, the emotion of the speaker is",
                      "Thirdly, the emotion cause is", "Fourthly, the goal to response is", "Finally, the response is"]


# ---------------------------------------------------------------------- chain_complete_share
def test_chain_complete_share_on_hand_written_answers():
    empty_goal = PAPER.replace("Providing support and validation for the speaker's sense of accomplishment.", "")
    answers = [PAPER, SHIPPED[0], empty_goal, "Just a reply, no chain.", None,
               {"event_scenario": "e", "speaker_emotion": "sad", "emotion_cause": "c", "goal_to_response": "g"},
               ChainOfEmpathy("e", "sad", "c", None)]
    # complete: the paper's text and the full mapping -> 2 of 7
    assert chain_complete_share(answers) == pytest.approx(2 / 7)
    assert chain_complete_share([PAPER]) == 1.0 and chain_complete_share([]) is None


def test_eval_scores_chain_complete_share_from_the_predictions_chains():
    references = [{"id": f"r{i}", "response": "I am sorry.", "emotion": "sad"} for i in range(4)]
    full = {"event_scenario": "e", "speaker_emotion": "sad", "emotion_cause": "c", "goal_to_response": "g"}
    two = {"event_scenario": "e", "speaker_emotion": "sad", "emotion_cause": None, "goal_to_response": None}
    predictions = [{"id": f"r{i}", "text": "So sorry.", "emotion": "sad", "chain_of_empathy": chain}
                   for i, chain in enumerate([full, two, full, None])]
    metrics = score(predictions, references)
    assert metrics["chain_complete_share"] == 0.5
    # Predictions written before they carried the chain are scored without it.
    assert "chain_complete_share" not in score([{k: v for k, v in p.items() if k != "chain_of_empathy"}
                                                for p in predictions], references)
    assert json.loads(json.dumps(metrics))["chain_complete_share"] == 0.5


def test_the_bench_measures_generated_chains_beside_the_targets(tmp_path):
    conversations = [
        {"conv_id": "c1", "situation": "I lost my job last week.", "emotion": "sad",
         "utterances": ["I lost my job today.", "I am so sorry.", "Thanks, it hurts.", "Things will get better."]},
        {"conv_id": "c2", "situation": "I won a prize.", "emotion": "proud",
         "utterances": ["I won the science prize!", "Congratulations!"]},
    ]
    data = tmp_path / "ed.jsonl"
    data.write_text("".join(json.dumps(c) + "\n" for c in conversations))
    # One model copies the speaker's first turn into the event step, another summarises.
    copying = [{"id": "c1/1", "chain_of_empathy": {"event_scenario": "I lost my job today.", "speaker_emotion": "sad"}},
               {"id": "c2/1", "chain_of_empathy": {"event_scenario": "I won the science prize!"}}]
    summarising = [{"id": "c1/1", "chain_of_empathy": {
                        "event_scenario": "The speaker lost their job.", "speaker_emotion": "sad",
                        "emotion_cause": "Losing the job", "goal_to_response": "Comforting the speaker"}},
                   {"id": "c2/1", "text": "Congratulations!", "chain_of_empathy": {
                        "event_scenario": "The speaker won a prize.",
                        "goal_to_response": "Congratulating the speaker and asking what they will do."}}]
    files = []
    for name, rows in (("copying", copying), ("summarising", summarising)):
        (tmp_path / name).mkdir()
        files.append(tmp_path / name / "predictions.jsonl")
        files[-1].write_text("".join(json.dumps({"text": "I see.", "emotion": "sad", **r}) + "\n" for r in rows))
    result = subprocess.run([sys.executable, "bench/chain_targets.py", "--ed", str(data), "--examples", "0",
                             "--predictions", *map(str, files)],
                            cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("2 examples of 2 conversations")  # the answered ones: c1/3 has no prediction
    assert lines[1].split() == ["before", "after", "copying", "summarising"]
    rows = {line[:44].strip(): line[44:].split() for line in lines[2:]}
    assert rows["all four steps"][2:] == ["0.0%", "50.0%"]
    assert rows["event == first utterance"][2:] == ["100.0%", "0.0%"]
    # The targets' goals say what the replies do ("I am so sorry.", "Congratulations!"); the
    # summarising model's first goal is only a label's.
    assert rows["goal names a reply act"] == ["0.0%", "100.0%", "0.0%", "50.0%"]
    assert rows["distinct goals"] == ["0", "2", "0", "2"]
    # A reply must do every act its goal names: "Congratulations!" asks nothing. Without a
    # goal naming an act there is nothing to check.
    assert rows["reply does the goal's acts"] == ["-", "100.0%", "-", "0.0%"]
    # Variety: the copying model says "I see." to both, the summarising one differs.
    assert rows["distinct replies"] == ["2", "2", "1", "2"]
    assert rows["replies opening with the commonest 4 words"] == ["50.0%", "50.0%", "100.0%", "50.0%"]
    assert "commonest opening, copying: 'i see.'" in lines


def test_the_bench_tells_same_named_prediction_folders_apart(tmp_path):
    data = tmp_path / "ed.jsonl"
    data.write_text(json.dumps({"conv_id": "c1", "situation": "I won a prize.", "emotion": "proud",
                                "utterances": ["I won the science prize!", "Congratulations!"]}) + "\n")
    files = []
    for run in ("v7", "v8"):
        (tmp_path / run / "eval200").mkdir(parents=True)
        files.append(tmp_path / run / "eval200" / "predictions.jsonl")
        files[-1].write_text(json.dumps({"id": "c1/1", "text": "Wow.", "emotion": "happy", "chain_of_empathy": {
            "event_scenario": "The speaker won a prize.", "goal_to_response": f"Goal of {run}."}}) + "\n")
    result = subprocess.run([sys.executable, "bench/chain_targets.py", "--ed", str(data), "--examples", "0",
                             "--predictions", *map(str, files)],
                            cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    # Both runs keep a column: the folder names alone ("eval200") would give one.
    assert result.stdout.splitlines()[1].split() == ["before", "after", "v7/eval200", "v8/eval200"]
