"""The bag-of-words emotion baseline learns what words say and nothing else."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from empatheia import Dialogue, Turn
from empatheia.data import read_dataset
from empatheia.data.render import split_ed_file
from empatheia.evaluation.baselines import BagOfWordsEmotion, compare_paired_accuracy, dialogue_text

from .conftest import shared_data


def test_learns_word_cues_and_generalises_to_unseen_texts():
    texts = ["I am so happy today", "what a happy sunny day", "so glad and happy", "happy happy news",
             "I feel sad and alone", "a sad grey morning", "so sad about it", "sad news again"]
    labels = ["joyful"] * 4 + ["sad"] * 4
    model = BagOfWordsEmotion(min_count=1).fit(texts, labels)
    assert model.predict(texts) == labels
    assert model.predict(["such a happy surprise", "this is so sad", ""]) [:2] == ["joyful", "sad"]
    assert model.labels == ["joyful", "sad"] and "happy" in model.vocabulary and "so happy" in model.vocabulary


def test_rare_ngrams_are_dropped_and_misuse_is_an_error():
    model = BagOfWordsEmotion(min_count=2)
    with pytest.raises(RuntimeError, match="fit the classifier first"):
        model.predict(["hello"])
    with pytest.raises(ValueError, match="as many labels as texts"):
        model.fit(["a"], ["x", "y"])
    model.fit(["good day", "good night", "bad day"], ["a", "a", "b"])
    assert set(model.vocabulary) == {"good", "day"}
    assert model.predict([]) == []


def test_dialogue_text_is_what_the_model_reads():
    dialogue = Dialogue([Turn("speaker", "My cat ran away."), Turn("listener", "Oh no!")], context="ignored situation")
    assert dialogue_text(dialogue) == "My cat ran away. Oh no!"


def test_paired_comparison_counts_discordant_pairs_and_brackets_the_difference():
    # A right on 60 of 100, B on 50; they disagree on 10 + 0 examples.
    a = [True] * 60 + [False] * 40
    b = [True] * 50 + [False] * 50
    result = compare_paired_accuracy(a, b, resamples=2000)
    assert (result.examples, result.only_a, result.only_b) == (100, 10, 0)
    assert result.accuracy_a == pytest.approx(0.6) and result.difference == pytest.approx(0.1)
    assert result.p_value == pytest.approx(2 * 0.5**10)
    low, high = result.interval
    assert 0.0 < low < 0.1 < high < 0.2
    # Identical classifiers: no discordant pair, no evidence either way.
    same = compare_paired_accuracy(a, a, resamples=100)
    assert same.p_value == 1.0 and same.interval == (0.0, 0.0)
    # Balanced disagreement: McNemar's p is 1 (k <= n/2 summed twice, capped).
    balanced = compare_paired_accuracy([True, False] * 5, [False, True] * 5, resamples=100)
    assert balanced.only_a == balanced.only_b == 5 and balanced.p_value == 1.0


def test_paired_comparison_refuses_unmatched_lists():
    with pytest.raises(ValueError, match="same non-zero number"):
        compare_paired_accuracy([True], [True, False])
    with pytest.raises(ValueError, match="same non-zero number"):
        compare_paired_accuracy([], [])


def test_the_bench_compares_a_run_with_an_earlier_one_paired(tmp_path):
    """bench/bow_emotion_baseline.py --predictions NEW --before OLD: the same paired line
    for the earlier run as for bag-of-words."""
    # The first 40 real conversations: the bench holds out 4 of them, as `data split` would.
    lines = shared_data("ed/ed_valid_conversations.jsonl").read_text(encoding="utf-8").splitlines()[:40]
    ed = tmp_path / "ed.jsonl"
    ed.write_text("\n".join(lines) + "\n", encoding="utf-8")
    held_out = list(read_dataset(split_ed_file(ed, tmp_path / "split")["eval"]))
    new = {d.id: d.emotion for d in held_out}  # all right
    old = {d.id: (d.emotion if k == 0 else None) for k, d in enumerate(held_out)}  # only the first right
    for name, chains in (("new", new), ("old", old)):
        (tmp_path / f"{name}.jsonl").write_text(
            "".join(json.dumps({"id": i, "chain_emotion": e}) + "\n" for i, e in chains.items()))
    repo = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, "bench/bow_emotion_baseline.py", "--ed", str(ed),
         "--predictions", str(tmp_path / "new.jsonl"), "--before", str(tmp_path / "old.jsonl")],
        cwd=repo, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    compared = [line.strip() for line in result.stdout.splitlines() if "vs before" in line]
    n = len(held_out)
    assert len(compared) == 2  # over the 32 labels and over the 7 classes
    for line in compared:
        assert line.startswith(f"model 1.0000 vs before {1 / n:.4f}: difference {(n - 1) / n:+.4f}"), line
        assert f"only the model right on {n - 1}, only before on 0" in line


def test_exact_sign_test_matches_the_binomial_tails():
    from empatheia.evaluation.baselines import exact_sign_test

    assert exact_sign_test(0, 0) == 1.0
    assert exact_sign_test(5, 0) == pytest.approx(2 / 32) and exact_sign_test(0, 5) == pytest.approx(2 / 32)
    assert exact_sign_test(3, 3) == 1.0
    assert exact_sign_test(29, 14) == pytest.approx(0.0319, abs=5e-4)  # 2 * P(Binomial(43, 1/2) <= 14)


def test_the_blind_sheet_hides_the_runs_and_the_score_unblinds_them(tmp_path):
    """bench/blind_pairs.py: pairs only where the replies differ, no sign of the run or the
    gold reply on the sheet, and the score counts each judge's answers for the run that
    wrote the preferred reply."""
    data = tmp_path / "data.jsonl"
    lines = shared_data("ed/ed_valid_conversations.jsonl").read_text(encoding="utf-8").splitlines()[:6]
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    dialogues = {d.id: d for d in read_dataset(data)}
    ids = list(dialogues)
    first = {i: f"first reply {n}" for n, i in enumerate(ids)}
    second = {i: (first[i] if n < 2 else f"second reply {n}") for n, i in enumerate(ids)}  # 2 alike
    for name, run in (("first", first), ("second", second)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"id": i, "text": t, "emotion": "sad"}) + "\n" for i, t in run.items()))
    repo = Path(__file__).resolve().parents[1]

    def bench(*args):
        return subprocess.run([sys.executable, "bench/blind_pairs.py", *map(str, args)], cwd=repo,
                              capture_output=True, text=True, timeout=300)

    pairs = len(ids) - 2
    drawn = bench("sheet", "--data", data, "--first", tmp_path / "first.jsonl", "--second", tmp_path / "second.jsonl",
                  "--pairs", pairs, "--seed", 3, "--out", tmp_path / "blind")
    assert drawn.returncode == 0, drawn.stderr[-2000:]
    sheet = (tmp_path / "blind" / "sheet.md").read_text()
    key = json.loads((tmp_path / "blind" / "key.json").read_text())
    assert key["differing"] == pairs and sorted(p["id"] for p in key["pairs"].values()) == sorted(ids[2:])
    assert {p["A"] for p in key["pairs"].values()} == {"first", "second"}  # the order is drawn per pair
    items = sheet.split("\n## ")[1:]
    for item, (number, pair) in zip(items, key["pairs"].items()):
        reply_a, reply_b = (line.split(": ", 1)[1] for line in item.strip().splitlines()[-2:])
        shown = {"first": first, "second": second}
        assert item.startswith(number) and (reply_a, reply_b) == (shown[pair["A"]][pair["id"]], shown[pair["B"]][pair["id"]])
        assert dialogues[pair["id"]].response not in item  # the gold reply is not shown
        assert all(line.startswith(("Speaker: ", "Listener: ", "Reply A: ", "Reply B: "))
                   for line in item.strip().splitlines()[1:])  # nothing else, so nothing names the run
    # Judge 1 always prefers the first run; judge 2 the second on pairs 1-3, ties elsewhere.
    pick = {n: ("A" if p["A"] == "first" else "B") for n, p in key["pairs"].items()}
    other = {n: ("B" if c == "A" else "A") for n, c in pick.items()}
    (tmp_path / "judge_1.txt").write_text("".join(f"{n}: {c}\n" for n, c in pick.items()))
    (tmp_path / "judge_2.txt").write_text("".join(f"{n}: {other[n] if int(n) <= 3 else 'tie'}\n" for n in pick))
    scored = bench("score", "--key", tmp_path / "blind" / "key.json", tmp_path / "judge_1.txt", tmp_path / "judge_2.txt")
    assert scored.returncode == 0, scored.stderr[-2000:]
    table = {line.split()[0]: line.split()[1:] for line in scored.stdout.splitlines()
             if line.startswith(("judge_", "majority")) and line.split()[1].isdigit()}
    assert table["judge_1.txt"][:3] == [str(pairs), "0", "0"] and table["judge_2.txt"][:3] == ["0", "3", str(pairs - 3)]
    assert table["majority"][:3] == ["0", "0", str(pairs)]  # no reply had more than half of two judges
    assert f"answered alike on 0 of {pairs}" in scored.stdout
    # A judge who skipped a pair is an error naming the file.
    (tmp_path / "judge_3.txt").write_text("1: A\n")
    refused = bench("score", "--key", tmp_path / "blind" / "key.json", tmp_path / "judge_3.txt")
    assert refused.returncode != 0 and "judge_3.txt: no answer for pairs 2" in refused.stderr
