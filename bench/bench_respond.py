"""Warm ``respond`` against plain transformers ``generate`` of the same base model.

    python bench/bench_respond.py --preset small
    python bench/bench_respond.py --preset paper-random --device cuda --modes text

In one process: loads the preset, answers one example dialogue
(``examples/dialogues.json``, ``--conversation``) once to warm up, then ``--repeats``
times in each mode:

* ``text``: ``model.respond(dialogue)``, the text, chain, emotions and generator features;
* ``speech``: the same with ``speak=True``;
* ``video``: with ``speak=True, animate=True``.

The plain model is the preset's base language model loaded on its own with transformers
(``paper-random``: built from the same architecture), fed the token ids of the very prompt
``respond`` wrote from and made to write exactly as many new tokens (greedy,
``min_new_tokens = max_new_tokens``).

Each mode's fastest run is split into parts by timing the model's own steps: ``encode
media`` (the user's speech and face), ``prefill`` (the prompt's pass through the language
model), ``decode`` (the rest of generation), ``signal pass`` (the signal tokens on top of
the generation's cache), ``heads`` (Content Synchronizer, Style Disentangler, the chain's
emotion), ``speech`` and ``video`` (the generators) and ``other`` (tokenizing, parsing,
packaging). Decode tokens/s count the tokens written after the first (which the prefill
gives). Prints a table and, with ``--json``, writes the numbers.

``paper-random`` is the paper preset's architecture with random weights (nothing is
downloaded); its generators need their checkpoints, so use ``--modes text`` there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_model import PAPER_RANDOM  # noqa: E402

MODES = {"text": {}, "speech": {"speak": True}, "video": {"speak": True, "animate": True}}
PARTS = ("encode media", "prefill", "decode", "signal pass", "heads", "speech", "video")


class Clock:
    """Seconds spent in each part of one call, from wrappers and hooks on the model's own
    steps (synchronising the GPU around each, so parts do not bleed into each other)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.seconds: Dict[str, float] = {}
        self.phase: Optional[str] = None  # "generate" while the language model writes
        self.decoder_calls = 0
        self._entered = 0.0

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def add(self, part: str, seconds: float) -> None:
        self.seconds[part] = self.seconds.get(part, 0.0) + seconds

    def reset(self) -> None:
        self.seconds, self.phase, self.decoder_calls = {}, None, 0

    def wrap(self, part: str, function: Callable, on_enter: Optional[Callable] = None) -> Callable:
        def timed(*args, **kwargs):
            if on_enter is not None:
                on_enter()
            self.sync()
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.sync()
                self.add(part, time.perf_counter() - start)

        return timed

    def watch_decoder(self, decoder: torch.nn.Module) -> None:
        """The first pass of the decoder while generating is the prefill."""

        def before(module, args, kwargs):
            self.sync()
            self._entered = time.perf_counter()

        def after(module, args, kwargs, output):
            self.sync()
            if self.phase == "generate":
                self.decoder_calls += 1
                if self.decoder_calls == 1:
                    self.add("prefill", time.perf_counter() - self._entered)

        decoder.register_forward_pre_hook(before, with_kwargs=True)
        decoder.register_forward_hook(after, with_kwargs=True)


def instrument(model, clock: Clock) -> None:
    """Time ``model``'s steps in ``clock`` (wrappers on this instance only)."""

    def generating():
        clock.phase, clock.decoder_calls = "generate", 0

    generate = clock.wrap("generate", model.language_model.generate, on_enter=generating)

    def generate_then_stop(*args, **kwargs):
        try:
            return generate(*args, **kwargs)
        finally:
            clock.phase = None

    model.language_model.generate = generate_then_stop
    clock.watch_decoder(model._hf_model().base_model)
    model.encode_media = clock.wrap("encode media", model.encode_media)
    model.answer_hidden_states = clock.wrap("signal pass", model.answer_hidden_states)
    model.content_synchronizer.forward = clock.wrap("heads", model.content_synchronizer.forward)
    model.style_disentangler.forward = clock.wrap("heads", model.style_disentangler.forward)
    model.chain_emotion_scores = clock.wrap("heads", model.chain_emotion_scores)
    speech, talking_head = model.generators()
    speech.synthesize = clock.wrap("speech", speech.synthesize)
    talking_head.animate = clock.wrap("video", talking_head.animate)


def plain_model(model, dtype: Optional[torch.dtype]):
    """The preset's base language model, loaded on its own with transformers."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from empatheia.pretrained import converted_gguf_model, resolve_pretrained

    lm = model.config.language_model
    if lm.pretrained:
        source = converted_gguf_model(lm) if lm.gguf_file else resolve_pretrained(lm.pretrained)
        plain = AutoModelForCausalLM.from_pretrained(str(source), dtype=dtype)
    else:
        architecture = {"vocab_size": len(model.tokenizer), **lm.architecture}
        plain = AutoModelForCausalLM.from_config(AutoConfig.for_model(lm.model_type, **architecture))
        if dtype is not None:
            plain.to(dtype)
    return plain.to(model.device).eval()


def run_plain(plain, input_ids: torch.Tensor, new_tokens: int, clock: Clock, pad: int) -> Dict[str, float]:
    clock.reset()
    clock.phase, clock.decoder_calls = "generate", 0
    clock.sync()
    start = time.perf_counter()
    with torch.no_grad():
        plain.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad)
    clock.sync()
    total = time.perf_counter() - start
    clock.phase = None
    return {"total": total, "prefill": clock.seconds["prefill"], "decode": total - clock.seconds["prefill"]}


def summarise(runs: List[Dict[str, float]], new_tokens: int) -> Dict[str, float]:
    best = min(runs, key=lambda r: r["total"])
    out = {"total": best["total"], "runs": [round(r["total"], 4) for r in runs]}
    out.update({part: best.get(part, 0.0) for part in PARTS})
    if "generate" in best:
        out["decode"] = best["generate"] - best.get("prefill", 0.0)
    out["other"] = best["total"] - sum(out[p] for p in PARTS)
    out["decode_tokens_per_s"] = (new_tokens - 1) / out["decode"] if out["decode"] > 0 else float("nan")
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=["tiny", "small", "paper-random"], default="small")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                        help="the language model's weights (auto: bfloat16 on a GPU, else the preset's)")
    parser.add_argument("--conversation", default="00001", help="which dialogue of examples/dialogues.json")
    parser.add_argument("--modes", default="text,speech,video", help="comma-separated: text, speech, video")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each mode and of the plain model")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args(argv)

    from empatheia import Empatheia
    from empatheia.data import read_dataset
    from empatheia.prompts import PromptMode

    device = torch.device(args.device)
    dtype = {"auto": torch.bfloat16 if device.type == "cuda" else None, "float32": torch.float32,
             "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise SystemExit(f"error: --modes: unknown {unknown}; choose from {list(MODES)}")

    start = time.perf_counter()
    if args.preset == "paper-random":
        model = Empatheia.from_preset("paper", PAPER_RANDOM, dtype=dtype, trained=False)
    else:
        model = Empatheia.from_preset(args.preset, dtype=dtype)
    model.to(device)
    load_seconds = time.perf_counter() - start
    dialogues = read_dataset(REPO / "examples" / "dialogues.json", labels=model.label_sets()).dialogues
    matches = [d for d in dialogues if args.conversation in (d.id, d.id.split("/")[0])]
    if not matches:
        raise SystemExit(f"error: --conversation {args.conversation}: not in examples/dialogues.json "
                         f"(ids: {[d.id for d in dialogues]})")
    dialogue = matches[0]

    clock = Clock(device)
    if any(m != "text" for m in modes):
        model.generators()
    instrument(model, clock)
    tokens_written: List[int] = []
    model.language_model.generate = _counting(model.language_model.generate, tokens_written)

    warm = model.respond(dialogue, max_new_tokens=args.max_new_tokens, **MODES[modes[-1]])
    results: Dict[str, Dict[str, float]] = {}
    new_tokens = tokens_written[-1]
    for mode in modes:
        runs = []
        for _ in range(args.repeats):
            clock.reset()
            clock.sync()
            t0 = time.perf_counter()
            model.respond(dialogue, max_new_tokens=args.max_new_tokens, **MODES[mode])
            clock.sync()
            runs.append({"total": time.perf_counter() - t0, **clock.seconds})
            if tokens_written[-1] != new_tokens:
                raise RuntimeError(f"respond wrote {tokens_written[-1]} tokens after {new_tokens}: greedy runs differ")
        results[mode] = summarise(runs, new_tokens)

    # The plain model: the same prompt's token ids (the dialogue is typed, so the prompt has
    # no media placeholders) and the same number of new tokens.
    lm = model.config.language_model
    reserve = (args.max_new_tokens or lm.max_new_tokens) + 2 * lm.num_signal_tokens + 1
    prompt = model.processor.encode(dialogue, PromptMode.FULL, reserve=reserve)
    input_ids = torch.as_tensor(prompt.input_ids, device=device).unsqueeze(0)
    plain = plain_model(model, dtype)
    clock.watch_decoder(plain.base_model)
    run_plain(plain, input_ids, new_tokens, clock, model.token_ids.pad)  # warm-up
    plain_runs = [run_plain(plain, input_ids, new_tokens, clock, model.token_ids.pad) for _ in range(args.repeats)]
    best_plain = min(plain_runs, key=lambda r: r["total"])
    best_plain["decode_tokens_per_s"] = (new_tokens - 1) / best_plain["decode"]
    best_plain["runs"] = [round(r["total"], 4) for r in plain_runs]

    report = {
        "preset": args.preset,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "dtype": str(next(model.language_model.parameters()).dtype),
        "load_seconds": round(load_seconds, 2),
        "dialogue": dialogue.id,
        "prompt_tokens": int(input_ids.shape[1]),
        "new_tokens": new_tokens,
        "answer": warm.text,
        "plain_generate": best_plain,
        "respond": results,
    }
    if "text" in results:
        report["decode_speed_vs_plain"] = results["text"]["decode_tokens_per_s"] / best_plain["decode_tokens_per_s"]
        report["text_respond_vs_plain_generate"] = results["text"]["total"] / best_plain["total"]
    print(_table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


def _counting(generate: Callable, written: List[int]) -> Callable:
    def counted(*args, **kwargs):
        output = generate(*args, **kwargs)
        written.append(int(output.sequences.shape[1]))
        return output

    return counted


def _table(report: dict) -> str:
    plain = report["plain_generate"]
    lines = [
        f"{report['preset']} on {report['device']} ({report['threads']} threads, {report['dtype']}); "
        f"dialogue {report['dialogue']}: {report['prompt_tokens']} prompt tokens, {report['new_tokens']} new tokens; "
        f"best of {len(plain['runs'])} warm runs",
        f"answer: {report['answer']!r}",
        "",
        f"{'':22}{'total s':>9}{'decode tok/s':>14}  " + "".join(f"{p:>13}" for p in PARTS + ("other",)),
        f"{'plain generate':22}{plain['total']:9.3f}{plain['decode_tokens_per_s']:14.1f}  "
        f"{'':>13}{plain['prefill']:13.3f}{plain['decode']:13.3f}",
    ]
    for mode, r in report["respond"].items():
        shares = "".join(f"{r[p]:9.3f} {100 * r[p] / r['total']:2.0f}%" for p in PARTS + ("other",))
        lines.append(f"{'respond, ' + mode:22}{r['total']:9.3f}{r['decode_tokens_per_s']:14.1f}  {shares}")
    if "decode_speed_vs_plain" in report:
        lines += ["", f"decode tokens/s, respond / plain: {report['decode_speed_vs_plain']:.2f}x",
                  f"text-only respond / plain generate, whole call: {report['text_respond_vs_plain_generate']:.2f}x"]
    return "\n".join(lines)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
