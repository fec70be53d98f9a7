"""The chain's emotion fused with a text reader at several weights, computed from a run's
recorded label probabilities (no model runs).

    python bench/chain_emotion_fusion.py --data runs/small/ed/eval.jsonl \
        --predictions runs/small/eval_heldout_block/predictions.jsonl --weights 0 0.5 1 2 3 4 6

``--predictions`` must come from a run whose ``chain_emotion_probabilities`` are the
language model's alone (``--set language_model.chain_emotion_reader_weight=0``, or weights
and settings from before the reader existed). For each weight ``w`` the label chosen is
the argmax of the core's log-probabilities plus ``w`` times the readers' (summed)
(``fused_label_scores``, as ``respond`` chooses it), and its accuracy over the data's
fine labels and, folded, the 7 classes is printed. A prediction with no probabilities
(its chain wrote no emotion step) counts as wrong. ``--reader`` defaults to the folder
``small`` ships (every reader of words in it). A weight picked here is picked on the data it is scored on.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from empatheia.data import read_dataset  # noqa: E402
from empatheia.evaluation.records import read_predictions  # noqa: E402
from empatheia.labels import fold_emotion, normalize_label  # noqa: E402
from empatheia.logits_processors import fused_label_scores  # noqa: E402
from empatheia.variants.readers import load_text_readers, small_readers_folder, text_log_probabilities  # noqa: E402


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="the dialogues the predictions answer")
    parser.add_argument("--predictions", type=Path, required=True)
    parser.add_argument("--reader", type=Path, help="a folder of saved readers of the speaker's words, "
                        "their distributions multiplied (default: small's)")
    parser.add_argument("--weights", type=float, nargs="+", default=[0.0, 0.5, 1.0, 2.0, 4.0])
    args = parser.parse_args(argv)

    dialogues = list(read_dataset(args.data))
    predictions = {p["id"]: p for p in read_predictions(args.predictions)}
    missing = [d.id for d in dialogues if d.id not in predictions]
    if missing:
        raise SystemExit(f"{args.predictions}: no prediction for {len(missing)} dialogues, e.g. {missing[:3]}")
    recorded = [predictions[d.id].get("chain_emotion_probabilities") for d in dialogues]
    labels = sorted(next(p for p in recorded if p))
    readers = load_text_readers(args.reader or small_readers_folder())
    read = text_log_probabilities(readers, dialogues, labels)  # (N, K)
    # The core's probabilities as logits; a row without the step gets a label no weight can pick.
    core = torch.tensor([[max(p[label], 1e-12) for label in labels] if p else [0.0] * len(labels)
                         for p in recorded]).log()
    wrote = torch.tensor([bool(p) for p in recorded])
    gold = [normalize_label(d.emotion) for d in dialogues]
    print(f"{len(dialogues)} examples, {int((~wrote).sum())} without an emotion step")
    print("weight  32 labels  7 classes")
    for weight in args.weights:
        chosen = [labels[i] for i in fused_label_scores(core, read * weight).argmax(1).tolist()]
        fine = sum(w and c == g for w, c, g in zip(wrote.tolist(), chosen, gold)) / len(gold)
        folded = sum(w and fold_emotion(c) == fold_emotion(g) for w, c, g in zip(wrote.tolist(), chosen, gold)) / len(gold)
        print(f"{weight:6g}  {fine:9.4f}  {folded:9.4f}")


if __name__ == "__main__":
    main()
