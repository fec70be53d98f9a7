"""The chain's goal chosen among the goals that fit its emotion: the acts fitted from what
listeners did (``fit_goal_acts``, ``empatheia data goal-acts``), the goals the rules write
from them (``goal_repertoire``), the processor that keeps decoding on them
(``ChainGoalChoice``) and its wiring (``language_model.choose_chain_goal``)."""

import json
from pathlib import Path

import pytest
import torch

from empatheia import Empatheia
from empatheia.chain_targets import (ADVICE_GOAL, GOAL_LEADS, QUESTION_GOAL, act_key, fit_act_openings, fit_goal_acts,
                                     fit_goal_counts, fitting_acts, goal_lead, goal_repertoire, load_act_openings,
                                     load_goal_acts, load_goal_counts, response_goal, save_goal_acts)
from empatheia.cli import main
from empatheia.config import EmpatheiaConfig
from empatheia.data.distill import distill_examples
from empatheia.logits_processors import ChainGoalChoice, emotion_step_tokens, goal_step_tokens
from empatheia.prompts import PromptMode

SHARED = Path(__file__).resolve().parents[2] / "shared"
SYMPATHY, DETAILS, CONGRATS = "Expressing sympathy", "Asking the speaker for details", "Congratulating the speaker"


def test_acts_fit_an_emotion_when_enough_of_its_listeners_do_them():
    replies = ([("devastated", "I'm so sorry.")] * 6 + [("devastated", "Congratulations!")]
               + [("devastated", "What was she like?")] * 3
               + [("proud", "Congratulations! Did you celebrate?")] * 4 + [("proud", None), (None, "Sorry.")])
    table = fit_goal_acts(replies, min_share=0.2, min_count=3)
    # One congratulation in ten replies to grief is under the share; the class (sad)
    # pools its labels' replies.
    assert table["devastated"] == [SYMPATHY, DETAILS]
    assert table["proud"] == [CONGRATS, DETAILS] == table["happy"]
    assert table["sad"] == table["devastated"]
    assert fitting_acts(table, "Devastated") == table["devastated"]
    assert fitting_acts(table, "lonely") == table["sad"]  # a label the data lacks: its class
    assert fitting_acts(table, "bewildered") == [] == fitting_acts(table, None)
    # "sad" is a label and a class: the label keeps its own listeners' acts.
    both = fit_goal_acts(replies + [("sad", "That's so sad.")] * 3, min_share=0.2, min_count=3)
    assert both["sad"] == [SYMPATHY] and both["devastated"] == table["devastated"]
    with pytest.raises(ValueError, match="min_share"):
        fit_goal_acts(replies, min_share=0)


def test_the_repertoire_is_what_the_rules_write_from_those_acts():
    goals = goal_repertoire([SYMPATHY, DETAILS], "devastated")
    assert goals[:3] == ["Expressing sympathy.", "Asking the speaker for details.",
                         "Expressing sympathy and asking them for details."]
    assert "Offering comfort and sympathy for the speaker's pain." in goals  # the label's own goal
    assert "Answering the speaker's question while expressing sympathy." in goals
    assert len(goals) == len(set(goals)) == 3 * 5  # 2 acts, 2 ordered pairs, the label's goal; 3 leads
    # Each goal is one response_goal writes for a reply doing those acts.
    assert response_goal("devastated", "Why me?", "I'm so sorry. Were you close?") in goals
    assert goal_repertoire([DETAILS], "sad", leads=[ADVICE_GOAL]) == [
        "Giving the speaker advice while asking them for details.",
        "Giving the speaker advice while comforting them and showing understanding of their sadness."]
    assert goal_lead("Should I call her?") == ADVICE_GOAL and goal_lead("Why?") == QUESTION_GOAL
    assert goal_lead("She left.") is None and GOAL_LEADS[0] is None
    with pytest.raises(ValueError, match="'Hugging the speaker'"):
        goal_repertoire(["Hugging the speaker"])


def test_a_goal_acts_file_round_trips_and_a_bad_one_is_named(tmp_path):
    path = tmp_path / "acts.json"
    save_goal_acts({"Sad": [SYMPATHY]}, path, min_share=0.04)
    assert load_goal_acts(path) == {"sad": [SYMPATHY]}
    assert json.loads(path.read_text())["min_share"] == 0.04
    path.write_text(json.dumps({"format": "empatheia-goal-acts", "acts": {"sad": ["Hugging"]}}))
    with pytest.raises(ValueError, match=r"acts.json: field 'acts.sad' must list acts of reply_acts"):
        load_goal_acts(path)
    path.write_text(json.dumps({"acts": {}}))
    with pytest.raises(ValueError, match=r"acts.json: field 'format'"):
        load_goal_acts(path)
    with pytest.raises(ValueError, match="not a goal-acts file"):
        load_goal_acts(tmp_path / "missing.json")


def _choice(row_leads=None):
    # Emotion lead-in [1], labels "sad" (first token 10) and "proud" (20); goal lead-in [2];
    # goals: 30 31 9 / 30 32 9 fit sad, 40 9 fits proud, 30 9 (another lead) fits both.
    spellings = [[30, 31, 9], [30, 32, 9], [40, 9], [30, 9]]
    allowed = torch.tensor([[True, True, False, True], [False, False, True, True]])
    leads = (torch.tensor([0, 0, 0, 1]), row_leads) if row_leads is not None else (None, None)
    return ChainGoalChoice([2], spellings, allowed, [1], [10, 20], *leads)


def test_the_goal_goes_on_only_along_goals_that_fit_the_rows_emotion():
    choice = _choice()
    # sad, proud, and an emotion that is no label (any goal), each just after the lead-in.
    rows = torch.tensor([[1, 10, 9, 2], [1, 20, 9, 2], [1, 5, 9, 2]])
    kept = choice(rows, torch.zeros(3, 50))
    assert [set(torch.nonzero(torch.isfinite(r)).flatten().tolist()) for r in kept] == [{30}, {40, 30}, {30, 40}]
    rows = torch.tensor([[1, 10, 9, 2, 30], [1, 20, 9, 2, 40], [1, 10, 9, 2, 31], [1, 10, 9, 0, 0]])
    scores = torch.arange(50, dtype=torch.float).repeat(4, 1)
    kept = choice(rows, scores.clone())
    assert set(torch.nonzero(torch.isfinite(kept[0])).flatten().tolist()) == {31, 32, 9}
    assert set(torch.nonzero(torch.isfinite(kept[1])).flatten().tolist()) == {9}
    assert torch.equal(kept[2], scores[2]) and torch.equal(kept[3], scores[3])  # off the goals, before the step
    assert kept[0, 32] == scores[0, 32]  # the model's own scores choose among the goals
    finished = torch.tensor([[1, 10, 9, 2, 30, 31, 9]])
    assert torch.equal(choice(finished, torch.ones(1, 50)), torch.ones(1, 50))  # after the line break: free


def test_the_goal_opens_as_the_dialogue_asks_and_never_ends_in_a_blocked_word():
    choice = _choice(row_leads=torch.tensor([1, 0]))
    rows = torch.tensor([[1, 10, 9, 2], [1, 10, 9, 2]])
    kept = choice(rows, torch.zeros(2, 50))
    assert torch.nonzero(torch.isfinite(kept[0])).flatten().tolist() == [30]  # only the goal of lead 1
    assert torch.nonzero(torch.isfinite(kept[1])).flatten().tolist() == [30]
    after = choice(torch.tensor([[1, 10, 9, 2, 30], [1, 10, 9, 2, 30]]), torch.zeros(2, 50))
    assert torch.nonzero(torch.isfinite(after[0])).flatten().tolist() == [9]
    assert torch.nonzero(torch.isfinite(after[1])).flatten().tolist() == [31, 32]
    # A block before the choice masked every continuation: the goal still goes on.
    blocked = torch.full((2, 50), float("-inf"))
    stuck = choice(torch.tensor([[1, 10, 9, 2, 30], [1, 10, 9, 2, 30]]), blocked)
    assert torch.nonzero(torch.isfinite(stuck[1])).flatten().tolist() == [31, 32]
    with pytest.raises(ValueError, match=r"allowed must be \(2, 4\)"):
        ChainGoalChoice([2], [[30, 9]] * 4, torch.ones(3, 4, dtype=torch.bool), [1], [10, 20])
    with pytest.raises(ValueError, match="go together"):
        ChainGoalChoice([2], [[30, 9]] * 4, torch.ones(2, 4, dtype=torch.bool), [1], [10, 20], torch.zeros(4))
    with pytest.raises(ValueError, match=r"row_leads must be \(3,\)"):
        choice(torch.tensor([[1, 10, 9, 2]] * 3), torch.zeros(3, 50))


def test_goal_counts_are_what_listeners_did_for_each_emotion(tmp_path):
    replies = ([("devastated", "I'm so sorry. Was she ill?")] * 3 + [("devastated", "Hmm.")] * 2
               + [("proud", "Congratulations!")] + [("proud", None), (None, "Sorry.")])
    counts = fit_goal_counts(replies)
    assert counts["devastated"] == {act_key([SYMPATHY, DETAILS]): 3, "": 2} == counts["sad"]
    assert counts["proud"] == {CONGRATS: 1}
    path = tmp_path / "acts.json"
    save_goal_acts({"devastated": [SYMPATHY]}, path, goal_counts=counts)
    assert load_goal_counts(path) == counts
    save_goal_acts({"devastated": [SYMPATHY]}, path)
    with pytest.raises(ValueError, match=r"acts.json: field 'goal_counts' must map"):
        load_goal_counts(path)
    save_goal_acts({"devastated": [SYMPATHY]}, path, goal_counts={"sad": {"Hugging + Expressing sympathy": 2}})
    with pytest.raises(ValueError, match=r"field 'goal_counts.sad' names 'Hugging'"):
        load_goal_counts(path)
    save_goal_acts({"devastated": [SYMPATHY]}, path, goal_counts={"sad": {SYMPATHY: -1}})
    with pytest.raises(ValueError, match=r"field 'goal_counts.sad' must map act sequences to counts"):
        load_goal_counts(path)


def test_the_prior_multiplies_each_goals_probability_token_by_token():
    # sad's goals 30 31 9, 30 32 9 and 30 9 weigh 1, 3 and 4 (40 9 is proud's alone).
    spellings = [[30, 31, 9], [30, 32, 9], [40, 9], [30, 9]]
    allowed = torch.tensor([[True, True, False, True], [False, False, True, True]])
    prior = torch.tensor([[1.0, 3.0, 5.0, 4.0], [1.0, 1.0, 1.0, 1.0]])
    choice = ChainGoalChoice([2], spellings, allowed, [1], [10, 20], prior=prior, prior_weight=2.0)
    first = choice(torch.tensor([[1, 10, 9, 2]]), torch.zeros(1, 50))
    assert torch.nonzero(torch.isfinite(first[0])).flatten().tolist() == [30]
    assert first[0, 30].item() == pytest.approx(0.0)  # the only way on: the whole prior
    second = choice(torch.tensor([[1, 10, 9, 2, 30]]), torch.zeros(1, 50))
    # 31, 32 and the line break (30 9) share 1 : 3 : 4, squared by the weight.
    assert second[0, [31, 32, 9]].tolist() == pytest.approx([2 * torch.tensor(x / 8).log().item()
                                                             for x in (1, 3, 4)])
    # The same scores over the model's: the sum of both decides.
    scored = choice(torch.tensor([[1, 10, 9, 2, 30]]), torch.tensor([[0.0] * 31 + [5.0] + [0.0] * 18]))
    assert scored[0, 31] - scored[0, 32] == pytest.approx(5 + 2 * torch.tensor(1 / 3).log().item(), rel=1e-5)
    with pytest.raises(ValueError, match=r"prior must be \(2, 4\) and positive"):
        ChainGoalChoice([2], spellings, allowed, [1], [10, 20], prior=torch.zeros(2, 4))


LABELS = ["devastated", "proud"]


def _tiny(acts_file: Path, **overrides) -> Empatheia:
    config = EmpatheiaConfig.from_preset("tiny", {"language_model.chain_emotions": LABELS,
                                                  "language_model.choose_chain_emotion": True,
                                                  "language_model.choose_chain_goal": True,
                                                  "language_model.chain_goal_acts": str(acts_file), **overrides})
    return Empatheia(config).eval()


@torch.no_grad()
def test_generation_writes_a_goal_that_fits_the_emotion_it_chose(tmp_path, monkeypatch):
    acts = tmp_path / "acts.json"
    save_goal_acts({"devastated": [SYMPATHY, DETAILS], "proud": [CONGRATS]}, acts)
    model = _tiny(acts).merge_adapter()
    records = [{"conv_id": "c:1", "situation": "My grandmother died.", "emotion": "devastated",
                "utterances": ["My grandmother died last night.", "I'm sorry."]},
               {"conv_id": "c:2", "situation": "I passed.", "emotion": "proud",
                "utterances": ["I passed the bar exam! Can you believe it?", "Wow!"]}]
    (tmp_path / "ed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    items = distill_examples(tmp_path / "ed.jsonl")
    # Random weights write no lead-ins: let the third token written stand for the emotion
    # step's, and the emotion's spelling (line break included) for the goal step's, so the
    # goal follows right after the label.
    lead = int(model.generate_text(items[:1], PromptMode.FULL, 4).sequences[0, 2])
    _, labels = emotion_step_tokens(model.tokenizer, LABELS)
    monkeypatch.setattr("empatheia.modeling.emotion_step_tokens", lambda tokenizer, names: ([lead], labels))
    real_goal_tokens = goal_step_tokens
    for given, item in zip(LABELS, items):
        spelled = labels[LABELS.index(given)]
        monkeypatch.setattr("empatheia.modeling.goal_step_tokens",
                            lambda tokenizer, goals: (spelled, real_goal_tokens(tokenizer, goals)[1]))
        model._goal_choice_parts = None
        row = model.generate_text([item], PromptMode.FULL, 40, given_emotions=[given]).sequences[0].tolist()
        at = row.index(lead) + 1 + len(spelled)
        fitting = goal_repertoire(fitting_acts(load_goal_acts(acts), given), given,
                                  leads=[goal_lead(item.turns[-1].text)])
        spellings = real_goal_tokens(model.tokenizer, fitting)[1]
        assert any(row[at:at + len(s)] == s for s in spellings), model.tokenizer.decode(row[at:])
    # The second dialogue asks a question: its goal opens by answering it, the first's by
    # nothing; each row is held to its own dialogue's opening.
    assert goal_lead(items[1].turns[-1].text) == QUESTION_GOAL
    choice = model._chain_goal_choice([lead], [s[0] for s in labels], items)
    assert choice.row_leads.tolist() == [GOAL_LEADS.index(None), GOAL_LEADS.index(QUESTION_GOAL)]


def test_the_models_prior_is_the_labels_counts_of_each_goals_acts(tmp_path):
    acts = tmp_path / "acts.json"
    save_goal_acts({"devastated": [SYMPATHY, DETAILS], "proud": [CONGRATS]}, acts,
                   goal_counts={"devastated": {SYMPATHY: 6, "": 2}, "happy": {CONGRATS: 3}})
    model = _tiny(acts, **{"language_model.chain_goal_prior_weight": 0.5})
    goals = ["Expressing sympathy.", "Expressing sympathy and asking them for details.",
             "Answering the speaker's question while expressing sympathy.", "Congratulating the speaker."]
    # proud has no row of its own: its class's (happy) counts stand.
    assert model._goal_prior(goals).tolist() == [[6.5, 0.5, 6.5, 0.5], [0.5, 0.5, 0.5, 3.5]]
    choice = model._chain_goal_choice([1], [10, 20])
    assert choice.prior_weight == 0.5 and choice.log_prior.shape == (3, len(model._goal_choices()[4]))
    assert _tiny(acts)._chain_goal_choice([1], [10, 20]).log_prior is None  # weight 0: off
    with pytest.raises(ValueError, match="chain_goal_prior_weight must be 0 or more"):
        EmpatheiaConfig.from_preset("tiny", {"language_model.chain_goal_prior_weight": -1.0})


def test_choose_chain_goal_needs_the_emotion_choice_and_a_table(tmp_path):
    with pytest.raises(ValueError, match="choose_chain_goal needs language_model.choose_chain_emotion"):
        EmpatheiaConfig.from_preset("tiny", {"language_model.choose_chain_goal": True})
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    model = _tiny(bad)
    with pytest.raises(ValueError, match=r"language_model.chain_goal_acts: .*bad.json: field 'format'"):
        model._chain_goal_choice([1], [10, 20])


def test_the_goal_acts_command_fits_a_training_file(tmp_path, capsys):
    records = [{"conv_id": f"c:{i}", "situation": "My dog died.", "emotion": "devastated",
                "utterances": ["My dog died.", "I'm so sorry to hear that."]} for i in range(4)]
    data = tmp_path / "ed.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["data", "goal-acts", str(data), "--out", str(tmp_path / "acts.json")]) == 0
    table = load_goal_acts(tmp_path / "acts.json")
    assert table["devastated"] == [SYMPATHY] == table["sad"]
    assert "4 replies" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["data", "goal-acts", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "x.json")])


@pytest.mark.skipif(not (SHARED / "data/ed/ed_valid_conversations.jsonl").exists(), reason="needs ../shared/data")
def test_the_shipped_table_is_the_fit_on_smalls_training_split(tmp_path):
    from empatheia.data.readers import read_dataset
    from empatheia.data.render import split_ed_file
    from empatheia.pretrained import resolve_pretrained

    split = split_ed_file(SHARED / "data/ed/ed_valid_conversations.jsonl", tmp_path)
    train = read_dataset(split["train"]).dialogues
    path = resolve_pretrained("package:empatheia/weights/small/goal_acts.json")
    shipped = load_goal_acts(path)
    pairs = [(d.emotion, d.response) for d in train]
    assert shipped == fit_goal_acts(pairs)
    assert load_goal_counts(path) == fit_goal_counts(pairs)
    assert load_act_openings(path) == fit_act_openings(reply for _, reply in pairs)
    # What a person expects of the fit: no congratulation for grief, no sympathy for joy.
    assert CONGRATS not in shipped["devastated"] and SYMPATHY not in shipped["joyful"]
    assert CONGRATS in shipped["proud"] and SYMPATHY in shipped["devastated"]

