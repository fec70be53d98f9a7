"""Time the decoding's logits processors on a device and check they give there what they
give on the CPU.

    python bench/decoding_processors.py --device cuda --vocab 32000 --batch 16

Builds each processor over made-up token ids (a vocabulary the size of the paper core's,
32 labels, a few hundred goals and openings), then feeds it one batch of rows caught at
the places it acts on: just after the emotion step's lead-in, inside a goal, inside the
reply's opening, after a sentence of the reply. Each processor runs on the CPU and on
``--device``; the script fails if the two disagree, and prints the median time of one
call on the device. What it measures is the processors' own cost per generated token,
to set beside a forward pass of the model (which it does not run).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from empatheia.logits_processors import (  # noqa: E402
    ChainEmotionChoice,
    ChainGoalChoice,
    ChainStepNgramBlock,
    ReplyGoalOpenings,
    ReplyRepetitionControl,
    SentenceRepetitionBlock,
)

EMOTION, GOAL, REPLY, LINE, STOP = [11, 12], [21, 22], [31, 32], 13, 2
SENTENCE_ENDS = range(40, 46)


def made_up(vocab: int, batch: int, labels: int, goals: int, openings: int, seed: int):
    generator = torch.Generator().manual_seed(seed)

    def words(n: int):
        return torch.randint(1000, vocab, (n,), generator=generator).tolist()

    label_spellings = [[200 + k, 400 + k, LINE] for k in range(labels)]
    goal_spellings = [words(int(torch.randint(5, 15, (1,), generator=generator))) + [LINE] for _ in range(goals)]
    allowed = torch.rand(labels, goals, generator=generator) < 0.3
    allowed[:, 0] = True
    goal_leads = torch.randint(0, 3, (goals,), generator=generator)
    prior = torch.rand(labels, goals, generator=generator) * 20 + 0.5
    acts = 17
    opening_spellings = [(i % acts, words(int(torch.randint(1, 6, (1,), generator=generator)))) for i in range(openings)]
    goal_acts = torch.randint(-1, acts, (goals, 2), generator=generator)
    rows, row_leads = [], []
    for row in range(batch):
        label = row % labels
        fitting = allowed[label].nonzero().flatten().tolist()
        goal = fitting[row % len(fitting)]
        prefix = words(120) + EMOTION
        where = row % 4
        if where == 0:  # just after the emotion lead-in
            ids = prefix
        else:
            ids = prefix + label_spellings[label] + words(12) + [LINE] + GOAL
            if where == 1:  # inside the goal
                ids += goal_spellings[goal][: 1 + row % 3]
            else:  # in the reply: its opening, or after a first sentence
                ids += goal_spellings[goal] + REPLY
                opening = next(ids_ for act, ids_ in opening_spellings if act == max(goal_acts[goal, 0].item(), 0))
                ids += opening[:1] if where == 2 else opening + words(4) + [SENTENCE_ENDS[0]]
        rows.append(ids)
        row_leads.append(int(goal_leads[goal]))
    width = max(len(r) for r in rows)
    input_ids = torch.tensor([[STOP] * (width - len(r)) + r for r in rows])  # left-padded, as generate writes
    sentence_end = torch.zeros(vocab, dtype=torch.bool)
    sentence_end[list(SENTENCE_ENDS)] = True
    line_end = torch.zeros(vocab, dtype=torch.bool)
    line_end[LINE] = True
    word = torch.ones(vocab, dtype=torch.bool)
    word[list(SENTENCE_ENDS) + [LINE]] = False
    clause_end = torch.zeros(vocab, dtype=torch.bool)
    label_prior = torch.log_softmax(torch.randn(batch, labels, generator=generator), -1)
    processors = {
        "ChainEmotionChoice": lambda d: ChainEmotionChoice(EMOTION, label_spellings, label_prior.to(d)),
        "ChainGoalChoice (with the prior)": lambda d: ChainGoalChoice(
            GOAL, goal_spellings, allowed, EMOTION, [s[0] for s in label_spellings], goal_leads,
            torch.tensor(row_leads), prior=prior, prior_weight=1.0),
        "ReplyGoalOpenings": lambda d: ReplyGoalOpenings(GOAL, goal_spellings, goal_acts, opening_spellings, [REPLY],
                                                         sentence_end),
        "ReplyGoalOpenings (bonus 3)": lambda d: ReplyGoalOpenings(GOAL, goal_spellings, goal_acts, opening_spellings,
                                                                   [REPLY], sentence_end, bonus=3.0),
        "ChainStepNgramBlock (3)": lambda d: ChainStepNgramBlock([REPLY], 3, line_end, protected=[STOP]),
        "SentenceRepetitionBlock": lambda d: SentenceRepetitionBlock([REPLY], word, sentence_end, clause_end, line_end,
                                                                     closing=[STOP]),
        "ReplyRepetitionControl (3)": lambda d: ReplyRepetitionControl([REPLY], 3, 1.0, protected=[STOP]),
    }
    scores = torch.randn(batch, vocab, generator=generator)
    return processors, input_ids, scores


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.float().cpu(), b.float().cpu()
    finite = torch.isfinite(a)
    return bool((finite == torch.isfinite(b)).all() and (a[~finite] == b[~finite]).all()
                and torch.allclose(a[finite], b[finite], atol=1e-4, rtol=1e-5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--goals", type=int, default=600)
    parser.add_argument("--openings", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    device = torch.device(args.device)
    processors, input_ids, scores = made_up(args.vocab, args.batch, 32, args.goals, args.openings, seed=0)
    print(f"{args.device}, vocabulary {args.vocab}, batch {args.batch}, {input_ids.shape[1]} tokens written, "
          f"{args.goals} goals, {args.openings} openings; torch {torch.__version__}")
    print("| processor | rows it changed | same as on the CPU | median ms per call |")
    print("| --- | ---: | --- | ---: |")
    failed = []
    for name, build in processors.items():
        on_cpu = build(torch.device("cpu"))(input_ids.clone(), scores.clone())
        processor = build(device)
        ids, given = input_ids.to(device), scores.to(device)
        result = processor(ids, given.clone())
        agrees = same(on_cpu, result)
        failed += [] if agrees else [name]
        times = []
        for _ in range(args.repeats):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            processor(ids, given.clone())
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1000)
        changed = int((~(result.float().cpu() == scores)).any(1).sum())
        print(f"| {name} | {changed} of {args.batch} | {'yes' if agrees else 'NO'} | {statistics.median(times):.3f} |")
    if failed:
        raise SystemExit(f"differ from the CPU on {args.device}: {', '.join(failed)}")


if __name__ == "__main__":
    main()
