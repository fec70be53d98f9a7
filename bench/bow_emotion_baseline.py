"""Emotion accuracy of the bag-of-words baseline on the held-out EmpatheticDialogues split.

    python bench/bow_emotion_baseline.py --ed ../shared/data/ed/ed_valid_conversations.jsonl

Splits the file exactly as `empatheia data split` does (10 % of conversations held out),
trains on the training split's examples (one per listener turn, the dialogue so far as
input, the conversation's emotion as label) and prints accuracy over 32 ED labels and the
7 folded classes.

    python bench/bow_emotion_baseline.py --ed ../shared/data/ed/ed_valid_conversations.jsonl \
        --predictions runs/small/eval_heldout/predictions.jsonl

also scores a model's Chain-of-Empathy emotions (``chain_emotion`` of each prediction,
matched by ``id``) on the same held-out examples and compares the two paired: the
difference, its bootstrap 95 % interval and McNemar's exact p-value. A prediction with no
emotion, or one that is not an ED label, counts as wrong. ``--before OTHER.jsonl`` (another
run's predictions, e.g. of the weights or settings shipped before) compares the model with
that run the same way.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from empatheia.data import read_dataset  # noqa: E402
from empatheia.labels import UnknownEmotionError, fold_emotion, normalize_label  # noqa: E402
from empatheia.data.render import split_ed_file  # noqa: E402
from empatheia.evaluation.baselines import BagOfWordsEmotion, compare_paired_accuracy, dialogue_text  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ed", type=Path, required=True)
    parser.add_argument("--predictions", type=Path, help="a model's predictions.jsonl to compare with, paired")
    parser.add_argument("--before", type=Path, help="another run's predictions.jsonl to compare --predictions with, paired")
    parser.add_argument("--subset", action="store_true",
                        help="score only the held-out examples the predictions cover (an eval run with --limit)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        split = split_ed_file(args.ed, tmp)
        train, test = read_dataset(split["train"]), read_dataset(split["eval"])
    texts = [dialogue_text(d) for d in train]
    test_texts = [dialogue_text(d) for d in test]
    if args.before and not args.predictions:
        parser.error("--before compares with --predictions: give both")
    chain = read_chain_emotions(args.predictions, [d.id for d in test], args.subset) if args.predictions else None
    before = read_chain_emotions(args.before, [d.id for d in test], args.subset) if args.before else None
    if chain is not None and args.subset:
        test.dialogues = [d for d in test if d.id in chain and (before is None or d.id in before)]
        print(f"scoring the {len(test.dialogues)} held-out examples the predictions cover (--subset)")
    print(f"{len(train)} training examples ({train.conversations} conversations), "
          f"{len(test)} held-out examples ({test.conversations} conversations)")
    for name, label in (("32 ED labels", normalize_label), ("7 classes", fold_emotion)):
        start = time.perf_counter()
        model = BagOfWordsEmotion().fit(texts, [label(d.emotion) for d in train])
        predicted = model.predict(test_texts)
        gold = [label(d.emotion) for d in test]
        accuracy = sum(p == g for p, g in zip(predicted, gold)) / len(gold)
        majority = max(gold.count(c) for c in set(gold)) / len(gold)
        print(f"{name}: accuracy {accuracy:.4f} (majority class {majority:.4f}; "
              f"{len(model.vocabulary)} n-grams; {time.perf_counter() - start:.1f} s)")
        if chain is not None:
            model_correct = [scored_label(chain[d.id], label) == g for d, g in zip(test, gold)]
            others = [("bag-of-words", [p == g for p, g in zip(predicted, gold)])]
            if before is not None:
                others.append(("before", [scored_label(before[d.id], label) == g for d, g in zip(test, gold)]))
            for other, other_correct in others:
                paired = compare_paired_accuracy(model_correct, other_correct)
                low, high = paired.interval
                print(f"  model {paired.accuracy_a:.4f} vs {other} {paired.accuracy_b:.4f}: "
                      f"difference {paired.difference:+.4f} (95 % bootstrap interval {low:+.4f} to {high:+.4f}); "
                      f"only the model right on {paired.only_a}, only {other} on {paired.only_b}, "
                      f"McNemar exact p = {paired.p_value:.2g}")


def read_chain_emotions(path: Path, ids, subset: bool = False) -> dict:
    """``id -> chain_emotion`` (or None) for every held-out id; a missing id is an error
    unless ``subset`` (then the predictions' ids must all be held-out ones)."""
    chain = {}
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if line.strip():
                record = json.loads(line)
                if "id" not in record:
                    raise SystemExit(f"{path}:{number}: record has no 'id'")
                chain[record["id"]] = record.get("chain_emotion")
    missing = [i for i in ids if i not in chain]
    if subset:
        stray = sorted(set(chain) - set(ids))
        if stray:
            raise SystemExit(f"{path}: {len(stray)} predictions are not held-out examples, e.g. {stray[:3]}")
        missing = []
    if missing:
        raise SystemExit(f"{path}: no prediction for {len(missing)} held-out ids, e.g. {missing[:3]}")
    return chain


def scored_label(emotion, label):
    """The model's emotion in the comparison's label set; None (scored wrong) if it has none."""
    if not emotion:
        return None
    try:
        return label(emotion)
    except UnknownEmotionError:  # a free-text emotion the 7-class fold does not know
        return None


if __name__ == "__main__":
    main()
