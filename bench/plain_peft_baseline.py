"""Stage-1-like LoRA training in plain transformers + PEFT, the yardstick for
``bench/bench_training.py``'s stage 1; prints numbers only.

    python bench/plain_peft_baseline.py                        # Vicuna-7B-shaped Llama, random, on the GPU
    python bench/plain_peft_baseline.py --size tiny --device cpu --steps 3

A Llama of the paper's language-model shape with random weights in bf16, LoRA r 16 /
alpha 32 on ``--targets``, AdamW on the adapters, bf16 autocast, no KV cache, batches of
``--batch`` rows of ``--tokens`` random tokens with no padding: the least a training step of
the same model can cost without our encoders, heads, data pipeline or DeepSpeed.
"""

from __future__ import annotations

import argparse
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

SIZES = {
    # Vicuna-7B v1.5 (Llama 2 7B) shape.
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4, vocab_size=512, max_position_embeddings=2048),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="7b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=1024, help="tokens per row")
    parser.add_argument("--steps", type=int, default=10, help="timed steps, after 3 warm-up steps")
    parser.add_argument("--targets", default="q_proj,v_proj", help="LoRA target modules, comma-separated")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    args = parser.parse_args()

    device = torch.device(args.device)
    config = LlamaConfig(**SIZES[args.size], attn_implementation="sdpa")
    start = time.perf_counter()
    with device:
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.enable_input_require_grads()
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05,
                                             target_modules=args.targets.split(",")))
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=5e-5)
    print(f"build: {time.perf_counter() - start:.1f} s, {sum(p.numel() for p in model.parameters()) / 1e9:.3f} B "
          f"parameters, {sum(p.numel() for p in trainable) / 1e6:.1f} M trainable")

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (args.batch, args.tokens), generator=generator).to(device)

    def step() -> float:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()  # waits for the step, on any device

    for _ in range(3):
        step()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    seconds = (time.perf_counter() - start) / args.steps
    tokens = args.batch * args.tokens
    print(f"step: {seconds * 1000:.0f} ms  ->  {tokens / seconds:,.0f} tokens/s ({args.batch} x {args.tokens} tokens, "
          f"LoRA on {args.targets}{', gradient checkpointing' if args.gradient_checkpointing else ''}), loss {loss:.3f}")
    if device.type == "cuda":
        print(f"peak GPU memory: {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB")


if __name__ == "__main__":
    main()
