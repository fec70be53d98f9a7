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

from empatheia import Dialogue, Empatheia, EmpatheiaConfig, Turn
from empatheia.cli import main
from empatheia.decoding import Decoding
from empatheia.evaluation.text import repeated_sentences, sentences
from empatheia.logits_processors import (ChainEmotionChoice, ReplyRepetitionControl, SeededSampling, emotion_step_tokens,
                                         reply_markers, reply_starts)
from empatheia.prompts import PromptMode
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


# ---------------------------------------------------------------------- the processors
def test_reply_starts_after_the_first_marker():
    ids = torch.tensor([[5, 1, 2, 6, 1, 2], [3, 1, 2, 7, 7, 7], [5, 5, 5, 5, 5, 5], [1, 5, 5, 5, 5, 1]])
    assert reply_starts(ids, [torch.tensor(m) for m in MARKERS]).tolist() == [3, 3, 6, 6]
    assert reply_starts(ids[:, :0], [torch.tensor([1, 2])]).tolist() == [0, 0, 0, 0]


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


def test_decoding_settings_check_their_values_and_fill_in_the_config():
    for bad in ({"temperature": 0}, {"top_p": 1.5}, {"seed": -1}, {"no_repeat_ngram_size": -2},
                {"repetition_penalty": 0.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Decoding(**bad)
    language_model = EmpatheiaConfig.from_preset("tiny", {"language_model.repetition_penalty": 1.2}).language_model
    resolved = Decoding(no_repeat_ngram_size=0).resolved(language_model)
    assert (resolved.no_repeat_ngram_size, resolved.repetition_penalty) == (0, 1.2)
    assert resolved.record() == {"do_sample": False, "no_repeat_ngram_size": 0, "repetition_penalty": 1.2}
    sampled = Decoding(do_sample=True, seed=7).resolved(language_model).record()
    assert sampled == {"do_sample": True, "temperature": 0.7, "top_p": 0.9, "seed": 7, "no_repeat_ngram_size": 3,
                       "repetition_penalty": 1.2}
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
    # One dialogue answered in stages draws as respond does for it alone.
    (_, staged), = model.respond_in_stages(items[0], max_new_tokens=16, do_sample=True, seed=11)
    assert staged.text == model.respond(items[0], max_new_tokens=16, do_sample=True, seed=11).text


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
    with pytest.raises(SystemExit, match=r"--seed only apply with --sample"):
        main(["respond", str(EXAMPLE), "--preset", "tiny", "--out", str(tmp_path / "e"), "--seed", "1"])
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
            "--batch-size", "2", "--no-progress", "--sample", "--seed", "3", "--temperature", "1.2"]
    assert main(base) == 0
    recorded = {"do_sample": True, "temperature": 1.2, "top_p": 0.9, "seed": 3, "no_repeat_ngram_size": 3,
                "repetition_penalty": 1.0}
    assert json.loads((out / "run.json").read_text())["decoding"] == recorded
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["run"]["decoding"] == recorded
    assert metrics["repeated_sentence_count"] <= metrics["count"] == 3
    assert "repeated_sentence_share" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "Answers that repeat a sentence" in (out / "report.md").read_text()
    with pytest.raises(SystemExit, match=r"decoding: was .*'seed': 3.*now .*'seed': 4"):
        main([a if a != "3" else "4" for a in base])
    with pytest.raises(SystemExit, match=r"--sample, --no-repeat-ngram only apply with --checkpoint/--preset"):
        main(["eval", "--predictions", "p.jsonl", "--references", "r.jsonl", "--out", str(tmp_path / "s"),
              "--sample", "--no-repeat-ngram", "2"])


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


def _looping_dialogues(tmp_path):
    """Dialogues whose greedy answer on the shipped ``small`` weights repeats a sentence:
    a held-out EmpatheticDialogues conversation (``empatheia data split``'s eval.jsonl
    holds it) and two short pieces of good news."""
    from empatheia.data.readers import read_dataset

    conversations = shared_data("ed/ed_valid_conversations.jsonl")
    line = next(line for line in conversations.open(encoding="utf-8") if '"hit:596_conv:1193"' in line)
    (tmp_path / "lonely.jsonl").write_text(line, encoding="utf-8")
    lonely = next(d for d in read_dataset(tmp_path / "lonely.jsonl").dialogues if d.id == "hit:596_conv:1193/1")
    return [lonely, Dialogue([Turn("speaker", "I just got engaged!")]),
            Dialogue([Turn("speaker", "I finally graduated from college!")])]


def _chain_part(response):
    """The generated text up to the reply: the chain as the template writes it."""
    text = response.generated_text
    return text[: text.lower().index("the response is:")]


@torch.no_grad()
def test_the_shipped_weights_stop_repeating_a_sentence_and_keep_the_chain(small_model, tmp_path):
    dialogues = _looping_dialogues(tmp_path)
    free = small_model.respond(dialogues, no_repeat_ngram_size=0, repetition_penalty=1.0)
    # Today's greedy answers: "How about you? How about you?", "Congratulations! Congratulations! Congratulations!" (twice).
    assert repeated_sentences([r.text for r in free])["repeated_sentence_count"] == 3, [r.text for r in free]
    # small's default, 3-gram blocking, ends the loop of three tokens; "Congratulations!"
    # comes back after a space of its own, a 3-gram it never wrote, so only a 2-gram block or
    # the penalty end that one (docs/small_preset.md, Decoding and the chain's emotion).
    for setting, repeats in (({}, 2), ({"no_repeat_ngram_size": 2}, 0), ({"repetition_penalty": 1.2}, 0)):
        controlled = small_model.respond(dialogues, **setting)
        texts = [r.text for r in controlled]
        assert repeated_sentences(texts)["repeated_sentence_count"] == repeats, (setting, texts)
        assert not any("How about you? How about you?" in text for text in texts)
        for before, after in zip(free, controlled):
            # The chain, template and all, is written as before; only the reply changed.
            assert after.chain.parsed and after.chain.speaker_emotion == before.chain.speaker_emotion
            assert _chain_part(after) == _chain_part(before)
            assert after.text and after.text != before.text


@torch.no_grad()
def test_the_shipped_chain_names_a_label_where_greedy_wrote_another_word(small_model, tmp_path):
    """Two held-out dialogues whose greedy chain names a feeling that is no ED label
    ('loyal', 'contented'); chosen among the labels, the chain writes the label the model
    itself scores highest (faithful, content), and nothing before it changes."""
    from empatheia.data.readers import read_dataset

    wanted = {"hit:10147_conv:20294/1": ("loyal", "faithful"), "hit:3121_conv:6242/3": ("contented", "content")}
    conversations = {w.split("/")[0] for w in wanted}
    lines = [line for line in shared_data("ed/ed_valid_conversations.jsonl").open(encoding="utf-8")
             if any(f'"{c}"' in line for c in conversations)]
    (tmp_path / "ed.jsonl").write_text("".join(lines), encoding="utf-8")
    dialogues = [d for d in read_dataset(tmp_path / "ed.jsonl").dialogues if d.id in wanted]
    settings = small_model.config.language_model
    shipped = settings.choose_chain_emotion
    try:
        settings.choose_chain_emotion = False
        free = small_model.respond(dialogues)
        settings.choose_chain_emotion = True
        chosen = small_model.respond(dialogues)
    finally:
        settings.choose_chain_emotion = shipped
    for dialogue, before, after in zip(dialogues, free, chosen):
        greedy, label = wanted[dialogue.id]
        assert before.chain.speaker_emotion == greedy
        assert after.chain.speaker_emotion == label == after.chain_emotion.label
        assert after.chain.event_scenario == before.chain.event_scenario


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
                                                "no_repeat_ngram_size": 0, "repetition_penalty": 1.0}


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
