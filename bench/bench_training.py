"""Training throughput of a stage through the real recipe loop (DeepSpeed, checkpoints
off); prints numbers only.

    python bench/bench_training.py --preset tiny --stage 4
    python bench/bench_training.py --preset paper-random --stage 1 --batch 4 --steps 12 \
        --deepspeed configs/deepspeed/zero2.json
    python bench/bench_training.py --preset small --stage 1 --batch 8 --turns 3 --precision no   # then bf16

The data are generated: dialogues of ``--turns`` turns with speech and video per turn and
random gold features of the preset's sizes. ``paper-random`` is the paper architecture
with random weights (nothing is downloaded); ``small`` is the untrained small preset
(its packaged weights). Peak memory is the process's resident set on the CPU and
allocated memory on the GPU.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_model import PAPER_RANDOM  # noqa: E402
from empatheia import Empatheia, EmpatheiaConfig  # noqa: E402
from empatheia.config_loader import add_set_argument, parse_sets  # noqa: E402
from empatheia.data import extract_gold_features, gold_feature_sources, read_dataset  # noqa: E402
from empatheia.training import build_stage_data, load_train_config, train  # noqa: E402
from tests.training_helpers import STAGE_CONFIGS, _clip  # noqa: E402

SENTENCES = [
    "I have been thinking about what happened at work this week and it still bothers me a lot.",
    "My manager moved the deadline again without asking anyone, and now the whole team is stressed.",
    "I tried to explain that we need more time, but nobody seemed to listen to what I said.",
    "It makes me wonder whether I should look for another job where people respect each other.",
]


class RandomFeatures:
    """Seeded random gold features: content rows per speech unit of the response text (two
    per word, as the Content Synchronizer wants C^s, C^v and the unit ids row for row), one
    vector for styles; with ``units`` > 0, a column of unit ids below it."""

    def __init__(self, name: str, input: str, dim: int, per_unit: bool, units: int = 0):
        self.name, self.input, self.dim, self.per_unit, self.units = name, input, dim, per_unit, units

    def fingerprint(self) -> str:
        return f"random {self.name} {self.dim} {self.units}"

    def __call__(self, items):
        out = []
        for i, item in enumerate(items):
            generator = torch.Generator().manual_seed(i)
            if not self.per_unit:
                out.append(torch.randn(self.dim, generator=generator))
            elif self.units:
                out.append(torch.randint(0, self.units, (len(item.split()) * 2, 1), generator=generator))
            else:
                out.append(torch.randn(len(item.split()) * 2, self.dim, generator=generator))
        return out


def write_data(root: Path, examples: int, turns: int, config: EmpatheiaConfig, same_length: bool) -> Path:
    clips = root / "clips"
    clips.mkdir(parents=True)
    lines = []
    for e in range(examples):
        history = []
        for t in range(turns):
            role = "speaker" if t % 2 == 0 else "listener"
            offset = 0 if same_length else e
            text = " ".join(SENTENCES[(offset + t + k) % len(SENTENCES)] for k in range(3))
            history.append({"role": role, "text": text, **_clip(clips, f"{e}-{t}", 1.5, 150 + 10 * t, 20 * t)})
        lines.append(
            {
                "id": f"bench/{e}",
                "listener": {"age": "young", "gender": "female", "timbre": "mid"},
                "emotion": "annoyed",
                "history": history if turns % 2 == 1 else history[:-1],
                "response": {"text": "That sounds exhausting. " * 6, **_clip(clips, f"{e}-r", 2.0, 200, 90)},
                "chain": {"event_scenario": SENTENCES[0], "emotion_cause": SENTENCES[1], "goal_to_response": SENTENCES[3]},
            }
        )
    path = root / "train.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    cs, sd = config.content_synchronizer, config.style_disentangler
    extractors = [
        RandomFeatures("speech_content", "text", cs.speech_content_dim, True),
        RandomFeatures("video_content", "text", cs.video_content_dim, True),
        RandomFeatures("speech_style", "audio", sd.speech_style_dim, False),
        RandomFeatures("video_style", "video", sd.video_style_dim, False),
    ]
    if cs.unit_vocab_size > 0:
        extractors.append(RandomFeatures("speech_units", "text", 0, True, units=cs.unit_vocab_size))
    extract_gold_features(gold_feature_sources(read_dataset(path)), extractors, root / "gold", progress=False)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=["tiny", "small", "paper-random"], default="tiny")
    parser.add_argument("--stage", type=int, choices=[1, 2, 3, 4], default=4)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--deepspeed", default=None, help="a DeepSpeed JSON (default: ZeRO stage 0)")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--precision", choices=["auto", "bf16", "no"], default="auto", help="mixed_precision")
    parser.add_argument("--same-length", action="store_true", help="every example the same length (no padding)")
    add_set_argument(parser, 'override a model config key, e.g. language_model.lora.target_modules=[q_proj,v_proj]')
    args = parser.parse_args()

    preset, overrides = ("paper", PAPER_RANDOM) if args.preset == "paper-random" else (args.preset, {})
    # The generated clips are flat colours with no face to crop.
    overrides = {**overrides, "video_encoder.face_crop": False}
    overrides.update(parse_sets(args.set))
    config = EmpatheiaConfig.from_preset(preset, overrides)
    dtype = torch.bfloat16 if torch.cuda.is_available() and preset == "paper" else None
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        data_path = write_data(root, 2 * args.batch, args.turns, config, args.same_length)
        print(f"data: {time.perf_counter() - start:.1f} s for {2 * args.batch} examples of {args.turns} turns")
        sets = {
            "model.preset": preset, "data.train": str(data_path), "data.gold_features": str(root / "gold"),
            "data.media_root": None, "data.media_cache": None, "data.num_workers": 2, "output_dir": str(root / "run"), "max_steps": args.steps,
            "optim.batch_size": args.batch, "optim.gradient_accumulation_steps": 1, "logging_steps": 1,
            "save_steps": 10**6, "tensorboard": False, "progress": False, "deepspeed": args.deepspeed,
            "model.gradient_checkpointing": args.gradient_checkpointing, "mixed_precision": args.precision,
        }
        run_config = load_train_config(STAGE_CONFIGS[args.stage], [f"{k}={json.dumps(v)}" for k, v in sets.items()])
        start = time.perf_counter()
        # Random weights initialise far faster on the GPU than on the CPU (7.7 B parameters).
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
            model = Empatheia(config, dtype=dtype)
        print(f"build: {time.perf_counter() - start:.1f} s ({sum(p.numel() for p in model.parameters()) / 1e9:.3f} B parameters)")
        data = build_stage_data(run_config, model.processor, model.label_sets())
        tokens = [len(data.train[i].encoded.input_ids) for i in range(len(data.train))]
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        train(run_config, model, data)
        total = time.perf_counter() - start
        rows = [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]
        # Steady state: from the end of step 2 (after DeepSpeed's and the kernels' warm-up).
        step_seconds = (rows[-1]["seconds"] - rows[1]["seconds"]) / (len(rows) - 2)
        per_step = args.batch * float(np.mean(tokens))
        print(f"stage {args.stage} on {args.preset}: {np.mean(tokens):.0f} tokens/example, batch {args.batch}")
        print(f"step: {step_seconds * 1000:.0f} ms  ->  {per_step / step_seconds:,.0f} tokens/s, "
              f"{args.batch / step_seconds:.2f} examples/s (run incl. DeepSpeed init and final save: {total:.1f} s)")
        print(f"loss: {rows[0]['loss']:.4f} -> {rows[-1]['loss']:.4f}")
        if torch.cuda.is_available():
            print(f"peak GPU memory: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
        else:  # ru_maxrss is in KiB on Linux
            print(f"peak resident memory: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.1f} GiB")


if __name__ == "__main__":
    main()
