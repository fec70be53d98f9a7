"""The reply does what its chain's goal names: how listeners open each act
(``sentence_opening``, ``fit_act_openings``, the openings of a goal-acts file), the
processor that opens a sentence of the reply for each of the goal's acts
(``ReplyGoalOpenings``) and its wiring (``language_model.open_reply_by_goal``)."""

import json

import pytest
import torch

from empatheia import Empatheia
from empatheia.chain_targets import (OTHER_QUESTION, fit_act_openings, goal_acts, goal_repertoire, load_act_openings,
                                     reply_acts, save_goal_acts, sentence_opening)
from empatheia.config import EmpatheiaConfig
from empatheia.logits_processors import ReplyGoalOpenings, goal_step_tokens, reply_markers
from empatheia.prompts import ChainOfEmpathy, PromptMode, chain_text

SYMPATHY, DETAILS, WHAT = "Expressing sympathy", "Asking the speaker for details", "Asking what happened"


def test_a_sentence_opens_its_act_with_the_words_up_to_its_cue():
    assert sentence_opening("I'm so sorry to hear that.") == (SYMPATHY, "i'm so sorry")
    assert sentence_opening("Oh no, what happened?") == (WHAT, "oh no, what happened")
    assert sentence_opening("Did you win the game?") == (OTHER_QUESTION, "did you")
    # im mended as a reply would spell it; a cue after the fourth word opens nothing.
    assert sentence_opening("im sorry") == (SYMPATHY, "i'm sorry")
    assert sentence_opening("My cat and I went to the vet and it was so sad.") is None
    assert sentence_opening("The weather.") is None
    # Each opening alone is read as its act by the rules that read the reply.
    for sentence in ("I'm so sorry to hear that.", "Oh no, what happened?", "Congratulations on the job!"):
        act, opening = sentence_opening(sentence)
        assert reply_acts(opening + "?" if act == WHAT else opening)[-1] == act


def test_openings_are_the_commonest_spelled_as_a_reply_writes_them():
    replies = (["I'm so sorry. What happened?"] * 3 + ["Oh no, that sucks."] * 5 + ["Thats awful"] * 5
               + ["im so sorry", "Congratulations!", None])
    openings = fit_act_openings(replies, min_count=3, limit=12)
    assert openings[SYMPATHY] == ["Oh no", "I'm so sorry"]  # commonest first: 5 against 4
    assert openings[WHAT] == ["What happened"]
    assert "Congratulating the speaker" not in openings  # under the count
    assert fit_act_openings(replies, min_count=3, limit=1)[SYMPATHY] == ["Oh no"]
    # "Thats" is an apostrophe lost, not an opening to copy.
    assert all("Thats" not in text for texts in openings.values() for text in texts)
    with pytest.raises(ValueError, match="at least 1"):
        fit_act_openings(replies, limit=0)


def test_openings_round_trip_in_the_goal_acts_file_and_a_bad_one_is_named(tmp_path):
    path = tmp_path / "acts.json"
    save_goal_acts({"sad": [SYMPATHY]}, path, openings={SYMPATHY: ["Oh no"]})
    assert load_act_openings(path) == {SYMPATHY: ["Oh no"]}
    save_goal_acts({"sad": [SYMPATHY]}, path)
    with pytest.raises(ValueError, match=r"acts.json: field 'openings' must map acts"):
        load_act_openings(path)
    data = json.loads(path.read_text())
    data["openings"] = {"Hugging the speaker": ["Hug"]}
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"acts.json: field 'openings' names 'Hugging the speaker'"):
        load_act_openings(path)
    data["openings"] = {SYMPATHY: ["Oh no", ""]}
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"field 'openings.Expressing sympathy' must be a list of non-empty"):
        load_act_openings(path)


# Goal lead-in [2]; goals 30 31 9 (acts 0 then 1), 40 9 (act 1), 50 9 (no act); reply lead-in
# [7]; 8 ends a sentence; act 0 opens 60 61 or 62, act 1 opens 70.
def _openings():
    goals = [[30, 31, 9], [40, 9], [50, 9]]
    acts = torch.tensor([[0, 1], [1, -1], [-1, -1]])
    openings = [(0, [60, 61]), (0, [62]), (1, [70])]
    sentence_end = torch.zeros(100, dtype=torch.bool)
    sentence_end[8] = True
    return ReplyGoalOpenings([2], goals, acts, openings, [[7]], sentence_end)


def _allowed(scores):
    return [sorted(torch.nonzero(torch.isfinite(row)).flatten().tolist()) for row in scores]


def test_each_sentence_of_the_reply_opens_the_goals_next_act():
    openings = _openings()
    before = torch.tensor([[2, 30, 31, 9, 5]])
    assert torch.equal(openings(before, torch.zeros(1, 100)), torch.zeros(1, 100))  # no reply yet
    chain = [2, 30, 31, 9, 7]
    assert _allowed(openings(torch.tensor([chain]), torch.zeros(1, 100))) == [[60, 62]]
    assert _allowed(openings(torch.tensor([chain + [60]]), torch.zeros(1, 100))) == [[61]]
    assert _allowed(openings(torch.tensor([chain + [60, 61]]), torch.zeros(1, 100)))[0] == list(range(100))
    # The first sentence ended: the second opens the second act; the end of text (0) waits.
    scores = torch.arange(100, dtype=torch.float)[None]
    second = openings(torch.tensor([chain + [62, 5, 8]]), scores.clone())
    assert _allowed(second) == [[70]] and second[0, 70] == 70  # the model's own score stands
    assert _allowed(openings(torch.tensor([chain + [62, 5, 8, 70]]), torch.zeros(1, 100)))[0] == list(range(100))
    # After the goal's acts, and for a goal naming none, the reply is free.
    done = torch.tensor([chain + [62, 8, 70, 8], [2, 50, 9, 7, 5, 5, 5, 5, 5]])
    assert torch.equal(openings(done, torch.zeros(2, 100)), torch.zeros(2, 100))
    # One goal, one act: a batch holds rows of different goals and places.
    batch = torch.tensor([chain + [60], [1, 1, 2, 40, 9, 7]])
    assert _allowed(openings(batch, torch.zeros(2, 100))) == [[61], [70]]


def test_with_a_bonus_the_openings_are_favoured_not_forced():
    goals = [[30, 31, 9]]
    sentence_end = torch.zeros(100, dtype=torch.bool)
    sentence_end[8] = True
    openings = ReplyGoalOpenings([2], goals, torch.tensor([[0]]), [(0, [60, 61]), (0, [62])], [[7]], sentence_end,
                                 bonus=2.5)
    scores = torch.arange(100, dtype=torch.float)[None]
    kept = openings(torch.tensor([[2, 30, 31, 9, 7]]), scores.clone())
    assert kept[0, 60] == 62.5 and kept[0, 62] == 64.5 and kept[0, 99] == 99  # the model's 99 still wins
    # Off the openings (the row wrote its own word), the sentence is free.
    assert torch.equal(openings(torch.tensor([[2, 30, 31, 9, 7, 99]]), scores.clone()), scores)
    with pytest.raises(ValueError, match="bonus must be None or 0 or more"):
        ReplyGoalOpenings([2], goals, torch.tensor([[0]]), [(0, [60])], [[7]], sentence_end, bonus=-1.0)
    with pytest.raises(ValueError, match="reply_opening_bonus must be null or 0 or more"):
        EmpatheiaConfig.from_preset("tiny", {"language_model.reply_opening_bonus": -1.0})


def test_an_opening_cut_short_by_a_block_still_goes_on():
    openings = _openings()
    blocked = torch.full((1, 100), float("-inf"))
    assert _allowed(openings(torch.tensor([[2, 30, 31, 9, 7, 60]]), blocked)) == [[61]]
    with pytest.raises(ValueError, match=r"goal_acts must be \(3, A\)"):
        ReplyGoalOpenings([2], [[30, 9]] * 3, torch.zeros(2, 1), [(0, [60])], [[7]], torch.zeros(100).bool())
    with pytest.raises(ValueError, match="at least one token"):
        ReplyGoalOpenings([2], [[30, 9]], torch.zeros(1, 1), [(0, [])], [[7]], torch.zeros(100).bool())


def _tiny(acts_file, **overrides) -> Empatheia:
    config = EmpatheiaConfig.from_preset("tiny", {"language_model.chain_emotions": ["devastated", "proud"],
                                                  "language_model.choose_chain_emotion": True,
                                                  "language_model.choose_chain_goal": True,
                                                  "language_model.chain_goal_acts": str(acts_file), **overrides})
    return Empatheia(config).eval()


def test_the_model_opens_the_reply_with_the_acts_of_the_goal_its_chain_wrote(tmp_path):
    acts = tmp_path / "acts.json"
    save_goal_acts({"devastated": [SYMPATHY, DETAILS]}, acts,
                   openings={SYMPATHY: ["Oh no", "I'm so sorry"], DETAILS: ["Did you"]})
    model = _tiny(acts, **{"language_model.open_reply_by_goal": True})
    processors = model._decoding_processors(PromptMode.FULL, None)
    openings = next(p for p in processors if isinstance(p, ReplyGoalOpenings))
    # The chain as the template writes it, with a goal of the repertoire, then the reply's lead-in.
    goal = "Expressing sympathy and asking them for details."
    assert goal in goal_repertoire([SYMPATHY, DETAILS], "devastated") and goal_acts(goal) == [SYMPATHY, DETAILS]
    text = chain_text(ChainOfEmpathy(event_scenario="Her dog died.", speaker_emotion="devastated",
                                     emotion_cause="Her dog died.", goal_to_response=goal)).rstrip()
    tokenizer = model.tokenizer
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    marker, spellings = goal_step_tokens(tokenizer, [goal])
    assert reply_markers(tokenizer, PromptMode.FULL) and marker
    vocab = model._hf_model().get_output_embeddings().weight.shape[0]

    def spelled(text):
        return tokenizer(" " + text, add_special_tokens=False)["input_ids"]

    def walk(before, opening, candidates):
        # Token by token along `opening`: only the next tokens of the candidates that agree
        # so far stand; once it is whole, the sentence is free.
        target = spelled(opening)
        for step in range(len(target) + 1):
            kept = openings(torch.tensor([before + target[:step]]), torch.zeros(1, vocab))
            agree = [c for c in map(spelled, candidates) if c[:step] == target[:step] and len(c) > step]
            complete = any(c == target[:step] for c in map(spelled, candidates))
            expected = list(range(vocab)) if complete or not agree else sorted({c[step] for c in agree})
            assert _allowed(kept)[0] == expected, (opening, step)

    # The first sentence opens the goal's first act (sympathy), never its second.
    walk(ids, "Oh no", ["Oh no", "I'm so sorry"])
    walk(ids, "I'm so sorry", ["Oh no", "I'm so sorry"])
    assert spelled("Did you")[:2] not in [spelled(t)[:2] for t in ("Oh no", "I'm so sorry")]
    # After a first sentence, the question opens the second.
    reply = tokenizer(text + " Oh no, that is sad.", add_special_tokens=False)["input_ids"]
    walk(reply, "Did you", ["Did you"])


def test_open_reply_by_goal_needs_the_goal_choice_and_openings(tmp_path):
    with pytest.raises(ValueError, match="open_reply_by_goal needs language_model.choose_chain_goal"):
        EmpatheiaConfig.from_preset("tiny", {"language_model.open_reply_by_goal": True})
    acts = tmp_path / "acts.json"
    save_goal_acts({"devastated": [SYMPATHY]}, acts)
    model = _tiny(acts, **{"language_model.open_reply_by_goal": True})
    with pytest.raises(ValueError, match=r"language_model.chain_goal_acts: .*acts.json: field 'openings'"):
        model._decoding_processors(PromptMode.FULL, None)
    # A goal whose first act has no openings opens nothing: its second act is not moved up.
    save_goal_acts({"devastated": [SYMPATHY, DETAILS]}, acts, openings={DETAILS: ["Did you"]})
    model = _tiny(acts, **{"language_model.open_reply_by_goal": True})
    openings = model._reply_goal_openings(PromptMode.FULL)
    goals = model._goal_choices()[4]
    row = openings.goal_acts[goals.index("Expressing sympathy and asking them for details.")]
    assert row.tolist() == [-1] * row.numel()
    assert openings.goal_acts[goals.index("Asking the speaker for details.")][0] == 0
