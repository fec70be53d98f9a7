"""Two `empatheia eval` runs over the same examples: the emotion that styled their voices
and faces, compared paired.

    python bench/paired_style_emotion.py runs/small/eval_heldout_shipped runs/small/eval_heldout_generic03_t6

For each run: how often its ``emotion`` (the Style Disentangler's class, which styles the
voice and the face) is the reference's class, and how often it is the class of the run's
own chain emotion (``chain_emotion`` folded onto the classes, read through the label fold
of ``--labels`` or the built-in one). Then A against B on the reference, paired: the
difference, its bootstrap 95 % interval and McNemar's exact p-value
(:func:`empatheia.evaluation.baselines.compare_paired_accuracy`); and on how many examples
the two runs style differently. Both runs must hold the same examples
(:func:`empatheia.evaluation.records.pair_runs`): an id in one and not the other is an
error naming it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from empatheia.errors import DataError  # noqa: E402
from empatheia.evaluation.baselines import compare_paired_accuracy  # noqa: E402
from empatheia.evaluation.records import pair_runs  # noqa: E402
from empatheia.labels import LabelSets, UnknownEmotionError  # noqa: E402


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
    try:
        triples = pair_runs(args.a, args.b)
    except DataError as error:
        raise SystemExit(f"error: {error}") from None
    gold = [folded(labels, reference["emotion"]) for _, _, reference in triples]
    right = {}
    for column, (name, folder) in enumerate((("A", args.a), ("B", args.b))):
        answers = [triple[column] for triple in triples]
        styled = [folded(labels, answer["emotion"]) for answer in answers]
        chain = [folded(labels, answer.get("chain_emotion")) for answer in answers]
        right[name] = [s is not None and s == g for s, g in zip(styled, gold)]
        agree = sum(s is not None and s == c for s, c in zip(styled, chain))
        print(f"{name} ({folder}): styled as the reference's class on {sum(right[name])} of {len(triples)} "
              f"({sum(right[name]) / len(triples):.1%}), as its own chain's on {agree} ({agree / len(triples):.1%})")
    differ = sum(a["emotion"] != b["emotion"] for a, b, _ in triples)
    paired = compare_paired_accuracy(right["A"], right["B"])
    low, high = paired.interval
    print(f"A - B: {paired.difference:+.4f} (95 % bootstrap interval {low:+.4f} to {high:+.4f}); only A right on "
          f"{paired.only_a}, only B on {paired.only_b}, McNemar exact p = {paired.p_value:.2g}; "
          f"styled differently on {differ}")


if __name__ == "__main__":
    main()
