"""Two `empatheia eval` runs over the same examples, their text metrics compared paired.

    python bench/paired_text_metrics.py runs/small/eval_heldout_generic03_t8 runs/small/eval_heldout_default

Reads each run's predictions.jsonl and the references.jsonl of the first, matches the
answers by ``id`` (:func:`empatheia.evaluation.records.pair_runs`) and prints corpus BLEU-1..4 and Dist-1/2 of both runs, A minus B, the
paired approximate-randomisation p-value and, for BLEU, the paired-bootstrap 95 % interval
(:func:`empatheia.evaluation.text.compare_paired_text`; Dist-n gets no interval, see
there). Both runs must hold the same examples: an id in one and not the other is an error
naming it. ``--json FILE`` also writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from empatheia.errors import DataError  # noqa: E402
from empatheia.evaluation.records import pair_runs  # noqa: E402
from empatheia.evaluation.text import compare_paired_text  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path, help="the eval run (its --out folder) compared")
    parser.add_argument("b", type=Path, help="the eval run it is compared with")
    parser.add_argument("--resamples", type=int, default=2_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()
    try:
        triples = pair_runs(args.a, args.b)
    except DataError as error:
        raise SystemExit(f"error: {error}") from None
    compared = compare_paired_text([a["text"] for a, _, _ in triples], [b["text"] for _, b, _ in triples],
                                   [reference["response"] for _, _, reference in triples],
                                   resamples=args.resamples, seed=args.seed)
    print(f"{len(triples)} examples; A = {args.a}, B = {args.b}; {args.resamples} resamples, seed {args.seed}\n")
    print("| metric | A | B | A - B | 95 % interval | p |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, metric in compared.items():
        interval = "–" if metric.interval is None else f"{metric.interval[0]:+.4f} to {metric.interval[1]:+.4f}"
        label = name.replace("bleu_", "BLEU-").replace("dist_", "Dist-")
        print(f"| {label} | {metric.a:.4f} | {metric.b:.4f} | {metric.difference:+.4f} "
              f"| {interval} | {metric.p_value:.3g} |")
    if args.json:
        args.json.write_text(json.dumps({"examples": len(triples), "a": str(args.a), "b": str(args.b),
                                         "resamples": args.resamples, "seed": args.seed,
                                         "metrics": {k: asdict(v) for k, v in compared.items()}}, indent=2) + "\n")


if __name__ == "__main__":
    main()
