"""Time the model's training stages and respond() on a preset; prints numbers only.

    python bench/bench_model.py --preset tiny
    python bench/bench_model.py --preset paper-random --device cuda --dtype bfloat16 --batch 4

``paper-random`` is the paper preset's true architecture with random weights (nothing
is downloaded), for throughput and memory on a GPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from empatheia import Empatheia, EmpatheiaConfig  # noqa: E402
from empatheia.modeling import _to  # noqa: E402
from tests.conftest import full_batch, make_dialogue  # noqa: E402

PAPER_RANDOM = {
    "language_model.pretrained": None,
    "speech_encoder.pretrained": None,
    "video_encoder.pretrained": None,
    "language_model.tokenizer": "builtin",
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=["tiny", "paper-random"], default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    start = time.perf_counter()
    if args.preset == "tiny":
        config = EmpatheiaConfig.from_preset("tiny")
    else:
        # The generated clips are flat colours with no face to crop.
        config = EmpatheiaConfig.from_preset("paper", {**PAPER_RANDOM, "video_encoder.face_crop": False})
    # Random weights initialise on the device: a 7.7 B model's fp32 init on the CPU takes minutes.
    with device:
        model = Empatheia(config, dtype=dtype)
    model.to(device)
    print(f"build: {time.perf_counter() - start:.2f} s on {device} ({args.preset}, {args.dtype})")

    dialogues = [make_dialogue(3, seed=i) for i in range(args.batch)]
    batch = _to(full_batch(model, dialogues), device)
    tokens = int(batch["attention_mask"].sum())
    print(f"batch: {args.batch} dialogues, {tokens} tokens, sequence length {batch['input_ids'].shape[1]}")
    for stage in (1, 2, 3, 4):
        model.set_stage(stage).train()
        for _ in range(2):  # warm-up
            model(batch)["loss"].backward()
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        _sync(device)
        start = time.perf_counter()
        for _ in range(args.steps):
            model(batch)["loss"].backward()
        _sync(device)
        seconds = (time.perf_counter() - start) / args.steps
        memory = f", peak {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB" if device.type == "cuda" else ""
        print(f"stage {stage}: {seconds * 1000:.1f} ms per forward+backward, {tokens / seconds:,.0f} tokens/s{memory}")
        model.zero_grad(set_to_none=True)

    model.eval()
    model.respond(dialogues[:1], max_new_tokens=4)  # warm-up
    for size in (1, args.batch):
        _sync(device)
        start = time.perf_counter()
        model.respond(dialogues[:size], max_new_tokens=args.new_tokens)
        _sync(device)
        seconds = time.perf_counter() - start
        print(f"respond: batch {size}, up to {args.new_tokens} new tokens: {seconds:.2f} s")


if __name__ == "__main__":
    main()
