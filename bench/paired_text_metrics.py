"""Two `empatheia eval` runs over the same examples, their text metrics compared paired.

    python bench/paired_text_metrics.py runs/small/eval_heldout_generic03_t8 runs/small/eval_heldout_default

Reads each run's predictions.jsonl and the references.jsonl of the first, matches the
answers by ``id`` and prints corpus BLEU-1..4 and Dist-1/2 of both runs, A minus B, the
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
from typing import Dict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from empatheia.evaluation.text import compare_paired_text  # noqa: E402


def read_jsonl(path: Path, field: str) -> Dict[str, str]:
    """``id`` -> ``field`` of each line of ``path``."""
    out = {}
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if "id" not in row or field not in row:
                raise SystemExit(f"{path}:{number}: a line without 'id' or '{field}'")
            out[row["id"]] = row[field]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path, help="the eval run (its --out folder) compared")
    parser.add_argument("b", type=Path, help="the eval run it is compared with")
    parser.add_argument("--resamples", type=int, default=2_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()
    a = read_jsonl(args.a / "predictions.jsonl", "text")
    b = read_jsonl(args.b / "predictions.jsonl", "text")
    references = read_jsonl(args.a / "references.jsonl", "response")
    for name, run in (("A", a), ("B", b)):
        missing = sorted(set(references) - set(run))
        extra = sorted(set(run) - set(references))
        if missing or extra:
            raise SystemExit(f"run {name} ({args.a if name == 'A' else args.b}) does not answer the same examples: "
                             f"{len(missing)} missing (first {missing[:3]}), {len(extra)} not in the references "
                             f"(first {extra[:3]})")
    ids = list(references)
    compared = compare_paired_text([a[i] for i in ids], [b[i] for i in ids], [references[i] for i in ids],
                                   resamples=args.resamples, seed=args.seed)
    print(f"{len(ids)} examples; A = {args.a}, B = {args.b}; {args.resamples} resamples, seed {args.seed}\n")
    print("| metric | A | B | A - B | 95 % interval | p |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, metric in compared.items():
        interval = "–" if metric.interval is None else f"{metric.interval[0]:+.4f} to {metric.interval[1]:+.4f}"
        label = name.replace("bleu_", "BLEU-").replace("dist_", "Dist-")
        print(f"| {label} | {metric.a:.4f} | {metric.b:.4f} | {metric.difference:+.4f} "
              f"| {interval} | {metric.p_value:.3g} |")
    if args.json:
        args.json.write_text(json.dumps({"examples": len(ids), "a": str(args.a), "b": str(args.b),
                                         "resamples": args.resamples, "seed": args.seed,
                                         "metrics": {k: asdict(v) for k, v in compared.items()}}, indent=2) + "\n")


if __name__ == "__main__":
    main()
