"""Decoding: the reply's repetition control (n-gram blocking, repetition penalty), seeded
sampling, their settings on the command line and in eval's records, the repeated-sentence
metric, and the decoding sweep. The processors are checked against plain per-row
reference implementations, the generation on the tiny preset, and the effect on the
shipped ``small`` weights on held-out dialogues that repeat themselves today."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from empatheia import Empatheia, EmpatheiaConfig
from empatheia.cli import main
from empatheia.decoding import Decoding
from empatheia.evaluation.text import repeated_sentences, sentences
from empatheia.logits_processors import (ChainEmotionChoice, ChainStepNgramBlock, ChainTemplate, ReplyRepetitionControl,
                                         SeededSampling, SentenceRepetitionBlock, chain_lead_ins, emotion_step_tokens,
                                         reply_lengths, reply_markers, reply_starts, sentence_token_classes,
                                         token_texts)
from empatheia.prompts import PromptMode, chain_is_complete
from empatheia.serve.chat import Chat

from .conftest import make_dialogue, shared_data
from .test_inference_path import _full_batch_of

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "conversation.json"
ED_CONVERSATIONS = [
    {"conv_id": "c1", "situation": "I lost my job.", "emotion": "sad",
     "utterances": ["I lost my job today", "I am so sorry", "Thanks, it hurts", "Things will get better"]},
    {"conv_id": "c2", "situation": "I won a prize.", "emotion": "proud",
     "utterances": ["I won the science prize", "Congratulations"]},
]


# ---------------------------------------------------------------------- per-row references
def _reference_banned(ids, start, n):
    """The tokens that would complete an n-gram the reply ``ids[start:]`` already holds."""
    reply = ids[start:]
    if len(reply) < n - 1:
        return set()
    tail = tuple(reply[len(reply) - n + 1:]) if n > 1 else ()
    return {reply[j + n - 1] for j in range(len(reply) - n + 1) if tuple(reply[j : j + n - 1]) == tail}


def _reference_control(ids, scores, start, n, penalty, protected):
    out = scores.clone()
    if penalty != 1.0:
        for token in set(ids[start:]) - set(protected):
            out[token] = out[token] / penalty if out[token] > 0 else out[token] * penalty
    for token in (_reference_banned(ids, start, n) if n > 0 else set()) - set(protected):
        out[token] = float("-inf")
    return out


MARKERS = [[1, 2], [3, 1, 2]]


def _random_rows(seed, rows=6, length=14, vocab=7):
    """Ids over a small vocabulary, so n-grams repeat often, with the marker ``1 2`` in
    every row but the last."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, vocab, (rows, length), generator=generator)
    for row in range(rows - 1):
        at = int(torch.randint(0, length - 1, (1,), generator=generator))
        ids[row, at : at + 2] = torch.tensor([1, 2])
    return ids, torch.randn(rows, vocab, generator=generator)


def _reply_start(row):
    return next((at + 2 for at in range(len(row) - 1) if row[at : at + 2] == [1, 2]), len(row))


def _pairs(row):
    return [row[at : at + 2] for at in range(len(row) - 1)]


# ---------------------------------------------------------------------- the processors
def test_reply_starts_after_the_first_marker():
    ids = torch.tensor([[5, 1, 2, 6, 1, 2], [3, 1, 2, 7, 7, 7], [5, 5, 5, 5, 5, 5], [1, 5, 5, 5, 5, 1]])
    assert reply_starts(ids, [torch.tensor(m) for m in MARKERS]).tolist() == [3, 3, 6, 6]
    assert reply_starts(ids[:, :0], [torch.tensor([1, 2])]).tolist() == [0, 0, 0, 0]
    # Counted, a lead-in just written (0 reply tokens) differs from none yet (-1).
    assert reply_lengths(ids, [torch.tensor(m) for m in MARKERS]).tolist() == [3, 3, -1, -1]
    assert reply_lengths(ids[:, :3], [torch.tensor([1, 2])]).tolist() == [0, 0, -1, -1]


@pytest.mark.parametrize("n, penalty", [(1, 1.0), (2, 1.0), (3, 1.0), (4, 1.0), (0, 1.3), (3, 1.2)])
def test_repetition_control_matches_a_per_row_reference(n, penalty):
    protected = [5]
    control = ReplyRepetitionControl(MARKERS, n, penalty, protected=protected)
    for seed in range(20):
        ids, scores = _random_rows(seed)
        got = control(ids, scores.clone())
        for row in range(ids.shape[0]):
            ids_row = ids[row].tolist()
            expected = _reference_control(ids_row, scores[row], _reply_start(ids_row), n, penalty, protected)
            torch.testing.assert_close(got[row], expected, rtol=0, atol=0)


def test_repetition_control_spares_the_chain_the_end_and_the_signal_tokens():
    control = ReplyRepetitionControl([[1, 2]], no_repeat_ngram_size=2, repetition_penalty=1.5, protected=[10, 11])
    # The chain's template repeats its own words before the reply: nothing changes there.
    template = torch.tensor([[7, 8, 9, 4, 7, 8, 9, 4, 7, 8, 9]] * 2)
    scores = torch.randn(2, 12)
    torch.testing.assert_close(control(template, scores.clone()), scores, rtol=0, atol=0)
    # Reply "6 4 6 10 6 11 6": after "6", the bigrams "6 4", "6 10", "6 11" were said. The
    # end (10) and the signal token (11) stay as they were; 4 is blocked, 6 penalised.
    out = control(torch.tensor([[1, 2, 6, 4, 6, 10, 6, 11, 6]]), torch.ones(1, 12))[0]
    assert out[4] == float("-inf") and out[10] == 1.0 and out[11] == 1.0
    assert out[6] == pytest.approx(1 / 1.5) and out[5] == 1.0


# A toy vocabulary for the sentence block: 0-3 words, 4 ".", 5 "\n", 6 " ", 7 ",", 8 the end
# of text, 9 ":"; the reply starts after the marker 1 2.
_WORDS = torch.tensor([True] * 4 + [False] * 6)
_SENTENCE_ENDS = torch.arange(10) == 4
_CLAUSE_ENDS = torch.arange(10) == 9
_LINE_ENDS = torch.arange(10) == 5


def _reference_repeats(ids):
    """Whether the sentence a row is writing repeats one before it in its scope: the reply
    after the first ``1 2``, else the text after the last line break."""
    start = _reply_start(ids)
    if start >= len(ids):
        start = max((i + 1 for i, t in enumerate(ids) if t == 5), default=0)
    said, words = [], []
    for token in ids[start:]:
        if token in (4, 5, 9):
            said.append(tuple(words))
            words = []
        elif token < 4:
            words.append(token)
    return bool(words) and tuple(words) in said


def _pooled_rows(seed, pool, length, marked_every):
    """8 rows of ``length`` ids drawn from ``pool`` (few tokens, so repeats are common), every
    ``marked_every``-th row holding the reply's marker ``1 2``, and ``(8, 10)`` scores."""
    generator = torch.Generator().manual_seed(seed)
    pool = torch.tensor(pool)
    ids = pool[torch.randint(0, len(pool), (8, length), generator=generator)]
    for row in range(0, 8, marked_every):
        at = int(torch.randint(0, length - 4, (1,), generator=generator))
        ids[row, at : at + 2] = torch.tensor([1, 2])
    return ids, torch.randn(8, 10, generator=generator)


def test_sentence_block_matches_a_per_row_reference():
    block = SentenceRepetitionBlock(MARKERS, _WORDS, _SENTENCE_ENDS, _CLAUSE_ENDS, _LINE_ENDS, closing=[8])
    closers = {4, 5, 8}
    blocked_rows = 0
    for seed in range(40):
        # Two words, so sentences repeat often; every other row holds the reply's marker.
        ids, scores = _pooled_rows(seed, [0, 1, 0, 1, 3, 4, 4, 5, 6, 7, 9], 16, marked_every=2)
        out = block(ids, scores.clone())
        for row in range(ids.shape[0]):
            repeats = _reference_repeats(ids[row].tolist())
            blocked_rows += repeats
            for token in range(10):
                expected = float("-inf") if repeats and token in closers else scores[row, token]
                assert out[row, token] == expected, (ids[row].tolist(), token)
    assert blocked_rows >= 10  # the random rows exercised the block, not only its absence


def test_chain_step_block_matches_a_per_row_reference():
    """Before the reply, a token that would repeat an n-gram of the current line (after the
    last line break, token 5) is blocked, except a line break and the protected end (8);
    rows that reached the reply pass unchanged."""
    for n in (2, 3):
        block = ChainStepNgramBlock(MARKERS, n, _LINE_ENDS, protected=[8])
        blocked_rows = 0
        for seed in range(30):
            ids, scores = _pooled_rows(seed, [0, 1, 0, 1, 5, 8, 3], 14, marked_every=3)
            out = block(ids, scores.clone())
            for row in range(ids.shape[0]):
                ids_row = ids[row].tolist()
                banned = set()
                if _reply_start(ids_row) >= len(ids_row):
                    line = max((i + 1 for i, t in enumerate(ids_row) if t == 5), default=0)
                    banned = _reference_banned(ids_row, line, n) - {5, 8}
                blocked_rows += bool(banned)
                expected = scores[row].clone()
                expected[sorted(banned)] = float("-inf")
                torch.testing.assert_close(out[row], expected, rtol=0, atol=0)
        assert blocked_rows >= 10  # the random rows exercised the block
    with pytest.raises(ValueError, match="no_repeat_ngram_size"):
        ChainStepNgramBlock(MARKERS, 0, _LINE_ENDS)


def test_token_texts_decode_each_id_alone(model, monkeypatch):
    tokenizer = model.tokenizer
    one_by_one = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], clean_up_tokenization_spaces=False)
    # One joined decode does the plain tokens: only the special and added ones, whose text
    # may hold the separator, go one by one.
    asked = []
    batch_decode = tokenizer.batch_decode
    monkeypatch.setattr(tokenizer, "batch_decode", lambda ids, **kw: asked.extend(ids) or batch_decode(ids, **kw))
    assert token_texts(tokenizer, len(tokenizer)) == one_by_one
    apart = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    assert {i for (i,) in asked} <= apart < set(range(len(tokenizer)))


def test_sentence_block_reads_white_space_and_scopes_like_the_metric(model):
    tokenizer = model.tokenizer
    block = SentenceRepetitionBlock(reply_markers(tokenizer, PromptMode.FULL),
                                    *sentence_token_classes(tokenizer, len(tokenizer)),
                                    closing=[model.token_ids.eos])
    closers = [tokenizer(t, add_special_tokens=False)["input_ids"][-1] for t in ("!", ".", "\n")]

    def blocked(text):
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
        out = block(ids, torch.zeros(1, len(tokenizer)))[0]
        return {bool(torch.isinf(out[c])) for c in closers + [model.token_ids.eos]}

    chain = "Firstly, the event scenario of this conversation is: I got the job.\n"
    assert blocked(chain + "Finally, the response is: Congratulations!  Congratulations") == {True}
    assert blocked(chain + "Finally, the response is: Congratulations! congratulations, ") == {False}  # case differs
    assert blocked(chain + "Finally, the response is: Congratulations! That is great") == {False}
    # A step of the chain may restate another step, but not itself.
    assert blocked(chain + "Thirdly, the emotion cause is: I got the job") == {False}
    assert blocked("Firstly, the event scenario of this conversation is: I got it. I got it") == {True}
    assert blocked("Firstly, the event scenario of this conversation is: I got it. I got the job") == {False}
    # With the block on, the shipped metric finds no repeat in what it lets through.
    assert repeated_sentences(["Congratulations!  Congratulations, you earned it!"])["repeated_sentence_count"] == 0


def test_reply_markers_follow_the_template_not_the_goal_step(model):
    tokenizer = model.tokenizer
    markers = reply_markers(tokenizer, PromptMode.FULL)
    assert [tokenizer.decode(m).strip().lower() for m in markers] == ["the response is:"] * 2
    assert [tokenizer.decode(m).strip() for m in reply_markers(tokenizer, PromptMode.PIPELINE)] == ["Response:"]
    assert reply_markers(tokenizer, PromptMode.MCOE) == [] and reply_markers(tokenizer, PromptMode.STYLE) == []
    goal = tokenizer("Fourthly, the goal to response is: to comfort", add_special_tokens=False)["input_ids"]
    assert int(reply_starts(torch.tensor([goal]), [torch.tensor(m) for m in markers])[0]) == len(goal)


def test_seeded_sampling_repeats_itself_and_leaves_the_global_rng_alone():
    scores = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    state = torch.get_rng_state()

    def draws(seed, **settings):
        sampler = SeededSampling(seed=seed, **settings)
        return [int(t) for _ in range(8) for t in sampler(None, scores).argmax(-1)]

    assert draws(3) == draws(3) and draws(3) != draws(4)
    assert torch.equal(torch.get_rng_state(), state)
    # One token survives each step; a tiny top-p keeps only the most probable one.
    once = SeededSampling(seed=1)(None, scores)
    assert (torch.isfinite(once).sum(-1) == 1).all()
    assert draws(5, top_p=1e-6) == scores.argmax(-1).tolist() * 8
    # Tokens a processor before it ruled out (-inf) are never drawn.
    blocked = scores.clone()
    blocked[:, :49] = float("-inf")
    assert set(SeededSampling(seed=2, temperature=2.0)(None, blocked).argmax(-1).tolist()) == {49}


def test_seeded_sampling_draws_by_the_distribution_and_by_each_rows_key():
    # 4,000 steps of one distribution: each token's share is near its probability.
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    sampler = SeededSampling(seed=7, keys=[5])
    counts = torch.zeros(4)
    for _ in range(4000):
        counts[sampler(None, probs.log()[None]).argmax(-1)] += 1
    assert torch.allclose(counts / 4000, probs, atol=0.025), counts
    # A row's draws depend on its key, the seed and the step, not on the rows beside it.
    scores = torch.randn(3, 30, generator=torch.Generator().manual_seed(1))

    def draws(keys, rows):
        sampler = SeededSampling(seed=3, keys=keys)
        return torch.stack([sampler(None, scores[rows]).argmax(-1) for _ in range(20)], 1)  # (rows, steps)

    together = draws([11, 22, 33], [0, 1, 2])
    assert torch.equal(draws([22], [1])[0], together[1]) and torch.equal(draws([33, 11], [2, 0]), together[[2, 0]])
    assert not torch.equal(draws([44], [1])[0], together[1])
    with pytest.raises(ValueError, match="2 row keys for a batch of 3"):
        SeededSampling(seed=0, keys=[1, 2])(None, scores)


def test_decoding_settings_check_their_values_and_fill_in_the_config():
    for bad in ({"temperature": 0}, {"top_p": 1.5}, {"seed": -1}, {"no_repeat_ngram_size": -2},
                {"repetition_penalty": 0.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Decoding(**bad)
    language_model = EmpatheiaConfig.from_preset("tiny", {"language_model.repetition_penalty": 1.2}).language_model
    resolved = Decoding(no_repeat_ngram_size=0).resolved(language_model)
    assert (resolved.no_repeat_ngram_size, resolved.repetition_penalty) == (0, 1.2)
    assert resolved.record() == {"do_sample": False, "no_repeat_ngram_size": 0, "repetition_penalty": 1.2,
                                 "block_repeated_sentences": False, "generic_reply_penalty": 0.0}
    sampled = Decoding(do_sample=True, seed=7, block_repeated_sentences=True).resolved(language_model).record()
    assert sampled == {"do_sample": True, "temperature": 0.7, "top_p": 0.9, "seed": 7, "no_repeat_ngram_size": 3,
                       "repetition_penalty": 1.2, "block_repeated_sentences": True, "sample_chain": True,
                       "generic_reply_penalty": 0.0}
    # The config's sampling defaults fill in what a call leaves out.
    sampling = EmpatheiaConfig.from_preset("tiny", {"language_model.do_sample": True, "language_model.seed": 4,
                                                    "language_model.sample_chain": False}).language_model
    assert Decoding().resolved(sampling).record() == {
        "do_sample": True, "temperature": 0.7, "top_p": 0.9, "seed": 4, "sample_chain": False,
        "no_repeat_ngram_size": 3, "repetition_penalty": 1.0, "block_repeated_sentences": False,
        "generic_reply_penalty": 0.0}
    assert Decoding(do_sample=False).resolved(sampling).record()["do_sample"] is False
    with pytest.raises(ValueError, match="language_model.top_p"):
        EmpatheiaConfig.from_preset("tiny", {"language_model.top_p": 0})
    with pytest.raises(ValueError, match="block_repeated_sentences must be True or False"):
        Decoding(block_repeated_sentences="yes")
    with pytest.raises(ValueError, match="language_model.no_repeat_ngram_size"):
        EmpatheiaConfig.from_preset("tiny", {"language_model.no_repeat_ngram_size": -1})


# ---------------------------------------------------------------------- generation (tiny)
def _dialogues():
    return [make_dialogue(3, seed=0), make_dialogue(1, audio=False, video=False, seed=1), make_dialogue(2, seed=2)]


def _reply(model, row, start):
    """A row's written tokens from ``start`` up to where it stopped (padding follows the
    end; the pad id itself may be a written token)."""
    stops = {model.token_ids.eos, model.token_ids.audio_signals[0]}
    tokens = [int(t) for t in row[start:]]
    return tokens[: next((i for i, t in enumerate(tokens) if t in stops), len(tokens))]


def _has_repeated_ngram(tokens, n):
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) < len(grams)


@torch.no_grad()
def test_generation_blocks_repeats_in_the_reply_of_a_left_padded_batch_and_keeps_its_cache(monkeypatch):
    model = Empatheia.from_preset("tiny").eval().merge_adapter()
    items = _dialogues()  # prompts of different lengths: left padding
    free = model.generate_text(items, PromptMode.FULL, 24, Decoding(no_repeat_ngram_size=0))
    # Random weights never write "the response is:"; let the reply start after the sixth
    # token the first row wrote (each row's first occurrence of it), so the control applies.
    marker = int(free.sequences[0, 5])
    starts = [row.tolist().index(marker) + 1 for row in free.sequences]
    monkeypatch.setattr("empatheia.modeling.reply_markers", lambda tokenizer, mode: [[marker]])
    assert any(_has_repeated_ngram(_reply(model, row, s), 3) for row, s in zip(free.sequences, starts))

    controlled = model.generate_text(items, PromptMode.FULL, 24, Decoding(no_repeat_ngram_size=3), keep_cache=True)
    for before, after, start in zip(free.sequences, controlled.sequences, starts):
        assert after[:start].tolist() == before[:start].tolist()  # the text before the reply is untouched
        assert not _has_repeated_ngram(_reply(model, after, start), 3)
    assert controlled.sequences.tolist() != free.sequences.tolist()
    # The signal pass on the generation's cache still equals a fresh pass over the text.
    batch = _full_batch_of(model, items, controlled)
    mask = batch["attention_mask"].bool()
    torch.testing.assert_close(model.answer_hidden_states(batch, controlled)[mask],
                               model.hidden_states(batch, media=controlled.media)[mask], atol=1e-5, rtol=1e-4)
    # The penalty goes the same way through respond, in a batch.
    answers = model.respond(items, max_new_tokens=24, no_repeat_ngram_size=0, repetition_penalty=1.5)
    assert len(answers) == 3 and all(isinstance(a.text, str) for a in answers)


@torch.no_grad()
def test_seeded_sampling_answers_the_same_and_keeps_the_callers_rng():
    model = Empatheia.from_preset("tiny")
    items = _dialogues()
    torch.manual_seed(123)
    state = torch.get_rng_state()
    first = [r.text for r in model.respond(items, max_new_tokens=16, do_sample=True, seed=11)]
    again = [r.text for r in model.respond(items, max_new_tokens=16, do_sample=True, seed=11)]
    other = [r.text for r in model.respond(items, max_new_tokens=16, do_sample=True, seed=12, temperature=1.5)]
    assert torch.equal(torch.get_rng_state(), state)
    assert first == again and first != other
    greedy = [r.text for r in model.respond(items, max_new_tokens=16)]
    assert greedy == [r.text for r in model.respond(items, max_new_tokens=16, seed=11)]  # a seed alone draws nothing
    assert greedy != first
    # One dialogue answered in stages, or alone, draws as it did in the batch.
    (_, staged), = model.respond_in_stages(items[0], max_new_tokens=16, do_sample=True, seed=11)
    assert staged.text == model.respond(items[0], max_new_tokens=16, do_sample=True, seed=11).text
    alone = [model.respond(item, max_new_tokens=16, do_sample=True, seed=11).text for item in items]
    assert alone == first


def test_reply_only_sampling_leaves_the_chain_greedy():
    sampler = SeededSampling(1.0, 1.0, seed=0, reply_only=MARKERS)
    ids, scores = _random_rows(3)
    ids[0, :-2] = 5
    ids[0, -2:] = torch.tensor([1, 2])  # the lead-in just written: the reply's first token is drawn
    ids[-1, -1] = 1  # half a lead-in: still before the reply
    out = sampler(ids, scores.clone())
    assert torch.isfinite(out[0]).sum() == 1
    for row in range(ids.shape[0]):
        if [1, 2] in _pairs(ids[row].tolist()):  # the lead-in written, even as the last two ids
            assert torch.isfinite(out[row]).sum() == 1  # in the reply: one drawn token left
        else:
            torch.testing.assert_close(out[row], scores[row], rtol=0, atol=0)  # greedy picks the likeliest


@torch.no_grad()
def test_generation_samples_only_the_reply_when_asked(monkeypatch):
    model = Empatheia.from_preset("tiny").eval().merge_adapter()
    items = _dialogues()
    greedy = model.generate_text(items, PromptMode.FULL, 20, Decoding(do_sample=False))
    marker = int(greedy.sequences[0, 5])  # stands for the reply's lead-in, as above
    starts = [row.tolist().index(marker) + 1 if marker in row.tolist() else None for row in greedy.sequences]
    monkeypatch.setattr("empatheia.modeling.reply_markers", lambda tokenizer, mode: [[marker]])
    reply_only = model.generate_text(items, PromptMode.FULL, 20, Decoding(do_sample=True, seed=1, sample_chain=False,
                                                                         temperature=3.0, top_p=1.0))
    everything = model.generate_text(items, PromptMode.FULL, 20, Decoding(do_sample=True, seed=1, temperature=3.0,
                                                                         top_p=1.0))
    for before, after, start in zip(greedy.sequences.tolist(), reply_only.sequences.tolist(), starts):
        stop = start if start is not None else len(before)
        assert after[:stop] == before[:stop]  # up to the reply (all of a row that never starts one): greedy
    assert reply_only.sequences.tolist() != greedy.sequences.tolist()  # the replies were drawn
    assert everything.sequences[:, :5].tolist() != greedy.sequences[:, :5].tolist()  # sampling all draws the chain


def test_variants_pass_the_decoding_on(monkeypatch):
    from empatheia.variants.build import build_pipeline

    pipeline = build_pipeline("tiny")
    seen = []
    original = pipeline.model.generate_text

    def recording(items, mode, max_new_tokens=None, decoding=None, **kwargs):
        seen.append((mode, decoding))
        return original(items, mode, max_new_tokens, decoding, **kwargs)

    monkeypatch.setattr(pipeline.model, "generate_text", recording)
    first = pipeline.respond(make_dialogue(2), max_new_tokens=8, do_sample=True, seed=3, no_repeat_ngram_size=2)
    again = pipeline.respond(make_dialogue(2), max_new_tokens=8, do_sample=True, seed=3, no_repeat_ngram_size=2)
    assert first.text == again.text
    assert [mode for mode, _ in seen] == [PromptMode.PIPELINE] * 2
    assert seen[0][1] == Decoding(do_sample=True, seed=3, no_repeat_ngram_size=2)


# ---------------------------------------------------------------------- command line and eval
def test_respond_and_chat_take_the_decoding_flags(tmp_path, monkeypatch, capsys):
    def answer(out, *flags):
        assert main(["respond", str(EXAMPLE), "--preset", "tiny", "--out", str(tmp_path / out),
                     "--max-new-tokens", "12", *flags]) == 0
        return json.loads((tmp_path / out / "response.json").read_text())["text"]

    sampled = answer("a", "--sample", "--seed", "5", "--top-p", "0.95", "--repetition-penalty", "1.2")
    assert answer("b", "--sample", "--seed", "5", "--top-p", "0.95", "--repetition-penalty", "1.2") == sampled
    assert answer("c", "--no-repeat-ngram", "2") == answer("d", "--no-repeat-ngram", "2")
    assert answer("f", "--sample-reply", "--seed", "5") == answer("g", "--sample-reply", "--seed", "5")
    for flags in (["--seed", "1"], ["--greedy", "--seed", "1"]):
        with pytest.raises(SystemExit, match=r"--seed only apply with --sample or --sample-reply"):
            main(["respond", str(EXAMPLE), "--preset", "tiny", "--out", str(tmp_path / "e"), *flags])
    with pytest.raises(SystemExit):
        main(["respond", str(EXAMPLE), "--preset", "tiny", "--out", str(tmp_path / "e"), "--greedy", "--sample"])
    with pytest.raises(SystemExit, match=r"--top-p: top_p must be in \(0, 1\]"):
        main(["respond", str(EXAMPLE), "--preset", "tiny", "--out", str(tmp_path / "e"), "--sample", "--top-p", "2"])

    texts = []
    for folder in ("chat1", "chat2"):
        monkeypatch.setattr("sys.stdin", io.StringIO("I lost my keys again.\n/quit\n"))
        assert main(["chat", "--preset", "tiny", "--max-new-tokens", "8", "--sample", "--seed", "9",
                     "--out", str(tmp_path / folder)]) == 0
        texts.append(json.loads((tmp_path / folder / "turn-1" / "response.json").read_text())["text"])
    assert texts[0] == texts[1]
    said = []
    Chat(Empatheia.from_preset("tiny"), tmp_path / "chat3", max_new_tokens=8, write=said.append,
         decoding=Decoding(do_sample=True, seed=9)).run(io.StringIO("I lost my keys again.\n"))
    assert f"avatar> {texts[0] or '(no words)'}" in said


def test_eval_records_the_decoding_and_refuses_to_mix_runs(tmp_path, capsys):
    data = tmp_path / "ed.jsonl"
    data.write_text("".join(json.dumps(c) + "\n" for c in ED_CONVERSATIONS))
    out = tmp_path / "run"
    base = ["eval", "--preset", "tiny", "--data", str(data), "--out", str(out), "--max-new-tokens", "4",
            "--batch-size", "2", "--no-progress", "--sample", "--seed", "3", "--temperature", "1.2",
            "--block-repeated-sentences"]
    assert main(base) == 0
    recorded = {"do_sample": True, "temperature": 1.2, "top_p": 0.9, "seed": 3, "no_repeat_ngram_size": 3,
                "repetition_penalty": 1.0, "block_repeated_sentences": True, "sample_chain": True,
                "generic_reply_penalty": 0.0}
    assert json.loads((out / "run.json").read_text())["decoding"] == recorded
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["run"]["decoding"] == recorded
    assert metrics["repeated_sentence_count"] <= metrics["count"] == 3
    assert "repeated_sentence_share" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "Answers that repeat a sentence" in (out / "report.md").read_text()
    with pytest.raises(SystemExit, match=r"decoding: was .*'seed': 3.*now .*'seed': 4"):
        main([a if a != "3" else "4" for a in base])
    with pytest.raises(SystemExit, match=r"decoding: was .*'block_repeated_sentences': True.*now .*False"):
        main([a if a != "--block-repeated-sentences" else "--allow-repeated-sentences" for a in base])
    with pytest.raises(SystemExit):
        main(base + ["--allow-repeated-sentences"])  # one or the other
    with pytest.raises(SystemExit, match=r"--sample, --no-repeat-ngram only apply with --checkpoint/--preset"):
        main(["eval", "--predictions", "p.jsonl", "--references", "r.jsonl", "--out", str(tmp_path / "s"),
              "--sample", "--no-repeat-ngram", "2"])


def test_a_run_recorded_before_the_sentence_block_resumes_without_it(tmp_path):
    from empatheia.evaluation.model_runs import RunMismatchError, check_run_info

    older = {"model": "small", "decoding": {"do_sample": False, "no_repeat_ngram_size": 3, "repetition_penalty": 1.0}}
    (tmp_path / "run.json").write_text(json.dumps(older))
    (tmp_path / "predictions.jsonl").write_text('{"id": "a"}\n')
    same = dict(older, decoding=dict(older["decoding"], block_repeated_sentences=False))
    check_run_info(tmp_path, same)
    with pytest.raises(RunMismatchError, match="block_repeated_sentences"):
        check_run_info(tmp_path, dict(older, decoding=dict(older["decoding"], block_repeated_sentences=True)))


# ---------------------------------------------------------------------- the metric
@pytest.mark.parametrize("answer, repeats", [
    ("Congratulations! Congratulations! Congratulations!", True),
    ("I'm not sure what you mean. I'm not sure what you mean.", True),
    ("I'm not sure what you mean.  i'm NOT sure what you mean!", True),  # case, punctuation, spaces
    ("How about you? How about you?", True),
    ("Congratulations! That's a great accomplishment!", False),  # two different sentences
    ("Congratulations on your new job. Congratulations.", False),
    ("I'm so sorry to hear that.", False),
    ("", False),
])
def test_repeated_sentences_on_hand_written_answers(answer, repeats):
    assert repeated_sentences([answer]) == {"repeated_sentence_share": float(repeats),
                                            "repeated_sentence_count": int(repeats)}


def test_repeated_sentence_share_counts_answers_not_sentences():
    answers = ["Wow! Wow! Wow!", "That is great. I am happy for you.", "Oh no. Oh no.", "Fine."]
    assert repeated_sentences(answers) == {"repeated_sentence_share": 0.5, "repeated_sentence_count": 2}
    assert repeated_sentences([]) == {"repeated_sentence_share": None, "repeated_sentence_count": 0}
    assert sentences("It costs 3.5 dollars... Really?!\nyes") == ["it costs 3 5 dollars", "really", "yes"]


# ---------------------------------------------------------------------- the shipped small weights
@pytest.fixture(scope="module")
def small_model():
    return Empatheia.from_preset("small")


def _ed_dialogues(tmp_path, ids):
    """The EmpatheticDialogues examples ``ids`` (``conv_id/turn``), in that order, read from
    the shared validation file as ``empatheia`` reads it."""
    from empatheia.data.readers import read_dataset

    conversations = {i.split("/")[0] for i in ids}
    lines = [line for line in shared_data("ed/ed_valid_conversations.jsonl").open(encoding="utf-8")
             if any(f'"{c}"' in line for c in conversations)]
    (tmp_path / "ed.jsonl").write_text("".join(lines), encoding="utf-8")
    found = {d.id: d for d in read_dataset(tmp_path / "ed.jsonl").dialogues}
    return [found[i] for i in ids]


def _chain_part(response):
    """The generated text up to the reply: the chain as the template writes it."""
    text = response.generated_text
    return text[: text.lower().index("the response is:")]


FREE = {"no_repeat_ngram_size": 0, "repetition_penalty": 1.0, "block_repeated_sentences": False,
        "generic_reply_penalty": 0.0}
"""Plain greedy decoding: no block, no penalty."""


@torch.no_grad()
def test_the_shipped_weights_stop_repeating_a_sentence_and_keep_the_chain(small_model, tmp_path):
    """A held-out dialogue whose plain greedy answer on the shipped weights says one
    sentence twice ("I'm so sorry to hear that. I'm so sorry to hear that."; 1 of the first
    160 held-out answers, docs/small_preset.md). `small`'s defaults, a drawn reply and each
    block alone end the repeat; the chain is written as before."""
    (dialogue,) = _ed_dialogues(tmp_path, ["hit:238_conv:476/1"])
    free = small_model.respond(dialogue, **FREE)
    assert free.text == "I'm so sorry to hear that. I'm so sorry to hear that.", free.text
    plain = {"generic_reply_penalty": 0.0}
    drawn = {"do_sample": True, "sample_chain": False, "seed": 0, **plain}
    sentences_only = {**FREE, "block_repeated_sentences": True}
    ngrams_only = {**plain, "block_repeated_sentences": False}
    for setting in ({}, drawn, sentences_only, ngrams_only):
        controlled = small_model.respond(dialogue, **setting)
        assert repeated_sentences([controlled.text])["repeated_sentence_count"] == 0, (setting, controlled.text)
        # The chain, template and all, is written as before; only the reply changed.
        assert controlled.chain.parsed and controlled.chain.speaker_emotion == free.chain.speaker_emotion
        assert _chain_part(controlled) == _chain_part(free)
        assert controlled.text and controlled.text != free.text


@torch.no_grad()
def test_the_shipped_four_step_chain_ends_the_steps_that_looped_in_the_two_step_core(small_model, tmp_path):
    """Three held-out dialogues whose chain, in the two-step core shipped before, looped
    and never reached the reply under plain greedy decoding (an event step that said one
    sentence over and over, "a big ol' tom tom tom ...", "I am so sad, I am so sad, ...").
    The four-step core, its template forced, ends every step and answers them without any
    block; with `small`'s blocks the chain is the same."""
    ids = ["hit:6796_conv:13592/1", "hit:10984_conv:21969/1", "hit:11928_conv:23856/1"]
    dialogues = _ed_dialogues(tmp_path, ids)
    free = small_model.respond(dialogues, **FREE)
    blocked = small_model.respond(dialogues)
    for before, after in zip(free, blocked):
        assert before.chain.parsed and chain_is_complete(before.chain) and before.text, before.generated_text
        assert "tom tom tom" not in before.generated_text and "I am so sad, I am so sad" not in before.generated_text
        assert _chain_part(after) == _chain_part(before)
        assert not _has_repeated_ngram(small_model.tokenizer(after.chain.event_scenario)["input_ids"], 3)


@torch.no_grad()
def test_the_shipped_chain_names_a_label_where_greedy_wrote_another_word(small_model, tmp_path):
    """A held-out dialogue whose freely decoded chain names a feeling that is no ED label
    ('contented'); with `small`'s choice among the labels (read from the speaker's words)
    the chain writes an ED label, the one it reports, and its event step does not change."""
    (dialogue,) = _ed_dialogues(tmp_path, ["hit:3121_conv:6242/3"])
    settings = small_model.config.language_model
    shipped = settings.choose_chain_emotion, settings.chain_emotion_context
    try:
        settings.choose_chain_emotion, settings.chain_emotion_context = False, "chain"
        free = small_model.respond(dialogue)
    finally:
        settings.choose_chain_emotion, settings.chain_emotion_context = shipped
    chosen = small_model.respond(dialogue)
    assert free.chain.speaker_emotion == "contented" and "contented" not in settings.chain_emotions
    assert chosen.chain.speaker_emotion in settings.chain_emotions
    assert chosen.chain.speaker_emotion == chosen.chain_emotion.label
    assert chosen.chain.event_scenario == free.chain.event_scenario


@torch.no_grad()
def test_the_shipped_chain_reads_the_emotion_with_the_text_readers(small_model, tmp_path):
    """Two held-out dialogues (a dog that died, a mother's cancer) whose chain the core alone
    reads as sad and terrified; fused with the shipped readers of the speaker's words
    (bag-of-words and sentence) it names the gold labels, sad and devastated. The event step
    is unchanged, and the reported distribution is the core's times the readers',
    renormalised."""
    from empatheia.variants.readers import load_text_readers, small_readers_folder, speaker_text

    wanted = {"hit:3810_conv:7621/1": ("sad", "sad"), "hit:4165_conv:8331/1": ("terrified", "devastated")}
    dialogues = _ed_dialogues(tmp_path, list(wanted))
    assert [d.emotion for d in dialogues] == [wanted[d.id][1] for d in dialogues]
    settings = small_model.config.language_model
    assert settings.chain_emotion_reader and settings.chain_emotion_reader_weight == 1.0
    try:
        settings.chain_emotion_reader_weight = 0.0
        alone = small_model.respond(dialogues)
    finally:
        settings.chain_emotion_reader_weight = 1.0
    fused = small_model.respond(dialogues)
    readers = load_text_readers(small_readers_folder())
    assert [reader.name for reader in readers] == ["text", "sentence"]
    for dialogue, before, after in zip(dialogues, alone, fused):
        core_label, gold = wanted[dialogue.id]
        assert before.chain.speaker_emotion == before.chain_emotion.label == core_label
        assert after.chain.speaker_emotion == after.chain_emotion.label == gold
        assert after.chain.event_scenario == before.chain.event_scenario
        assert speaker_text(dialogue)
        reads = [reader.read_fine(dialogue) for reader in readers]
        product = {label: p * reads[0][label] * reads[1][label] for label, p in before.chain_emotion.probabilities.items()}
        total = sum(product.values())
        for label, p in after.chain_emotion.probabilities.items():
            assert p == pytest.approx(product[label] / total, abs=2e-3), label


# ---------------------------------------------------------------------- the sweep
def test_decoding_sweep_runs_on_tiny(tmp_path):
    data = tmp_path / "ed.jsonl"
    data.write_text("".join(json.dumps(c) + "\n" for c in ED_CONVERSATIONS))
    result = subprocess.run(
        [sys.executable, "bench/decoding_sweep.py", "--preset", "tiny", "--data", str(data), "--limit", "2",
         "--max-new-tokens", "6", "--settings", "greedy", "no_repeat_3", "sample_t1.0_p0.95",
         "--json", str(tmp_path / "sweep.json")],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| greedy |" in result.stdout and "| sample_t1.0_p0.95 |" in result.stdout
    sweep = json.loads((tmp_path / "sweep.json").read_text())
    assert [row["setting"] for row in sweep["settings"]] == ["greedy", "no_repeat_3", "sample_t1.0_p0.95"]
    for row in sweep["settings"]:
        assert len(row["answers"]) == 2 == sweep["examples"]
        assert {"dist_1", "dist_2", "bleu_1", "bleu_2", "bleu_4", "repeated_sentence_share"} <= set(row)
    assert sweep["settings"][2]["decoding"] == {"do_sample": True, "temperature": 1.0, "top_p": 0.95, "seed": 0,
                                                "sample_chain": True, "no_repeat_ngram_size": 0,
                                                "repetition_penalty": 1.0, "block_repeated_sentences": False,
                                                "generic_reply_penalty": 0.0}


# ---------------------------------------------------------------------- the chain's template
def test_chain_template_forces_each_lead_in_and_leaves_the_steps_free():
    # Lead-ins [1 2], [3 4 5], [6]; 9 is a line break, 7 and 8 are words.
    template = ChainTemplate([[1, 2], [3, 4, 5], [6]], torch.arange(10) == 9)
    scores = torch.randn(7, 10)
    ids = torch.tensor([
        [7, 7, 7, 7, 7, 7],  # the first line went off its lead-in (never forced so): free
        [8, 8, 1, 2, 7, 9],  # a line break: the second lead-in's first token
        [1, 2, 7, 9, 3, 4],  # inside the second lead-in: its third token
        [8, 1, 2, 9, 3, 4],  # the same after a first line of other content
        [2, 9, 3, 4, 5, 7],  # the second step's content: free
        [7, 9, 7, 9, 7, 9],  # after as many line breaks as lead-ins: free
        [7, 9, 3, 4, 5, 9],  # the third lead-in
    ])
    out = template(ids, scores.clone())
    expected = {1: 3, 2: 5, 3: 5, 6: 6}
    for row in range(ids.shape[0]):
        if row in expected:
            assert int(out[row].argmax()) == expected[row] and torch.isinf(out[row]).sum() == 9, row
        else:
            torch.testing.assert_close(out[row], scores[row], rtol=0, atol=0)
    # A generation's first tokens are the first lead-in.
    first = template(torch.zeros(2, 0, dtype=torch.long), scores[:2].clone())
    assert first.argmax(1).tolist() == [1, 1]


def test_chain_lead_ins_follow_the_training_target(model):
    tokenizer = model.tokenizer
    leads = [tokenizer.decode(lead).strip() for lead in chain_lead_ins(tokenizer)]
    assert leads == ["Firstly, the event scenario of this conversation is:", "Secondly, the emotion of the speaker is:",
                     "Thirdly, the emotion cause is:", "Fourthly, the goal to response is:", "Finally, the response is:"]


@torch.no_grad()
def test_generation_writes_the_chain_template_on_tiny():
    config = EmpatheiaConfig.from_preset("tiny", {"language_model.force_chain_template": True})
    model = Empatheia(config).eval().merge_adapter()
    written = model.generate_text(_dialogues(), PromptMode.FULL, 16)
    # Random weights write no line break, so each row spells the first lead-in, then writes freely.
    for text in written.texts:
        assert text.startswith("Firstly, the event scenario of this conversation is:"), text
    styled = model.generate_text(_dialogues()[:1], PromptMode.STYLE, 4)  # no chain in this layout: nothing forced
    assert not styled.texts[0].startswith("Firstly")


# ---------------------------------------------------------------------- the chain's emotion
def test_chain_emotion_choice_picks_the_likeliest_label_and_spells_it():
    # Lead-in 1 2; labels spelled [10], [11, 12] and [13, 14, 15].
    choice = ChainEmotionChoice([1, 2], [[10], [11, 12], [13, 14, 15]])
    scores = torch.zeros(6, 20)
    scores[:, 5] = 9.0  # a word that is no label scores highest everywhere
    scores[:, 11], scores[:, 13] = 2.0, 1.0
    ids = torch.tensor([
        [4, 4, 4, 4, 4],    # wrote no lead-in: untouched
        [4, 4, 4, 1, 2],    # just wrote the lead-in: the likeliest label's first token alone
        [4, 4, 1, 2, 11],   # spelling label 1: its second token
        [4, 1, 2, 11, 12],  # label 1 spelled out: writes on freely
        [1, 2, 13, 14, 7],  # as many tokens written as label 2 has: writes on freely
        [4, 4, 1, 2, 13],   # spelling label 2: its second token
    ])
    out = choice(ids, scores.clone())
    assert torch.equal(out[0], scores[0]) and torch.equal(out[3], scores[3]) and torch.equal(out[4], scores[4])
    for row, token in ((1, 11), (2, 12), (5, 14)):
        assert out[row].argmax() == token and torch.isinf(out[row]).sum() == 19
    with pytest.raises(ValueError, match="first tokens must differ"):
        ChainEmotionChoice([1, 2], [[10], [10, 12]])


def test_emotion_step_tokens_follow_the_training_target(model):
    labels = ["sad", "happy", "apprehensive"]
    marker, spellings = emotion_step_tokens(model.tokenizer, labels)
    assert model.tokenizer.decode(marker).strip() == "the emotion of the speaker is:"
    assert [model.tokenizer.decode(s) for s in spellings] == [f" {label}\n" for label in labels]


@torch.no_grad()
def test_generation_writes_the_likeliest_trained_emotion(monkeypatch):
    labels = ["sad", "happy", "apprehensive"]
    config = EmpatheiaConfig.from_preset("tiny", {"language_model.chain_emotions": labels})
    model = Empatheia(config).eval().merge_adapter()
    items = _dialogues()[:1]
    free = model.generate_text(items, PromptMode.FULL, 12)
    # Random weights never write the emotion step's lead-in: let the third token the row
    # wrote stand for it, so the choice falls right after its first occurrence.
    lead = int(free.sequences[0, 2])
    _, spellings = emotion_step_tokens(model.tokenizer, labels)
    monkeypatch.setattr("empatheia.modeling.emotion_step_tokens", lambda tokenizer, names: ([lead], spellings))
    model.config.language_model.choose_chain_emotion = True
    chosen = model.generate_text(items, PromptMode.FULL, 12, score_steps=12)
    row = chosen.sequences[0].tolist()
    at = row.index(lead) + 1
    firsts = torch.tensor([s[0] for s in spellings])
    likeliest = spellings[int(chosen.scores[at][0][firsts].argmax())]  # the model's own scores at that step
    assert row[:at] == free.sequences[0, :at].tolist()  # nothing before the lead-in changed
    assert row[at : at + len(likeliest)] == likeliest
    # Sampling draws after the choice, so it draws the likeliest label too, whatever the seed.
    raw = torch.randn(1, len(model.tokenizer), generator=torch.Generator().manual_seed(1))
    raw[0, firsts] = torch.tensor([0.0, 0.5, 1.0])  # the last label is the likeliest
    for seed in range(5):
        scores = raw.clone()
        for processor in model._decoding_processors(PromptMode.FULL, Decoding(do_sample=True, temperature=2.0, seed=seed)):
            scores = processor(torch.tensor([[lead]]), scores)
        assert int(scores.argmax()) == int(firsts[2])
    with pytest.raises(ValueError, match="needs language_model.chain_emotions"):
        EmpatheiaConfig.from_preset("tiny", {"language_model.choose_chain_emotion": True})
