"""Emotion accuracy of the bag-of-words baseline on the held-out EmpatheticDialogues split.

    python bench/bow_emotion_baseline.py --ed ../shared/data/ed/ed_valid_conversations.jsonl

Splits the file exactly as `empatheia data split` does (10 % of conversations held out),
trains on the training split's examples (one per listener turn, the dialogue so far as
input, the conversation's emotion as label) and prints accuracy over 32 ED labels and the
7 folded classes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from empatheia.data import read_dataset  # noqa: E402
from empatheia.data.emotions import fold_emotion, normalize_label  # noqa: E402
from empatheia.data.render import split_ed_file  # noqa: E402
from empatheia.evaluation.baselines import BagOfWordsEmotion, dialogue_text  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ed", type=Path, required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        split = split_ed_file(args.ed, tmp)
        train, test = read_dataset(split["train"]), read_dataset(split["eval"])
    texts = [dialogue_text(d) for d in train]
    test_texts = [dialogue_text(d) for d in test]
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


if __name__ == "__main__":
    main()
