"""Does the wording of the chain's event step change the emotion the chain reads after it?

    python bench/chain_emotion_event.py --checkpoint runs/small_v12/stage1_coe/final \
        --data runs/small/ed/eval.jsonl --predictions runs/small_v15/eval_heldout_v12_goal/predictions.jsonl

For each held-out example, the chain a predictions file wrote is read back through the model
(teacher-forced, as ``respond`` reads it for the heads) with its event step as written, and
again with the event step replaced by the speaker's own words (their first turn, what a
two-step core's event step mostly copies), and by nothing. The chain's emotion is the
likeliest label at the emotion step, fused with the readers of words as in decoding; the
script prints its accuracy over the labels and over the 7 classes in each case, and how
often the first case agrees with the emotion the predictions file wrote (a check that the
reading is the decoder's). Nothing is generated: one forward pass per example and case.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from empatheia import Empatheia  # noqa: E402
from empatheia.data.readers import read_dataset  # noqa: E402
from empatheia.evaluation.records import read_predictions  # noqa: E402
from empatheia.labels import fold_emotion, normalize_label  # noqa: E402
from empatheia.modeling import _to  # noqa: E402
from empatheia.processing import Target  # noqa: E402
from empatheia.prompts import ChainOfEmpathy, PromptMode  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="the held-out split the predictions answer")
    parser.add_argument("--predictions", type=Path, required=True)
    parser.add_argument("--limit", type=int)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()

    model = Empatheia.from_pretrained(args.checkpoint).eval()
    labels = model.config.language_model.chain_emotions
    written = {r["id"]: r for r in read_predictions(args.predictions)}
    items = [d for d in read_dataset(args.data, labels=model.label_sets()).dialogues if d.id in written]
    items = items[: args.limit] if args.limit else items
    cases = {
        "as written": lambda d, event: event,
        "speaker's first turn": lambda d, event: d.turns[0].text,
        "empty": lambda d, event: "",
    }
    start = time.perf_counter()
    chosen = {name: [] for name in cases}
    with torch.no_grad():
        for at in range(0, len(items), args.batch_size):
            batch_items = items[at: at + args.batch_size]
            prior = model.chain_emotion_prior(batch_items)
            for name, event_of in cases.items():
                encoded = []
                for d in batch_items:
                    record = written[d.id]
                    steps = record.get("chain_of_empathy") or {}
                    chain = ChainOfEmpathy(**{k: steps.get(k) for k in
                                              ("event_scenario", "speaker_emotion", "emotion_cause", "goal_to_response")})
                    chain = replace(chain, event_scenario=event_of(d, chain.event_scenario or ""))
                    target = Target(response=record["text"], chain=chain, signals=False, eos=False)
                    encoded.append(model.processor.encode(d, PromptMode.FULL, target, load_media=False))
                batch = _to(model.processor.collate(encoded), model.device)
                hidden = model.hidden_states(batch, media=(None, None))
                scores = model.chain_emotion_scores(hidden, batch["emotion_slot"], prior)
                chosen[name] += [labels[i] for i in scores.argmax(1).tolist()]
            print(f"{min(at + args.batch_size, len(items))}/{len(items)}", file=sys.stderr, end="\r")
    gold = [normalize_label(d.emotion or "") for d in items]
    gold_class = [fold_emotion(label) for label in gold]
    print(f"{len(items)} examples, {time.perf_counter() - start:.0f} s")
    for name, picks in chosen.items():
        labels_right = sum(p == g for p, g in zip(picks, gold)) / len(items)
        classes_right = sum(fold_emotion(p) == g for p, g in zip(picks, gold_class)) / len(items)
        print(f"event {name:>20}: {labels_right:.1%} over the labels, {classes_right:.1%} over the 7 classes")
    agree = sum(p == normalize_label(written[d.id].get("chain_emotion") or "") for p, d in zip(chosen["as written"], items))
    print(f"as written agrees with the predictions' chain emotion on {agree} of {len(items)}")


if __name__ == "__main__":
    main()
