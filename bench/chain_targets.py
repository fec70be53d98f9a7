"""The Chain-of-Empathy targets of an EmpatheticDialogues file, before and after the
rule-built steps of ``empatheia.chain_targets``.

    python bench/chain_targets.py --ed ../shared/data/ed/ed_valid_conversations.jsonl

Reads the file as training does (one example per listener turn) and prints, for the old
targets (the situation as the event, the emotion; no cause, no goal) and the new ones:
the share of targets naming all four steps; the share whose event equals the speaker's
first utterance, contains it word for word, or nearly copies it (difflib's word-sequence
ratio 0.8 or more); the share of goals that name an act of a reply
(``empatheia.chain_targets.reply_acts``), the number of distinct goals, and of the goals
naming acts the share whose reply does them all (for the targets, the gold reply, so
100 %); the average words per step; the number of distinct replies and the share opening
with the commonest four words (for the targets, the gold replies). Then five examples.

    python bench/chain_targets.py --ed runs/small/ed/eval.jsonl \
        --predictions runs/small/eval_heldout_new/predictions.jsonl OTHER/predictions.jsonl

With ``--predictions`` (``empatheia eval`` outputs on the same file) the same numbers of
each file's generated chains and replies follow as columns, on the examples they answered.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections import Counter
from pathlib import Path
from statistics import fmean

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from empatheia.chain_targets import goal_acts, reply_acts  # noqa: E402
from empatheia.data import read_dataset  # noqa: E402
from empatheia.evaluation.records import read_predictions  # noqa: E402
from empatheia.prompts import CHAIN_STEPS, ChainOfEmpathy, chain_is_complete  # noqa: E402

NEAR_COPY = 0.8
OPENING_WORDS = 4


def _norm(text: str) -> str:
    return " ".join(text.split()).lower()


def measure(chains, first_utterances, replies):
    """Shares and average lengths of ``chains`` against each example's first speaker turn,
    and whether each reply does what its chain's goal names."""
    events = [_norm(c.event_scenario or "") for c in chains]
    firsts = [_norm(u) for u in first_utterances]
    out = {
        "all four steps": fmean(chain_is_complete(c) for c in chains),
        "event == first utterance": fmean(e == u for e, u in zip(events, firsts)),
        "event contains first utterance": fmean(bool(e) and u in e for e, u in zip(events, firsts)),
        f"event near copy (ratio >= {NEAR_COPY})": fmean(
            difflib.SequenceMatcher(None, e.split(), u.split()).ratio() >= NEAR_COPY for e, u in zip(events, firsts)),
    }
    goals = [_norm(c.goal_to_response or "") for c in chains]
    acts = [goal_acts(g) for g in goals]
    out["goal names a reply act"] = fmean(bool(a) for a in acts)
    out["distinct goals"] = len(set(g for g in goals if g))
    planned = [(a, r) for a, r in zip(acts, replies) if a]
    out["reply does the goal's acts"] = (fmean(set(a) <= set(reply_acts(r or "")) for a, r in planned)
                                         if planned else None)
    for name, _ in CHAIN_STEPS:
        out[f"words: {name}"] = fmean(len((getattr(c, name) or "").split()) for c in chains)
    texts = [_norm(r or "") for r in replies]
    out["distinct replies"] = len(set(texts))
    opening, count = commonest_opening(texts)
    out[f"replies opening with the commonest {OPENING_WORDS} words"] = count / len(texts)
    out["commonest opening"] = opening
    return out


def commonest_opening(replies):
    """The commonest first ``OPENING_WORDS`` words of ``replies`` (lower-cased) and how many
    replies open with them: a reply a person reads as formulaic shows here first."""
    return Counter(" ".join(r.split()[:OPENING_WORDS]) for r in replies).most_common(1)[0]


def _generated_chains(path: Path):
    """``{id: (ChainOfEmpathy, reply)}`` of the generated chains and replies in an
    ``empatheia eval`` predictions file (an answer without a chain counts as a chain with no
    steps)."""
    fields = [name for name, _ in CHAIN_STEPS]
    return {record["id"]: (ChainOfEmpathy(**{name: (record.get("chain_of_empathy") or {}).get(name) for name in fields}),
                           record.get("text") or "")
            for record in read_predictions(path)}


def _column_names(paths):
    """Each predictions file's folder name, with as many parent folders as it takes to tell
    the files apart (``small_v7/eval_heldout200`` beside ``small_v8/eval_heldout200``)."""
    paths = [path.resolve() for path in paths]
    for depth in range(1, max((len(path.parts) for path in paths), default=1)):
        names = ["/".join(path.parent.parts[-depth:]) for path in paths]
        if len(set(names)) == len(names):
            return names
    return [str(path) for path in paths]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ed", type=Path, required=True, help="an ed-conversations JSONL file")
    parser.add_argument("--examples", type=int, default=5)
    parser.add_argument("--predictions", type=Path, nargs="+", default=[],
                        help="predictions.jsonl files whose generated chains to measure beside the targets")
    args = parser.parse_args()
    corpus = read_dataset(args.ed)
    dialogues = corpus.dialogues
    generated = [_generated_chains(path) for path in args.predictions]
    if generated:
        answered = set.intersection(*(set(chains) for chains in generated))
        dialogues = [d for d in dialogues if d.id in answered]
        if not dialogues:
            raise SystemExit(f"error: no example of {args.ed} is answered in every --predictions file")
    firsts = [next(t.text for t in d.turns if t.role == "speaker") for d in dialogues]
    # The targets before: ED's situation as the event, the emotion, nothing else.
    before = [ChainOfEmpathy(event_scenario=(d.context or "").strip() or None, speaker_emotion=d.emotion)
              for d in dialogues]
    after = [d.chain for d in dialogues]
    gold = [d.response for d in dialogues]
    columns = {"before": measure(before, firsts, gold), "after": measure(after, firsts, gold)}
    for name, answers in zip(_column_names(args.predictions), generated):
        chains, replies = zip(*(answers[d.id] for d in dialogues))
        columns[name] = measure(chains, firsts, replies)
    print(f"{len(dialogues)} examples of {corpus.conversations} conversations ({args.ed.name}); targets before and "
          f"after the rule-built steps" + (", then the generated chains of each --predictions file" if generated else ""))
    width = max(8, *(len(name) for name in columns))
    print(f"{'':44} " + " ".join(f"{name:>{width}}" for name in columns))
    for key in [k for k in columns["before"] if k != "commonest opening"]:
        unit = (f"{{:{width}.3f}}" if key.startswith("words") else f"{{:{width}d}}" if key.startswith("distinct")
                else f"{{:{width}.1%}}")
        print(f"{key:44} " + " ".join(f"{'-':>{width}}" if values[key] is None else unit.format(values[key])
                                      for values in columns.values()))
    for name, values in columns.items():
        print(f"commonest opening, {name}: {values['commonest opening']!r}")
    step = max(1, len(dialogues) // max(1, args.examples))
    for d in dialogues[::step][: args.examples]:
        print(f"\n[{d.id}] situation: {d.context}")
        print(f"  speaker's last turn: {[t.text for t in d.turns if t.role == 'speaker'][-1]}")
        for name, label in CHAIN_STEPS:
            print(f"  {label}: {getattr(d.chain, name)}")


if __name__ == "__main__":
    main()
