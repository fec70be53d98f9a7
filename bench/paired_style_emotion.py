"""Two `empatheia eval` runs over the same examples: the emotion that styled their voices
and faces, compared paired.

    python bench/paired_style_emotion.py runs/small/eval_heldout_shipped runs/small/eval_heldout_generic03_t6

For each run: how often its ``emotion`` (the Style Disentangler's class, which styles the
voice and the face) is the reference's class, and how often it is the class of the run's
own chain emotion (``chain_emotion`` folded onto the classes, read through the label fold
of ``--labels`` or the built-in one). Then A against B on the reference, paired: the
difference, its bootstrap 95 % interval and McNemar's exact p-value
(:func:`empatheia.evaluation.baselines.compare_paired_accuracy`); and on how many examples
the two runs style differently. Both runs must hold the same examples: an id in one and
not the other is an error naming it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from empatheia.evaluation.baselines import compare_paired_accuracy  # noqa: E402
from empatheia.labels import LabelSets, UnknownEmotionError  # noqa: E402


def read_records(path: Path) -> Dict[str, dict]:
    """``id`` -> the line's record, for each line of ``path``."""
    out = {}
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if line.strip():
                row = json.loads(line)
                if "id" not in row:
                    raise SystemExit(f"{path}:{number}: a line without 'id'")
                out[row["id"]] = row
    return out


def folded(labels: LabelSets, emotion: Optional[str]) -> Optional[str]:
    """The class of ``emotion``; None for none or one the fold does not know."""
    if not emotion:
        return None
    try:
        return labels.emotion_class(emotion)
    except UnknownEmotionError:
        return None


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path, help="the eval run (its --out folder) compared")
    parser.add_argument("b", type=Path, help="the eval run it is compared with")
    parser.add_argument("--labels", type=Path, help="a labels YAML whose fold reads the emotions (default: the built-in)")
    args = parser.parse_args(argv)
    labels = LabelSets.from_yaml(args.labels) if args.labels else LabelSets()
    references = read_records(args.a / "references.jsonl")
    folders = {"A": args.a, "B": args.b}
    runs = {name: read_records(folder / "predictions.jsonl") for name, folder in folders.items()}
    for name, run in runs.items():
        missing, extra = sorted(set(references) - set(run)), sorted(set(run) - set(references))
        if missing or extra:
            raise SystemExit(f"run {name} ({folders[name]}) does not answer the same examples: "
                             f"{len(missing)} missing (first {missing[:3]}), {len(extra)} not in the references "
                             f"(first {extra[:3]})")
    ids = list(references)
    gold = [folded(labels, references[i].get("emotion")) for i in ids]
    right = {}
    for name, run in runs.items():
        styled = [folded(labels, run[i].get("emotion")) for i in ids]
        chain = [folded(labels, run[i].get("chain_emotion")) for i in ids]
        right[name] = [s is not None and s == g for s, g in zip(styled, gold)]
        agree = sum(s is not None and s == c for s, c in zip(styled, chain))
        print(f"{name} ({folders[name]}): styled as the reference's class on "
              f"{sum(right[name])} of {len(ids)} ({sum(right[name]) / len(ids):.1%}), as its own chain's on "
              f"{agree} ({agree / len(ids):.1%})")
    differ = sum(runs["A"][i].get("emotion") != runs["B"][i].get("emotion") for i in ids)
    paired = compare_paired_accuracy(right["A"], right["B"])
    low, high = paired.interval
    print(f"A - B: {paired.difference:+.4f} (95 % bootstrap interval {low:+.4f} to {high:+.4f}); only A right on "
          f"{paired.only_a}, only B on {paired.only_b}, McNemar exact p = {paired.p_value:.2g}; "
          f"styled differently on {differ}")


if __name__ == "__main__":
    main()
