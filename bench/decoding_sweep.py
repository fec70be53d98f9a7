"""How the decoding settings change the answers: diversity, overlap with the gold replies and
repeated sentences, per setting, on the first examples of a held-out file.

    empatheia data split ../shared/data/ed/ed_valid_conversations.jsonl --out runs/small/ed
    python bench/decoding_sweep.py --data runs/small/ed/eval.jsonl --limit 100 --json sweep.json

Loads the preset (``small`` by default) once and answers the first ``--limit`` examples of
``--data`` (any file ``empatheia eval`` reads) under each setting of ``--settings``
(default: all of :data:`SETTINGS`): greedy; greedy with n-grams of 2, 3 or 4 tokens never
repeated (in the reply, and within each step of the chain); greedy with a repetition penalty of 1.1, 1.2 or 1.3; greedy
with the penalty on generic openings at 0.3 and 0.5 (with the 3-gram and sentence blocks); and sampling at
two temperatures and top-p values with a fixed seed. Every setting states its repetition
control, so the model config's defaults do not enter. The scores are the library's own
(:mod:`empatheia.evaluation.text`): Dist-1 and Dist-2, BLEU-1/2/4 against the gold replies,
the share of answers that repeat a sentence, and the share whose chain parsed (the
repetition control must leave the chain's template alone). Prints a table and, with
``--json``, writes it with the settings and answers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from empatheia.decoding import Decoding  # noqa: E402
from empatheia.prompts import chain_is_complete  # noqa: E402

SEED = 0
_OFF = {"do_sample": False, "no_repeat_ngram_size": 0, "repetition_penalty": 1.0, "block_repeated_sentences": False,
        "generic_reply_penalty": 0.0}
_CONTROLLED = {"no_repeat_ngram_size": 3, "block_repeated_sentences": True}


def _sample(temperature: float, top_p: float, sample_chain: bool = True, **control) -> Decoding:
    return Decoding(**dict(_OFF, do_sample=True, seed=SEED, temperature=temperature, top_p=top_p,
                           sample_chain=sample_chain, **control))


SETTINGS: Dict[str, Decoding] = {
    "greedy": Decoding(**_OFF),
    "no_repeat_2": Decoding(**dict(_OFF, no_repeat_ngram_size=2)),
    "no_repeat_3": Decoding(**dict(_OFF, no_repeat_ngram_size=3)),
    "no_repeat_4": Decoding(**dict(_OFF, no_repeat_ngram_size=4)),
    "penalty_1.1": Decoding(**dict(_OFF, repetition_penalty=1.1)),
    "penalty_1.2": Decoding(**dict(_OFF, repetition_penalty=1.2)),
    "penalty_1.3": Decoding(**dict(_OFF, repetition_penalty=1.3)),
    "sentences": Decoding(**dict(_OFF, block_repeated_sentences=True)),
    "no_repeat_3_sentences": Decoding(**dict(_OFF, **_CONTROLLED)),
    "generic_0.3_no_repeat_3_sentences": Decoding(**dict(_OFF, **_CONTROLLED, generic_reply_penalty=0.3)),
    "generic_0.5_no_repeat_3_sentences": Decoding(**dict(_OFF, **_CONTROLLED, generic_reply_penalty=0.5)),
    "sample_t0.7_p0.9": _sample(0.7, 0.9),
    "sample_t1.0_p0.95": _sample(1.0, 0.95),
    "sample_t0.7_p0.9_no_repeat_3_sentences": _sample(0.7, 0.9, **_CONTROLLED),
    "sample_reply_t0.7_p0.9_no_repeat_3_sentences": _sample(0.7, 0.9, sample_chain=False, **_CONTROLLED),
}
COLUMNS = ("dist_1", "dist_2", "bleu_1", "bleu_2", "bleu_4", "repeated_sentence_share", "chain_parsed_share",
           "chain_complete_share")


def score(answers: Sequence[str], gold: Sequence[str], parsed: Sequence[bool],
          complete: Sequence[bool] = ()) -> Dict[str, Any]:
    """The sweep's numbers for one setting's answers against the gold replies."""
    from empatheia.evaluation import text

    bleu = text.corpus_bleu(list(answers), list(gold))
    return {
        "dist_1": text.distinct_n(answers, 1),
        "dist_2": text.distinct_n(answers, 2),
        **{k: bleu[k] for k in ("bleu_1", "bleu_2", "bleu_4")},
        **text.repeated_sentences(answers),
        "chain_parsed_share": sum(parsed) / len(parsed) if parsed else None,
        "chain_complete_share": sum(complete) / len(complete) if complete else None,
    }


def sweep(model, dialogues, gold: Sequence[str], settings: Dict[str, Decoding], batch_size: int,
          max_new_tokens) -> List[Dict[str, Any]]:
    rows = []
    for name, decoding in settings.items():
        start = time.perf_counter()
        answers, parsed, complete = [], [], []
        for first in range(0, len(dialogues), batch_size):
            batch = dialogues[first : first + batch_size]
            for response in model.respond(batch, max_new_tokens=max_new_tokens, **decoding.kwargs()):
                answers.append(response.text)
                parsed.append(bool(response.chain.parsed))
                complete.append(chain_is_complete(response.chain))
        seconds = time.perf_counter() - start
        rows.append({"setting": name, "decoding": decoding.record(), **score(answers, gold, parsed, complete),
                     "seconds": round(seconds, 1), "answers": answers})
        print(f"{name}: {seconds:.1f}s", file=sys.stderr, flush=True)
    return rows


def table(rows: Sequence[Dict[str, Any]]) -> str:
    header = ["setting", *COLUMNS, "repeats", "seconds"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row["setting"], *("-" if row[c] is None else f"{row[c]:.3f}" for c in COLUMNS),
                 str(row["repeated_sentence_count"]), f"{row['seconds']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="held-out file, e.g. the eval.jsonl of `data split`")
    parser.add_argument("--limit", type=int, default=100, help="answer the first N examples (default 100)")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS), metavar="SETTING",
                        help=f"which settings, in this order (default: all: {', '.join(SETTINGS)})")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: the preset's")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the settings, numbers and answers here")
    args = parser.parse_args(argv)
    if args.limit < 1 or args.batch_size < 1:
        parser.error("--limit and --batch-size must be at least 1")

    from empatheia import Empatheia
    from empatheia.data.readers import read_dataset
    from empatheia.evaluation.records import references_from_dialogues

    model = Empatheia.from_preset(args.preset)
    labels = model.label_sets()
    dialogues = list(read_dataset(args.data, labels=labels).dialogues)[: args.limit]
    gold = [r["response"] for r in references_from_dialogues(dialogues, labels, file=args.data)]
    rows = sweep(model, dialogues, gold, {name: SETTINGS[name] for name in args.settings}, args.batch_size,
                 args.max_new_tokens)
    print(f"{args.preset} on the first {len(dialogues)} examples of {args.data} (batches of {args.batch_size})")
    print(table(rows))
    if args.json is not None:
        result = {"preset": args.preset, "data": str(args.data), "examples": len(dialogues),
                  "batch_size": args.batch_size, "max_new_tokens": args.max_new_tokens, "settings": rows}
        args.json.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
