"""The bag-of-words emotion baseline learns what words say and nothing else."""

from __future__ import annotations

import pytest

from empatheia import Dialogue, Turn
from empatheia.evaluation.baselines import BagOfWordsEmotion, dialogue_text


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
