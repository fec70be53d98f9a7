"""The bag-of-words emotion baseline learns what words say and nothing else."""

from __future__ import annotations

import pytest

from empatheia import Dialogue, Turn
from empatheia.evaluation.baselines import BagOfWordsEmotion, compare_paired_accuracy, dialogue_text


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
