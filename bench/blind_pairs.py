"""Blind comparison of two runs' replies: write a sheet for judges, then score their answers.

    python bench/blind_pairs.py sheet --data runs/small/ed/eval.jsonl \
        --first runs/small/eval_heldout_sentence/predictions.jsonl \
        --second runs/small/eval_heldout_sampled_t06/predictions.jsonl --pairs 60 --seed 0 --out runs/blind_t06
    python bench/blind_pairs.py score --key runs/blind_t06/key.json runs/blind_t06/judge_*.txt

``sheet`` draws ``--pairs`` dialogues at random (``--seed``) among those where the two
runs' replies differ, and writes ``OUT/sheet.md``: each dialogue's turns and the two
replies as A and B, in an order drawn per pair, without the gold reply or any sign of
which run wrote which; and ``OUT/key.json``, which says it. A judge answers one line per
pair, ``N: A``, ``N: B`` or ``N: tie``.

``score`` prints, per judge and for the judges' majority (a reply chosen by more than half
of them; otherwise the pair counts as a tie), how often each run's reply was preferred,
the ties, and the exact two-sided sign test over the pairs with a preference; then how
many pairs each two judges answered alike.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from empatheia.data import read_dataset  # noqa: E402
from empatheia.evaluation.baselines import exact_sign_test  # noqa: E402
from empatheia.evaluation.records import read_predictions  # noqa: E402

QUESTION = (
    "Each numbered item is a conversation between a speaker and a listener, then two "
    "candidate replies of the listener, A and B. Which reply would the speaker rather hear: "
    "one that fits what was said, is empathetic and sensible, and does not speak in the "
    "speaker's place? Answer one line per item, `N: A`, `N: B` or `N: tie` when neither is "
    "better."
)
ANSWER = re.compile(r"^\s*(\d+)\s*[:.)]\s*(a|b|tie)\s*$", re.IGNORECASE)


def write_sheet(args) -> None:
    dialogues = {d.id: d for d in read_dataset(args.data)}
    first = {p["id"]: p["text"] for p in read_predictions(args.first)}
    second = {p["id"]: p["text"] for p in read_predictions(args.second)}
    for name, run in (("--first", first), ("--second", second)):
        missing = [i for i in dialogues if i not in run]
        if missing:
            raise SystemExit(f"{name}: no prediction for {len(missing)} dialogues of {args.data}, e.g. {missing[:3]}")
    differing = [i for i in dialogues if first[i].strip() != second[i].strip()]
    if len(differing) < args.pairs:
        raise SystemExit(f"only {len(differing)} dialogues have differing replies; asked for --pairs {args.pairs}")
    rng = random.Random(args.seed)
    drawn = rng.sample(differing, args.pairs)
    lines, key = [QUESTION, ""], {}
    for number, example in enumerate(drawn, 1):
        swapped = rng.random() < 0.5
        a, b = (second, first) if swapped else (first, second)
        lines.append(f"## {number}")
        lines += [f"{turn.role.capitalize()}: {turn.text.strip()}" for turn in dialogues[example].turns]
        lines += [f"Reply A: {a[example].strip()}", f"Reply B: {b[example].strip()}", ""]
        key[str(number)] = {"id": example, "A": "second" if swapped else "first", "B": "first" if swapped else "second"}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sheet.md").write_text("\n".join(lines), encoding="utf-8")
    (args.out / "key.json").write_text(json.dumps({"first": str(args.first), "second": str(args.second),
                                                   "differing": len(differing), "pairs": key}, indent=1), encoding="utf-8")
    print(f"{len(differing)} of {len(dialogues)} dialogues differ; {args.pairs} drawn -> {args.out / 'sheet.md'}")


def read_answers(path: Path, pairs: int) -> dict:
    """``{pair number: "A" | "B" | "tie"}``; every pair answered once, or an error naming the line."""
    answers = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        match = ANSWER.match(line)
        if match is None:
            raise SystemExit(f"{path}:{number}: expected 'N: A', 'N: B' or 'N: tie', got {line!r}")
        item, choice = match.group(1), match.group(2)
        if item in answers:
            raise SystemExit(f"{path}:{number}: pair {item} answered twice")
        answers[item] = choice.upper() if choice.lower() != "tie" else "tie"
    missing = [str(n) for n in range(1, pairs + 1) if str(n) not in answers]
    if missing:
        raise SystemExit(f"{path}: no answer for pairs {', '.join(missing[:10])}")
    return answers


def score(args) -> None:
    key = json.loads(args.key.read_text(encoding="utf-8"))
    pairs = key["pairs"]
    judges = {path.name: read_answers(path, len(pairs)) for path in args.judgements}
    # Each judge's answer as the run it prefers ("first", "second") or "tie".
    preferred = {name: {n: pairs[n][c] if c != "tie" else "tie" for n, c in answers.items()}
                 for name, answers in judges.items()}
    majority = {}
    for n in pairs:
        choice, votes = Counter(p[n] for p in preferred.values()).most_common(1)[0]
        majority[n] = choice if votes * 2 > len(preferred) else "tie"
    print(f"first: {key['first']}\nsecond: {key['second']}\n{len(pairs)} pairs of {key['differing']} differing dialogues")
    print(f"{'judge':24s} first better  second better  tie  sign test p")
    rows = list(preferred.items()) + ([("majority", majority)] if len(preferred) > 1 else [])
    for name, choices in rows:
        counts = Counter(choices.values())
        p = exact_sign_test(counts["first"], counts["second"])
        print(f"{name:24s} {counts['first']:12d}  {counts['second']:13d}  {counts['tie']:3d}  {p:11.2g}")
    for (a, x), (b, y) in itertools.combinations(preferred.items(), 2):
        print(f"{a} and {b} answered alike on {sum(x[n] == y[n] for n in pairs)} of {len(pairs)}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    sheet = commands.add_parser("sheet", help="draw the pairs and write the sheet and its key")
    sheet.add_argument("--data", type=Path, required=True, help="the dialogues both runs answered")
    sheet.add_argument("--first", type=Path, required=True, help="one run's predictions.jsonl")
    sheet.add_argument("--second", type=Path, required=True, help="the other run's predictions.jsonl")
    sheet.add_argument("--pairs", type=int, default=60)
    sheet.add_argument("--seed", type=int, default=0)
    sheet.add_argument("--out", type=Path, required=True)
    scored = commands.add_parser("score", help="count the judges' answers against the key")
    scored.add_argument("--key", type=Path, required=True)
    scored.add_argument("judgements", type=Path, nargs="+", help="one file of answers per judge")
    args = parser.parse_args(argv)
    if args.command == "sheet":
        write_sheet(args)
    else:
        score(args)


if __name__ == "__main__":
    main()
