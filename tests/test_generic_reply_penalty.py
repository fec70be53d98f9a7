"""The penalty on generic openings (mutual-information decoding of the reply's first
tokens): the processor against a per-row reference, the context-free scorer against a
plain forward pass, the generation on the tiny preset (the text before the reply and the
signal pass's cache untouched), its settings, and its effect on the shipped ``small``
weights."""

from __future__ import annotations

import json
import math

import pytest
import torch

from empatheia import Empatheia, EmpatheiaConfig
from empatheia.cli import main
from empatheia.decoding import Decoding
from empatheia.logits_processors import GenericReplyPenalty, reply_markers
from empatheia.modeling import ContextFreeScorer
from empatheia.prompts import PromptMode

from .conftest import make_dialogue
from .test_decoding import ED_CONVERSATIONS, EXAMPLE, _full_batch_of

MARKERS = [[1, 2], [3, 1, 2]]
VOCAB = 9


class _TableScorer:
    """A context-free distribution that depends on the reply so far: row ``i`` of a fixed
    table picked by the sum of the reply's tokens, so a wrong reply gives other values."""

    def __init__(self, seed=0):
        self.table = torch.log_softmax(torch.randn(64, VOCAB + 2, generator=torch.Generator().manual_seed(seed)), -1)
        self.calls = []

    def __call__(self, replies, counts, rows=None):
        self.calls.append((replies.clone(), counts.clone()))
        keys = torch.stack([replies[i, : int(c)].sum() + 7 * c for i, c in enumerate(counts)])
        return self.table[keys % 64]


def _reference(ids, scores, scorer, weight, tokens, alpha, protected):
    """The penalty row by row, in plain Python."""
    out = scores.clone()
    for row, tokens_row in enumerate(ids.tolist()):
        starts = [at + len(m) for m in MARKERS for at in range(len(tokens_row) - len(m) + 1)
                  if tokens_row[at : at + len(m)] == m]
        if not starts:
            continue
        written = tokens_row[min(starts):]
        if len(written) >= tokens:
            continue
        free = scorer.table[(sum(written) + 7 * len(written)) % 64][:VOCAB]
        given = torch.log_softmax(scores[row].float(), -1)
        for token in range(VOCAB):
            if token in protected:
                out[row, token] = given[token]
            elif given[token] >= given.max() + math.log(alpha):
                out[row, token] = given[token] - weight * free[token]
            else:
                out[row, token] = float("-inf")
    return out


@pytest.mark.parametrize("weight, tokens, alpha", [(0.5, 4, 0.1), (1.0, 2, 0.5), (0.3, 6, 1.0)])
def test_penalty_matches_a_per_row_reference(weight, tokens, alpha):
    protected = [8]
    scorer = _TableScorer()
    penalty = GenericReplyPenalty(scorer, MARKERS, weight, tokens, alpha, protected=protected)
    generator = torch.Generator().manual_seed(1)
    for trial in range(30):
        length = 3 + trial % 9
        ids = torch.randint(4, VOCAB, (7, length), generator=generator)
        for row, at in enumerate([0, length - 2, length - 3, length - 5, 1, None, length - 2]):
            if at is not None and at >= 0:
                ids[row, at : at + 2] = torch.tensor([1, 2])  # the reply starts after it
        scores = torch.randn(7, VOCAB, generator=generator)
        got = penalty(ids, scores.clone())
        torch.testing.assert_close(got, _reference(ids, scores, scorer, weight, tokens, alpha, protected))


def test_penalty_leaves_rows_without_a_reply_alone_and_checks_its_settings():
    scorer = _TableScorer()
    penalty = GenericReplyPenalty(scorer, MARKERS, 0.5, 4)
    ids, scores = torch.tensor([[4, 5, 6, 7]]), torch.randn(1, VOCAB)
    assert penalty(ids, scores) is scores and not scorer.calls  # no reply begun: no side pass at all
    for bad in ({"weight": 0.0}, {"tokens": 0}, {"plausibility": 0.0}, {"plausibility": 1.5}):
        arguments = {**dict(weight=0.5, tokens=4, plausibility=0.1), **bad}
        with pytest.raises(ValueError, match="GenericReplyPenalty needs"):
            GenericReplyPenalty(scorer, MARKERS, **arguments)


@torch.no_grad()
def test_context_free_scorer_equals_a_plain_forward_pass():
    model = Empatheia.from_preset("tiny").eval()
    lm = model.language_model
    context = model.processor.context_free_prompt_ids(PromptMode.FULL)
    scorer = ContextFreeScorer(lm, context)
    replies = torch.tensor([[11, 12, 13], [0, 0, 0], [21, 0, 0], [31, 32, 0]])
    counts = torch.tensor([3, 0, 1, 2])
    for _ in range(2):  # the second call reuses the context's cache, unchanged by the first
        got = scorer(replies, counts)
        for row in range(4):
            ids = torch.cat([context, replies[row, : int(counts[row])]])[None]
            expected = torch.log_softmax(lm(input_ids=ids).logits[0, -1].float(), -1)
            torch.testing.assert_close(got[row], expected, atol=1e-4, rtol=1e-4)
    assert not scorer.running


def test_the_context_free_prompt_is_the_prompt_without_the_dialogue():
    model = Empatheia.from_preset("tiny")
    text = model.tokenizer.decode(model.processor.context_free_prompt_ids(PromptMode.FULL))
    full = model.processor.prompt_text(make_dialogue(1, audio=False, video=False), PromptMode.FULL)
    assert "Speaker:" not in text and "Speaker:" in full
    task_end = full.index("Dialogue context:") + len("Dialogue context:")
    assert text.replace(" ", "").startswith(full[:task_end].replace(" ", ""))


@torch.no_grad()
def test_generation_changes_only_the_reply_and_keeps_its_cache(monkeypatch):
    model = Empatheia.from_preset("tiny").eval().merge_adapter()
    items = [make_dialogue(3, seed=0), make_dialogue(1, audio=False, video=False, seed=1), make_dialogue(2, seed=2)]
    free = model.generate_text(items, PromptMode.FULL, 20, Decoding(generic_reply_penalty=0.0))
    # Random weights never write "the response is:"; the reply starts after the fourth
    # token the first row wrote (each row's first occurrence of it).
    marker = int(free.sequences[0, 3])
    starts = [row.tolist().index(marker) + 1 if marker in row.tolist() else None for row in free.sequences]
    monkeypatch.setattr("empatheia.modeling.reply_markers", lambda tokenizer, mode: [[marker]])
    penalised = model.generate_text(items, PromptMode.FULL, 20, Decoding(generic_reply_penalty=2.0), keep_cache=True)
    for before, after, start in zip(free.sequences, penalised.sequences, starts):
        if start is None:
            assert after.tolist() == before.tolist()
        else:
            assert after[:start].tolist() == before[:start].tolist()  # the text before the reply is untouched
    assert penalised.sequences.tolist() != free.sequences.tolist()
    # The side pass's hidden states stay out of the generation's cache: the signal pass on
    # it still equals a fresh pass over the text.
    batch = _full_batch_of(model, items, penalised)
    mask = batch["attention_mask"].bool()
    torch.testing.assert_close(model.answer_hidden_states(batch, penalised)[mask],
                               model.hidden_states(batch, media=penalised.media)[mask], atol=1e-5, rtol=1e-4)


def test_settings_check_their_values_and_reach_the_command_line(tmp_path):
    with pytest.raises(ValueError, match="generic_reply_penalty"):
        Decoding(generic_reply_penalty=-0.1)
    with pytest.raises(ValueError, match="language_model.generic_reply_penalty"):
        EmpatheiaConfig.from_preset("tiny", {"language_model.generic_reply_penalty": "high"})
    with pytest.raises(ValueError, match="language_model.generic_reply_tokens"):
        EmpatheiaConfig.from_preset("tiny", {"language_model.generic_reply_tokens": 0})
    language_model = EmpatheiaConfig.from_preset("tiny", {"language_model.generic_reply_penalty": 0.4}).language_model
    assert Decoding().resolved(language_model).record()["generic_reply_penalty"] == 0.4
    assert Decoding(generic_reply_penalty=0).resolved(language_model).record()["generic_reply_penalty"] == 0.0

    with pytest.raises(SystemExit, match="--generic-penalty: generic_reply_penalty must be a number"):
        main(["respond", str(EXAMPLE), "--preset", "tiny", "--out", str(tmp_path / "x"), "--generic-penalty", "-1"])
    assert main(["respond", str(EXAMPLE), "--preset", "tiny", "--out", str(tmp_path / "r"), "--max-new-tokens", "6",
                 "--generic-penalty", "0.5"]) == 0
    assert (tmp_path / "r" / "response.json").is_file()

    data = tmp_path / "ed.jsonl"
    data.write_text("".join(json.dumps(c) + "\n" for c in ED_CONVERSATIONS))
    base = ["eval", "--preset", "tiny", "--data", str(data), "--out", str(tmp_path / "run"), "--max-new-tokens", "4",
            "--batch-size", "2", "--no-progress"]
    assert main(base + ["--generic-penalty", "0.5"]) == 0
    assert json.loads((tmp_path / "run" / "run.json").read_text())["decoding"]["generic_reply_penalty"] == 0.5
    with pytest.raises(SystemExit, match=r"decoding: was .*'generic_reply_penalty': 0.5.*now .*0.0"):
        main(base)


def test_a_run_recorded_before_the_penalty_resumes_without_it(tmp_path):
    from empatheia.evaluation.model_runs import RunMismatchError, check_run_info

    older = {"model": "small", "decoding": {"do_sample": False, "no_repeat_ngram_size": 3, "repetition_penalty": 1.0,
                                            "block_repeated_sentences": True}}
    (tmp_path / "run.json").write_text(json.dumps(older))
    (tmp_path / "predictions.jsonl").write_text('{"id": "a"}\n')
    check_run_info(tmp_path, dict(older, decoding=dict(older["decoding"], generic_reply_penalty=0.0)))
    with pytest.raises(RunMismatchError, match="generic_reply_penalty"):
        check_run_info(tmp_path, dict(older, decoding=dict(older["decoding"], generic_reply_penalty=0.5)))


def test_a_run_records_how_many_reply_tokens_the_penalty_reached(tmp_path):
    """`small`'s count went from 4 to 6: a run written with 4 (recorded before the count
    was) resumes only with 4, and a run records the count whenever the penalty is on."""
    from empatheia.evaluation.model_runs import RunMismatchError, RunOptions, check_run_info

    settings = EmpatheiaConfig.from_preset("tiny", {"language_model.generic_reply_tokens": 6}).language_model
    decoding = Decoding(do_sample=False, no_repeat_ngram_size=3, repetition_penalty=1.0, block_repeated_sentences=True,
                        generic_reply_penalty=0.3)
    recorded = RunOptions(decoding=decoding, info={"model": "small"}).run_info(settings)
    assert recorded["decoding"]["generic_reply_penalty"] == 0.3 and recorded["decoding"]["generic_reply_tokens"] == 6
    greedy = RunOptions(info={"model": "small"}).run_info(settings)
    assert "generic_reply_tokens" not in greedy["decoding"]  # nothing to reach without the penalty

    older = {"model": "small", "decoding": {"do_sample": False, "no_repeat_ngram_size": 3, "repetition_penalty": 1.0,
                                            "block_repeated_sentences": True, "generic_reply_penalty": 0.3}}
    (tmp_path / "run.json").write_text(json.dumps(older))
    (tmp_path / "predictions.jsonl").write_text('{"id": "a"}\n')
    with pytest.raises(RunMismatchError, match="'generic_reply_tokens': 4}.*'generic_reply_tokens': 6}"):
        check_run_info(tmp_path, recorded)
    check_run_info(tmp_path, dict(older, decoding=dict(older["decoding"], generic_reply_tokens=4)))


@torch.no_grad()
def test_listener_turn_scorer_equals_a_plain_forward_pass_on_each_rows_context():
    model = Empatheia.from_preset("tiny").eval()
    lm = model.language_model
    from empatheia import Dialogue, Turn
    from empatheia.modeling import ListenerTurnScorer

    said = [Turn("listener", "Oh no. How are you holding up?")]
    contexts = [model.processor.context_free_prompt_ids(PromptMode.FULL, said),
                model.processor.context_free_prompt_ids(PromptMode.FULL)]
    assert contexts[0].numel() > contexts[1].numel()
    assert "Listener: Oh no. How are you holding up?" in model.tokenizer.decode(contexts[0])
    scorer = ListenerTurnScorer(lm, contexts, model.token_ids.pad)
    replies = torch.tensor([[11, 12, 13], [21, 0, 0], [0, 0, 0]])
    counts = torch.tensor([3, 1, 0])
    rows = torch.tensor([1, 0, 0])
    for _ in range(2):  # the second call reuses the contexts' cache, unchanged by the first
        got = scorer(replies, counts, rows=rows)
        for i in range(3):
            ids = torch.cat([contexts[int(rows[i])], replies[i, : int(counts[i])]])[None]
            expected = torch.log_softmax(lm(input_ids=ids).logits[0, -1].float(), -1)
            torch.testing.assert_close(got[i], expected, atol=1e-4, rtol=1e-4)
    assert not scorer.running

    # Wiring: the setting gives each row its listener's turns; rows without any get none.
    items = [Dialogue([Turn("speaker", "I lost my job."), *said, Turn("speaker", "Not great.")]),
             Dialogue([Turn("speaker", "I lost my job.")])]
    listening = Empatheia(EmpatheiaConfig.from_preset("tiny", {"language_model.generic_reply_context": "listener"}))
    prompts = [listening.processor.encode(d, PromptMode.FULL) for d in items]
    built = listening._context_free_scorer(PromptMode.FULL, items, prompts)
    assert isinstance(built, ListenerTurnScorer)
    lead = torch.as_tensor(reply_markers(listening.tokenizer, PromptMode.FULL)[-1])
    assert built.contexts[0].tolist() == torch.cat([contexts[0], lead]).tolist()
    assert built.contexts[1].tolist() == torch.cat([contexts[1], lead]).tolist()
    assert isinstance(model._context_free_scorer(PromptMode.FULL, items, prompts), ContextFreeScorer)
    with pytest.raises(ValueError, match="generic_reply_context must be 'none' or 'listener'"):
        EmpatheiaConfig.from_preset("tiny", {"language_model.generic_reply_context": "speaker"})
    # A run records it (only when on, so older runs resume).
    from empatheia.evaluation.model_runs import RunOptions

    on = listening.config.language_model
    on.generic_reply_penalty = 0.3
    assert RunOptions().run_info(on)["decoding"]["generic_reply_context"] == "listener"
    assert "generic_reply_context" not in RunOptions().run_info(model.config.language_model)["decoding"]
