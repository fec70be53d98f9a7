"""The inference path: the adapter merged for answering and restored exactly for training,
the signal pass on the generation's cache, the progress callback, and a command line that
starts without the model's libraries. No wall time is asserted here; the speed is
bench/bench_respond.py's."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft.tuners.trainable_tokens.layer import TrainableTokensLayer

from empatheia import Empatheia
from empatheia.loading import WritingProgress
from empatheia.modeling import _to
from empatheia.processing import Target
from empatheia.prompts import PromptMode, parse_chain

from .conftest import make_dialogue

REPO = Path(__file__).resolve().parents[1]


def trained_like(seed: int = 0) -> Empatheia:
    """A tiny model whose adapter is not the identity: LoRA's B starts at zero and the
    signal rows at the base rows, which would make merging a no-op."""
    model = Empatheia.from_preset("tiny")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.language_model.named_parameters():
            # Small next to the base rows (std 0.02), so signal tokens do not take over the text.
            scale = 0.05 if "lora_B" in name else 0.005 if "trainable_tokens_delta" in name else 0.0
            if scale:
                param.add_(torch.randn(param.shape, generator=generator) * scale)
    return model


def dialogues():
    return [make_dialogue(3, seed=0), make_dialogue(1, audio=False, video=False, seed=1), make_dialogue(2, seed=2)]


def assert_same_answers(first, second, atol=1e-5):
    for a, b in zip(first, second):
        assert a.text == b.text and a.generated_text == b.generated_text
        assert a.chain == b.chain
        assert a.emotion.label == b.emotion.label
        pairs = [(a.emotion, b.emotion)]
        if a.chain_emotion is not None or b.chain_emotion is not None:
            pairs.append((a.chain_emotion, b.chain_emotion))
        for x, y in pairs:
            assert list(x.probabilities) == list(y.probabilities)
            torch.testing.assert_close(torch.tensor(list(x.probabilities.values())),
                                       torch.tensor(list(y.probabilities.values())), atol=atol, rtol=0)
        for name in ("speech_content", "speech_style", "video_content", "video_style"):
            torch.testing.assert_close(getattr(a, name), getattr(b, name), atol=atol, rtol=1e-4)


def test_merged_and_unmerged_answers_agree(monkeypatch):
    model = trained_like()
    items = dialogues()
    merged = model.respond(items, max_new_tokens=12)
    assert model.adapter_merged
    # While merged, peft never rebuilds the vocabulary-sized matrices per token.
    monkeypatch.setattr(TrainableTokensLayer, "get_merged_weights",
                        lambda *a, **k: pytest.fail("the signal rows were copied per token while merged"))
    again = model.respond(items, max_new_tokens=12)
    monkeypatch.undo()
    assert_same_answers(merged, again, atol=0)

    model.unmerge_adapter()
    monkeypatch.setattr(model, "merge_adapter", lambda: model)  # answer on the unmerged adapter
    copies = []
    rebuild = TrainableTokensLayer.get_merged_weights
    monkeypatch.setattr(TrainableTokensLayer, "get_merged_weights",
                        lambda self, *a, **k: copies.append(1) or rebuild(self, *a, **k))
    unmerged = model.respond(items, max_new_tokens=12)
    assert not model.adapter_merged and len(copies) > 12  # peft's per-token path did run
    assert all(a.generated_text for a in merged)
    assert_same_answers(merged, unmerged)


def test_training_restores_the_unmerged_weights_exactly():
    model = trained_like()
    before = {k: v.clone() for k, v in model.language_model.state_dict().items()}
    model.respond(dialogues()[:1], max_new_tokens=4)
    assert model.adapter_merged
    changed = [k for k, v in model.language_model.state_dict().items() if not torch.equal(v, before[k])]
    assert any("q_proj.base_layer" in k for k in changed) and any("embed_tokens" in k for k in changed)

    model.train()
    assert not model.adapter_merged
    after = model.language_model.state_dict()
    assert sorted(after) == sorted(before)
    assert [k for k in before if not torch.equal(after[k], before[k])] == []
    # Gradients reach LoRA again.
    model.set_stage(1)
    from .conftest import full_batch

    model(full_batch(model, dialogues()[:1]))["loss"].backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0
               for n, p in model.language_model.named_parameters() if "lora_A" in n)


def test_moving_and_loading_while_merged_unmerge_first(tmp_path):
    model = trained_like()
    model.respond(dialogues()[:1], max_new_tokens=4)
    model.to(torch.float64)
    assert not model.adapter_merged
    model.to(torch.float32)

    other = trained_like(seed=1)
    other.save_pretrained(tmp_path / "other")
    model.respond(dialogues()[:1], max_new_tokens=4)
    assert model.adapter_merged
    model.load_trained_state_dict(Empatheia.read_trained_state(tmp_path / "other"))
    fresh = Empatheia.from_pretrained(tmp_path / "other")
    assert_same_answers(model.respond(dialogues(), max_new_tokens=8), fresh.respond(dialogues(), max_new_tokens=8))


def _full_batch_of(model, items, written):
    """The signal pass's batch, as respond builds it."""
    parsed = [parse_chain(text) for text in written.texts]
    full = [
        model.processor.encode(d, PromptMode.FULL, Target(response=r, chain=c, signals=True, eos=False),
                               first_turn=p.first_turn, load_media=False)
        for d, p, (c, r) in zip(items, written.prompts, parsed)
    ]
    return _to(model.processor.collate(full), model.device)


@torch.no_grad()
def test_signal_pass_on_the_cache_equals_a_second_prefill():
    model = trained_like().eval().merge_adapter()
    items = dialogues()
    written = model.generate_text(items, PromptMode.FULL, 16, keep_cache=True)
    batch = _full_batch_of(model, items, written)
    expected = model.hidden_states(batch, media=written.media)
    got = model.answer_hidden_states(batch, written)
    mask = batch["attention_mask"].bool()
    torch.testing.assert_close(got[mask], expected[mask], atol=1e-5, rtol=1e-4)


@torch.no_grad()
def test_signal_pass_reuses_every_written_token():
    """Where the text round-trips (the usual case with trained weights), only the signal
    tokens run through the model again: rows built from the generated tokens themselves."""
    model = trained_like().eval().merge_adapter()
    items = dialogues()
    written = model.generate_text(items, PromptMode.FULL, 10, keep_cache=True)
    cache = written.cache
    signals = torch.tensor(model.token_ids.signals)
    stops = set(model.tokenizer.all_special_ids)  # the end, the signals, and placeholders that would need media
    rows = []
    for row, prompt in enumerate(written.prompts):
        text = [int(t) for t in written.sequences[row]]
        text = text[: next((i for i, t in enumerate(text) if t in stops), len(text))]
        rows.append(torch.cat([prompt.input_ids, torch.tensor(text, dtype=torch.long), signals]))
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), model.token_ids.pad)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = r, 1
    batch = {"input_ids": ids, "attention_mask": mask}
    columns = cache.past_key_values.get_seq_length()
    expected = model.hidden_states(batch, media=written.media)
    got = model.answer_hidden_states(batch, written)
    torch.testing.assert_close(got[mask.bool()], expected[mask.bool()], atol=1e-5, rtol=1e-4)
    # Every written token came from the cache: the signal tokens ran on top of it, and
    # nothing else (but a row's last written token where it hit the length limit and was
    # never fed back, or its <AUD1> where it stopped there and that was fed back).
    added = cache.past_key_values.get_seq_length() - columns
    assert len(signals) - 1 <= added <= len(signals) + 1


def test_progress_counts_the_tokens_as_they_are_written():
    model = trained_like()
    seen = []
    model.respond(dialogues()[:1], max_new_tokens=6, progress=seen.append)
    assert seen == list(range(1, len(seen) + 1)) and 1 <= len(seen) <= 6


def test_writing_progress_line():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    line = WritingProgress(stream=terminal)
    for n in (1, 2, 3):
        line(n)
    line.done()
    line.done()
    shown = terminal.getvalue()
    assert shown.count("\r") == 3 and "writing the answer: 3 tokens" in shown.split("\r")[-1]
    assert shown.endswith("\n") and shown.count("\n") == 1

    # Not a terminal: whole lines, at most one per `every` seconds, and nothing to end.
    log = io.StringIO()
    every = WritingProgress(stream=log, every=0.0)
    every(5)
    every(6)
    every.done()
    assert log.getvalue().splitlines() == ["[empatheia] writing the answer: 5 tokens after 0s",
                                           "[empatheia] writing the answer: 6 tokens after 0s"]
    log = io.StringIO()
    rarely = WritingProgress(stream=log, every=3600.0)
    rarely(5)
    assert log.getvalue() == ""


def test_command_line_starts_without_the_model_libraries():
    code = (
        "import sys\n"
        "from empatheia.cli import build_parser\n"
        "build_parser()\n"
        "import empatheia, empatheia.data\n"
        "empatheia.__version__; empatheia.data.FORMATS\n"
        "heavy = [m for m in ('torch', 'transformers', 'peft', 'numpy') if m in sys.modules]\n"
        "print(heavy)\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    help_run = subprocess.run([sys.executable, "-m", "empatheia", "respond", "--help"], cwd=REPO,
                              capture_output=True, text=True, timeout=120)
    assert help_run.returncode == 0 and "--max-new-tokens" in help_run.stdout


def test_bench_respond_runs_on_tiny(tmp_path):
    result = subprocess.run(
        [sys.executable, "bench/bench_respond.py", "--preset", "tiny", "--modes", "text", "--repeats", "1",
         "--max-new-tokens", "8", "--json", str(tmp_path / "bench.json")],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "text-only respond / plain generate" in result.stdout
    import json

    report = json.loads((tmp_path / "bench.json").read_text())
    parts = report["respond"]["text"]
    assert report["new_tokens"] >= 1 and parts["signal pass"] > 0 and parts["prefill"] > 0
    # The parts are disjoint spans inside the call: none negative, and together no longer
    # than the call (what is left over, "other", is not negative either).
    named = ("encode media", "prefill", "decode", "signal pass", "heads", "speech", "video", "other")
    assert all(parts[p] >= 0 for p in named)
