"""Text metrics (empatheia.evaluation.text) on hand-computed cases and degenerate inputs.

Every expected number is written out by hand, with the arithmetic in a comment. The
BERTScore-style tests that need the packaged MiniLM encoder and the VADER tests skip
(with the install command) where those packages are absent.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from empatheia.labels import UnknownEmotionError
from empatheia.evaluation.text import (
    UNKNOWN,
    LexiconEmotion,
    TokenMatchScorer,
    VaderSentiment,
    compare_paired_text,
    corpus_bleu,
    distinct,
    distinct_n,
    emotion_labels,
    emotion_report,
    packaged_minilm_dir,
    polarity_scores,
    token_match_score,
    tokenize,
)

# ---------------------------------------------------------------------------------------
# tokenisation
# ---------------------------------------------------------------------------------------


def test_tokenize_lowercases_and_splits_punctuation():
    assert tokenize("Hello, WORLD!!") == ["hello", ",", "world", "!", "!"]
    assert tokenize("I don't know.") == ["i", "don't", "know", "."]
    assert tokenize("") == []
    assert tokenize("   \n ") == []


# ---------------------------------------------------------------------------------------
# 1. emotion accuracy
# ---------------------------------------------------------------------------------------

PRED = ["sad", "Joyful", "afraid", "angry", "neutral"]
GOLD = ["sad", "joyful", "terrified", "angry", "lonely"]


def test_emotion_report_ed32_hand_computed():
    r = emotion_report(PRED, GOLD, view="ed32")
    # sad=sad ✓, joyful=joyful ✓ (case normalised), afraid≠terrified, angry ✓,
    # neutral is no ED label -> <unk>, wrong: 3 / 5
    assert r["n"] == 5 and r["correct"] == 3
    assert r["accuracy"] == pytest.approx(0.6)
    assert r["accuracy_percent"] == pytest.approx(60.0)
    assert r["labels"] == list(emotion_labels("ed32")) and len(r["labels"]) == 32
    pc = r["per_class"]
    assert pc["sad"] == {"accuracy": 1.0, "precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 1, "predicted": 1}
    # terrified: in gold once, never predicted -> recall 0, precision undefined, f1 0
    assert pc["terrified"]["recall"] == 0.0 and pc["terrified"]["precision"] is None and pc["terrified"]["f1"] == 0.0
    # afraid: predicted once, never gold -> precision 0, recall undefined, f1 0
    assert pc["afraid"]["precision"] == 0.0 and pc["afraid"]["recall"] is None and pc["afraid"]["f1"] == 0.0
    # a class neither present nor predicted is undefined and left out of macro-F1
    assert pc["grateful"]["f1"] is None
    # f1 over {sad, joyful, angry, terrified, afraid, lonely} = (1+1+1+0+0+0)/6 = 0.5
    assert r["macro_f1"] == pytest.approx(0.5)
    C = r["confusion"]
    labels, cols = r["confusion_rows"], r["confusion_columns"]
    assert C.shape == (32, 33) and cols[-1] == UNKNOWN and cols[:-1] == labels
    assert C[labels.index("terrified"), cols.index("afraid")] == 1
    assert C[labels.index("lonely"), cols.index(UNKNOWN)] == 1
    assert C.sum() == 5 and r["unknown_predictions"] == 1


def test_emotion_report_fold7_and_groups():
    groups = {"gender": ["male", "female", "male", "female", "male"], "age": ["child", None, "child", "elderly", "elderly"]}
    r = emotion_report(PRED, GOLD, view="fold7", groups=groups)
    # folded: sad/sad ✓, happy/happy ✓, fear/fear ✓ (afraid, terrified), angry ✓,
    # neutral (not foldable -> <unk>) vs lonely->sad ✗: 4 / 5
    assert r["labels"] == ["sad", "happy", "angry", "fear", "surprised", "contempt", "disgusted"]
    assert r["accuracy"] == pytest.approx(0.8)
    # sad: support 2 (sad, lonely), predicted 1, tp 1: P = 1, R = 0.5,
    # F1 = 2*1*0.5/1.5 = 0.6667; happy, fear, angry: F1 = 1
    assert r["per_class"]["sad"]["accuracy"] == pytest.approx(0.5)
    assert r["per_class"]["sad"]["f1"] == pytest.approx(2 / 3)
    # macro-F1 = (2/3 + 1 + 1 + 1) / 4 = 0.916667
    assert r["macro_f1"] == pytest.approx((2 / 3 + 3) / 4)
    # gender (Figure 6): male = items 0, 2, 4 -> ✓ ✓ ✗ = 2/3; female = 1, 3 -> ✓ ✓ = 1
    assert r["by_group"]["gender"]["male"] == {"accuracy": pytest.approx(2 / 3), "correct": 2, "n": 3}
    assert r["by_group"]["gender"]["female"]["accuracy"] == 1.0
    # age: item 1 (None) left out; child = 0, 2 -> 2/2; elderly = 3, 4 -> 1/2
    assert r["by_group"]["age"] == {
        "child": {"accuracy": 1.0, "correct": 2, "n": 2},
        "elderly": {"accuracy": 0.5, "correct": 1, "n": 2},
    }


def test_emotion_report_exact_view_and_custom_labels():
    r = emotion_report(["grossed out", "Happy"], ["Grossed_Out", "sad"], view="exact")
    # labels = sorted normalised gold: ["grossed out", "sad"]; 1 of 2 correct, "happy" -> <unk>
    assert r["labels"] == ["grossed out", "sad"]
    assert r["accuracy"] == 0.5 and r["unknown_predictions"] == 1
    r = emotion_report(["happy"], ["joyful"], labels=["Sad", "HAPPY"], view="fold7")
    assert r["labels"] == ["sad", "happy"] and r["accuracy"] == 1.0


def test_emotion_report_unknown_gold_labels():
    with pytest.raises(UnknownEmotionError, match=r"'bananas' at index 1"):
        emotion_report(["sad", "sad"], ["sad", "bananas"])
    with pytest.raises(UnknownEmotionError, match="index 0"):
        emotion_report(["sad"], [None])
    # skip: the item leaves every count, including the groups
    r = emotion_report(["sad", "sad", "happy"], ["sad", "bananas", "sad"], view="fold7", unknown_gold="skip", groups={"g": ["a", "a", "b"]})
    assert r["skipped_unknown_gold"] == 1 and r["n"] == 2 and r["accuracy"] == 0.5
    assert r["by_group"]["g"] == {"a": {"accuracy": 1.0, "correct": 1, "n": 1}, "b": {"accuracy": 0.0, "correct": 0, "n": 1}}
    # unknown predictions (not a string, not a label) are simply wrong
    r = emotion_report([None, "zzz"], ["sad", "sad"], view="fold7")
    assert r["accuracy"] == 0.0 and r["unknown_predictions"] == 2


def test_emotion_report_degenerate_inputs():
    r = emotion_report([], [], groups={"age": []})
    assert r["n"] == 0 and r["accuracy"] is None and r["accuracy_percent"] is None and r["macro_f1"] is None
    assert r["confusion"].shape == (32, 33) and r["confusion"].sum() == 0
    assert r["by_group"] == {"age": {}}
    # all identical and all right: accuracy 1, macro-F1 over the one present class = 1
    r = emotion_report(["sad"] * 3, ["sad"] * 3)
    assert r["accuracy"] == 1.0 and r["macro_f1"] == 1.0
    with pytest.raises(ValueError, match="2 predicted labels but 1 gold"):
        emotion_report(["sad", "sad"], ["sad"])
    with pytest.raises(ValueError, match="group 'age'"):
        emotion_report(["sad"], ["sad"], groups={"age": []})
    with pytest.raises(ValueError, match="unknown emotion view"):
        emotion_report(["sad"], ["sad"], view="ed33")


# ---------------------------------------------------------------------------------------
# 2. Dist-n
# ---------------------------------------------------------------------------------------


def test_distinct_hand_computed():
    r = distinct(["I am happy", "I am sad"])
    # unigrams: i am happy i am sad -> 4 unique / 6 total = 0.6667
    # bigrams: (i am)(am happy)(i am)(am sad) -> 3 unique / 4 total = 0.75
    assert (r["unique_1"], r["total_1"], r["unique_2"], r["total_2"]) == (4, 6, 3, 4)
    assert r["dist_1"] == pytest.approx(4 / 6) and r["dist_1_x100"] == pytest.approx(400 / 6)
    assert r["dist_2"] == pytest.approx(0.75) and r["dist_2_x100"] == pytest.approx(75.0)
    assert r["paper_scale"] == "x100"
    assert distinct_n(["I am happy", "I am sad"], 2) == pytest.approx(0.75)
    # punctuation is a token: "wow !" -> 2 unigrams, 1 bigram, all distinct
    assert distinct(["Wow!"])["dist_2"] == 1.0


def test_distinct_degenerate():
    empty = distinct([])
    assert empty["dist_1"] is None and empty["dist_2_x100"] is None and empty["n_responses"] == 0
    assert distinct_n([], 1) is None
    # empty response: no n-grams at all -> 0.0
    assert distinct([""])["dist_1"] == 0.0 and distinct([""])["dist_2"] == 0.0
    # one one-word response: 1/1 unigram; no bigram -> 0.0
    one = distinct(["hi"])
    assert one["dist_1"] == 1.0 and one["dist_2"] == 0.0
    # n-grams never span responses: ["a", "a"] has no bigram (not (a, a))
    assert distinct(["a", "a"])["total_2"] == 0 and distinct(["a", "a"])["dist_1"] == 0.5
    # all identical: 3 x "good job" -> unigrams 2/6, bigrams 1/3
    same = distinct(["good job"] * 3)
    assert same["dist_1"] == pytest.approx(1 / 3) and same["dist_2"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        distinct_n(["a"], 0)


# ---------------------------------------------------------------------------------------
# 3. BLEU
# ---------------------------------------------------------------------------------------


def test_bleu_identical_is_one():
    r = corpus_bleu(["The cat sat on the mat."], ["the cat sat on the mat ."])
    assert [r[f"bleu_{n}"] for n in range(1, 5)] == [1.0, 1.0, 1.0, 1.0]
    assert r["brevity_penalty"] == 1.0


def test_bleu_clipping_and_smoothing():
    hyp, ref = ["the the the the the the the"], ["the cat is on the mat"]
    r = corpus_bleu(hyp, ref)
    # p1 = min(7, 2) / 7 = 2/7; c = 7 > r = 6 -> BP = 1; bigram (the the) x6, 0 matches
    assert r["precisions"][0] == pytest.approx(2 / 7)
    assert r["bleu_1"] == pytest.approx(2 / 7)
    assert r["bleu_2"] == 0.0 and r["bleu_4"] == 0.0  # no smoothing: a zero p_n zeroes BLEU
    # epsilon: p2 = 0.1 / 6 -> BLEU-2 = sqrt(2/7 * 0.1/6) = sqrt(0.0047619) = 0.0690066
    assert corpus_bleu(hyp, ref, max_n=2, smoothing="epsilon")["bleu_2"] == pytest.approx(0.0690066, abs=1e-6)
    # exp: first zero order gets 1 / (2 * 6) -> BLEU-2 = sqrt(2/7 / 12) = 0.1543033
    assert corpus_bleu(hyp, ref, max_n=2, smoothing="exp")["bleu_2"] == pytest.approx(0.1543033, abs=1e-6)
    # exp, 4 orders: p = 2/7, 1/12, 1/(4*5), 1/(8*4) -> (2/7 * 1/12 * 1/20 * 1/32)^(1/4)
    expected = (2 / 7 / 12 / 20 / 32) ** 0.25  # = 0.0811 ...
    assert corpus_bleu(hyp, ref, smoothing="exp")["bleu_4"] == pytest.approx(expected)


def test_bleu_brevity_penalty_and_short_hypothesis():
    r = corpus_bleu(["the cat"], ["the cat sat on the mat"])
    # c = 2, r = 6 -> BP = exp(1 - 6/2) = exp(-2) = 0.135335; p1 = p2 = 1
    assert r["brevity_penalty"] == pytest.approx(math.exp(-2))
    assert r["bleu_2"] == pytest.approx(0.135335, abs=1e-6)
    # no trigram in the hypothesis (t3 = 0): BLEU-3 and BLEU-4 are 0 under any smoothing
    assert r["precisions"][2] is None and r["bleu_3"] == 0.0
    assert corpus_bleu(["the cat"], ["the cat sat on the mat"], smoothing="exp")["bleu_4"] == 0.0


def test_bleu_multiple_references():
    # closest reference length: |hyp| = 3, refs of 2 and 4 tokens tie -> the shorter, 2;
    # c = 3 > 2 -> BP = 1; unigrams a b c all in some ref (3/3), bigrams (a b)(b c) (2/2)
    r = corpus_bleu(["a b c"], [["a b", "a b c d"]], max_n=2)
    assert r["ref_length"] == 2 and r["bleu_2"] == 1.0
    # one reference of 5: BP = exp(1 - 5/3) = exp(-2/3) = 0.513417
    assert corpus_bleu(["a b c"], [["a b c d e"]], max_n=2)["bleu_2"] == pytest.approx(0.513417, abs=1e-6)
    # clipping by the max count over references: "the" x3 vs max(1, 2) -> 2/3
    assert corpus_bleu(["the the the"], [["the cat", "the the dog"]], max_n=1)["bleu_1"] == pytest.approx(2 / 3)


def test_bleu_is_corpus_level_not_mean_of_sentences():
    # ex1 identical (4 unigrams, 3 bigrams matched); ex2 "x y" vs "z w" nothing matched:
    # p1 = 4/6, p2 = 3/4, c = r = 6 -> BLEU-2 = sqrt(4/6 * 3/4) = sqrt(0.5) = 0.707107
    # (the mean of sentence BLEU-2 would be (1 + 0) / 2 = 0.5)
    r = corpus_bleu(["a b c d", "x y"], ["a b c d", "z w"], max_n=2)
    assert r["bleu_2"] == pytest.approx(math.sqrt(0.5))


def test_bleu_degenerate():
    # no references at all: the example is left out; nothing left -> None
    r = corpus_bleu(["a b"], [[]])
    assert r["n_without_references"] == 1 and r["n_examples"] == 0 and r["bleu_1"] is None
    # one example without references among others: only the other one counts
    r = corpus_bleu(["a b", "junk"], [["a b"], []], max_n=2)
    assert r["n_examples"] == 1 and r["bleu_2"] == 1.0
    # empty hypothesis: c = 0 -> BP = 0 -> BLEU 0
    r = corpus_bleu([""], ["a b"])
    assert r["brevity_penalty"] == 0.0 and r["bleu_1"] == 0.0
    # empty corpus
    assert corpus_bleu([], [])["bleu_4"] is None
    with pytest.raises(ValueError):
        corpus_bleu(["a"], ["a", "b"])
    with pytest.raises(ValueError, match="smoothing"):
        corpus_bleu(["a"], ["a"], smoothing="add7")


# ---------------------------------------------------------------------------------------
# 4. BERTScore-style matching
# ---------------------------------------------------------------------------------------


class _FixedEmbeddings(TokenMatchScorer):
    """The scorer's matching on hand-made token embeddings (no encoder)."""

    def __init__(self, table, **kwargs):
        super().__init__(**kwargs)
        self.table = table  # text -> (token ids, unit vectors)

    def embed(self, texts):
        out = []
        for t in texts:
            ids, vectors = self.table[t]
            out.append((torch.tensor(vectors, dtype=torch.float64).reshape(len(ids), 3), list(ids)))
        return out


_S = 1 / math.sqrt(2)
_TABLE = {
    # candidate: token 1 = e_x, token 2 = e_y
    "c": ([1, 2], [[1, 0, 0], [0, 1, 0]]),
    # reference r: token 1 = e_x, token 3 = (e_y + e_z)/sqrt2
    "r": ([1, 3], [[1, 0, 0], [0, _S, _S]]),
    # reference q: token 1 = e_x
    "q": ([1], [[1, 0, 0]]),
    "": ([], []),
}


def test_greedy_matching_hand_computed():
    out = _FixedEmbeddings(_TABLE).score(["c", "c"], ["r", "q"])
    # c vs r: cand maxima = [cos(x,x)=1, cos(y,(y+z)/√2)=0.707107] -> P = 0.853553;
    # ref maxima = [1, 0.707107] -> R = 0.853553; F = 0.853553
    # c vs q: cand maxima = [1, 0] -> P = 0.5; ref maxima = [1] -> R = 1; F = 2*0.5/1.5 = 0.666667
    np.testing.assert_allclose(out["precision"], [0.853553, 0.5], atol=1e-6)
    np.testing.assert_allclose(out["recall"], [0.853553, 1.0], atol=1e-6)
    np.testing.assert_allclose(out["f1"], [0.853553, 2 / 3], atol=1e-6)
    assert out["mean"]["f1"] == pytest.approx((0.853553 + 2 / 3) / 2, abs=1e-6)


def test_greedy_matching_idf_hand_computed():
    out = _FixedEmbeddings(_TABLE, idf=True).score(["c", "c"], ["r", "q"])
    # M = 2 references; df(1) = 2 -> idf 0; df(3) = 1 -> idf log(3/2); token 2 unseen -> log 3
    # c vs r: P = (0*1 + log3*0.707107) / log3 = 0.707107; R = (0*1 + log1.5*0.707107) / log1.5
    # c vs q: P = (0*1 + log3*0) / log3 = 0; q's only weight is 0 -> uniform: R = 1; F = 0
    np.testing.assert_allclose(out["precision"], [_S, 0.0], atol=1e-6)
    np.testing.assert_allclose(out["recall"], [_S, 1.0], atol=1e-6)
    np.testing.assert_allclose(out["f1"], [_S, 0.0], atol=1e-6)


def test_greedy_matching_degenerate():
    scorer = _FixedEmbeddings(_TABLE)
    # best of several references is kept: c vs [q, r] -> r's F1 0.853553
    out = scorer.score(["c"], [["q", "r"]])
    assert out["f1"][0] == pytest.approx(0.853553, abs=1e-6)
    # empty candidate or reference: 0; no reference: NaN, left out of the mean
    out = scorer.score(["", "c", "c"], ["r", "", []])
    assert out["f1"][0] == 0.0 and out["precision"][1] == 0.0 and math.isnan(out["f1"][2])
    assert out["n_examples"] == 2 and out["n_without_references"] == 1 and out["mean"]["f1"] == 0.0
    out = scorer.score([], [])
    assert out["f1"].shape == (0,) and out["mean"] is None
    out = scorer.score(["c"], [[]])
    assert out["mean"] is None and out["n_examples"] == 0
    with pytest.raises(ValueError):
        scorer.score(["c"], [])


@pytest.fixture(scope="module")
def minilm():
    try:
        packaged_minilm_dir()
    except FileNotFoundError as error:
        pytest.skip(str(error))
    return TokenMatchScorer()


CANDIDATES = [
    "The cat sat on the mat.",
    "The cat sat on the mat.",
    "The cat sat on the mat.",
    "I am so sorry to hear about your dog.",
    "Congratulations on the new job!",
]
REFERENCES = [
    "The cat sat on the mat.",
    "A cat was sitting on the mat.",
    "Quarterly revenue exceeded analyst forecasts.",
    "That is terrible, I'm sorry your dog passed away.",
    ["Stocks fell sharply.", "Congratulations on the new job!"],
]


def test_minilm_score_identical_related_unrelated(minilm):
    out = minilm.score(CANDIDATES, REFERENCES)
    for key in ("precision", "recall", "f1"):
        assert out[key].shape == (5,)
        assert out[key][0] == pytest.approx(1.0, abs=1e-6)  # identical
        assert out[key][4] == pytest.approx(1.0, abs=1e-6)  # identical among two references
    # paraphrase scores below identical and above an unrelated sentence
    assert out["f1"][2] < out["f1"][1] < 1.0 - 1e-3
    assert out["f1"][3] > out["f1"][2]
    assert out["mean"]["f1"] == pytest.approx(float(out["f1"].mean()))
    assert "MiniLM" in out["model"] and out["idf"] is False


def test_minilm_batching_is_consistent(minilm):
    together = minilm.score(CANDIDATES, REFERENCES)
    small = TokenMatchScorer(batch_size=2)
    small._tokenizer, small._model = minilm._load()  # same encoder, other batching
    batched = small.score(CANDIDATES, REFERENCES)
    one_by_one = np.array([minilm.score([c], [r])["f1"][0] for c, r in zip(CANDIDATES, REFERENCES)])
    np.testing.assert_allclose(batched["f1"], together["f1"], atol=1e-5)
    np.testing.assert_allclose(one_by_one, together["f1"], atol=1e-5)


def test_minilm_degenerate_and_idf(minilm):
    out = minilm.score(["", "hello"], ["hello", []])
    assert out["f1"][0] == 0.0 and math.isnan(out["f1"][1])
    idf = token_match_score(["The cat sat on the mat."], ["The cat sat on the mat."], idf=True)
    assert idf["f1"][0] == pytest.approx(1.0, abs=1e-6) and idf["idf"] is True


# ---------------------------------------------------------------------------------------
# 5. polarity
# ---------------------------------------------------------------------------------------

_SENT = {"h1 h2": 0.5, "h1": 0.6, "h2": 0.2, "r": -0.3, "": 0.0}
_EMO = {"h1": [1.0, 0.0], "h2": [0.0, 1.0], "r": [1.0, 0.0], "": [0.0, 0.0]}


def _sentiment(texts):
    return np.array([_SENT[t] for t in texts])


def _emotion(texts):
    return np.array([_EMO[t] for t in texts])


def test_polarity_hand_computed():
    out = polarity_scores([["h1", "h2"]], ["r"], sentiment=_sentiment, emotion=_emotion)
    # sentiment (concat): 1 - |0.5 - (-0.3)| = 0.2
    # emotion: history mean = [0.5, 0.5]; cos([.5,.5], [1,0]) = 0.5 / (0.707107 * 1) = 0.707107
    # empathy = (0.707107 + 0.2) / 2 = 0.453553
    assert out["sentiment"][0] == pytest.approx(0.2)
    assert out["emotion"][0] == pytest.approx(_S)
    assert out["empathy"][0] == pytest.approx((_S + 0.2) / 2)
    assert out["mean"] == pytest.approx({"emotion": _S, "sentiment": 0.2, "empathy": (_S + 0.2) / 2})
    # per-utterance mean: s_history = (0.6 + 0.2) / 2 = 0.4 -> 1 - |0.4 + 0.3| = 0.3
    out = polarity_scores([["h1", "h2"]], ["r"], sentiment=_sentiment, emotion=_emotion, history_sentiment="mean")
    assert out["sentiment"][0] == pytest.approx(0.3)


def test_polarity_degenerate():
    # opposite extremes are not clipped: 1 - |1 - (-1)| = -1
    def extremes(texts):
        return np.array([1.0 if t == "up" else -1.0 for t in texts])

    def uniform(texts):
        return np.ones((len(texts), 2))

    out = polarity_scores([["up"]], ["down"], sentiment=extremes, emotion=uniform)
    assert out["sentiment"][0] == -1.0 and out["emotion"][0] == pytest.approx(1.0)
    # empty history is one empty utterance; a zero distribution gives cosine 0
    out = polarity_scores([[]], ["r"], sentiment=_sentiment, emotion=_emotion)
    assert out["sentiment"][0] == pytest.approx(1 - 0.3) and out["emotion"][0] == 0.0
    out = polarity_scores([], [], sentiment=_sentiment, emotion=_emotion)
    assert out["emotion"].shape == (0,) and out["mean"] is None and out["n"] == 0
    with pytest.raises(ValueError):
        polarity_scores([["h1"]], [], sentiment=_sentiment, emotion=_emotion)
    with pytest.raises(TypeError):
        polarity_scores(["h1"], ["r"], sentiment=_sentiment, emotion=_emotion)


def test_lexicon_emotion():
    lex = LexiconEmotion()
    assert lex.classes == ("sad", "happy", "angry", "fear", "surprised", "contempt", "disgusted", "neutral")
    e = lex(["I am so happy and excited!", "I'm not happy at all", "sad and scared", "", "The table is brown."])
    assert e.shape == (5, 8)
    np.testing.assert_allclose(e.sum(axis=1), 1.0)
    assert e[0, 1] == 1.0  # happy, excited -> 2/2 happy
    assert e[1, 7] == 1.0  # "not happy": the negated word is dropped -> neutral
    np.testing.assert_allclose(e[2, [0, 3]], [0.5, 0.5])  # one sad word, one fear word
    assert e[3, 7] == 1.0 and e[4, 7] == 1.0  # empty / no emotion word -> neutral
    # a custom word list
    custom = LexiconEmotion({"pos": ["yes"], "neg": ["no"]})
    np.testing.assert_allclose(custom(["yes yes no"]), [[2 / 3, 1 / 3, 0.0]])


def test_polarity_with_vader_and_lexicon():
    pytest.importorskip("vaderSentiment", reason="pip install --no-deps vaderSentiment==3.3.2")
    vader = VaderSentiment()
    s = vader(["", "I love this, it is wonderful!", "This is terrible and awful."])
    assert s[0] == 0.0 and s[1] > 0.5 and s[2] < -0.5
    happy = "I am so happy today!"
    out = polarity_scores([[happy], ["I got the job, I am thrilled!"], [""]], [happy, "That is sad, I am sorry.", ""], sentiment=vader)
    # identical history and response: sentiment 1, emotion 1, empathy 1
    assert out["sentiment"][0] == pytest.approx(1.0) and out["emotion"][0] == pytest.approx(1.0) and out["empathy"][0] == pytest.approx(1.0)
    # happy history, sad response: lexicon distributions are disjoint -> emotion 0; sentiment < 1
    assert out["emotion"][1] == 0.0 and out["sentiment"][1] < 0.5
    # empty history and empty response: both neutral, both sentiment 0 -> 1
    assert out["empathy"][2] == pytest.approx(1.0)
    assert "VADER" in out["sentiment_model"] and "word lists" in out["emotion_model"]


# ---------------------------------------------------------------------- two systems, paired
PAIRED_VARIED = ["What happened to your car?", "Oh no, was anyone hurt?", "Congratulations, you earned it!",
          "That must have been lonely.", "How did your sister react?", "I would be furious too.",
          "Did the dog come back home?", "What a lovely surprise from your brother!"]
PAIRED_GENERIC = ["I'm so sorry to hear that.", "I'm so sorry to hear that.", "That's great!", "I'm so sorry to hear that.",
           "That's great!", "I'm so sorry to hear that.", "I'm so sorry to hear that.", "That's great!"]
PAIRED_GOLD = ["Is your car badly damaged?", "Was anyone hurt in the crash?", "Congratulations, you really earned it!",
        "Moving can be so lonely.", "How did your sister take it?", "I would be so angry too.",
        "Did your dog ever come back?", "What a lovely surprise!"]


def test_paired_text_metrics_match_the_corpus_metrics_and_test_the_difference():
    compared = compare_paired_text(PAIRED_VARIED, PAIRED_GENERIC, PAIRED_GOLD, resamples=500)
    assert set(compared) == {"bleu_1", "bleu_2", "bleu_3", "bleu_4", "dist_1", "dist_2"}
    for system, answers in (("a", PAIRED_VARIED), ("b", PAIRED_GENERIC)):
        bleu, dist = corpus_bleu(answers, PAIRED_GOLD), distinct(answers)
        for order in range(1, 5):
            assert getattr(compared[f"bleu_{order}"], system) == pytest.approx(bleu[f"bleu_{order}"], abs=1e-12)
        for order in (1, 2):
            assert getattr(compared[f"dist_{order}"], system) == pytest.approx(dist[f"dist_{order}"], abs=1e-12)
    # Eight varied answers against the same two repeated: the randomisation test sees it.
    dist_2, bleu_2 = compared["dist_2"], compared["bleu_2"]
    assert dist_2.difference > 0.4 and dist_2.p_value < 0.05 and dist_2.interval is None
    low, high = bleu_2.interval
    assert bleu_2.difference > 0 and 0 < low < bleu_2.difference < high and bleu_2.p_value < 0.05
    # The same answers on both sides differ by nothing, which every resample agrees with.
    same = compare_paired_text(PAIRED_VARIED, PAIRED_VARIED, PAIRED_GOLD, resamples=200)
    assert all(m.difference == 0 and m.p_value == 1.0 for m in same.values())
    assert same["bleu_4"].interval == (0.0, 0.0)
    # Swapping the systems turns each difference round; the test and interval follow.
    reverse = compare_paired_text(PAIRED_GENERIC, PAIRED_VARIED, PAIRED_GOLD, resamples=500)
    assert reverse["dist_2"].difference == pytest.approx(-dist_2.difference)
    assert reverse["dist_2"].p_value == pytest.approx(dist_2.p_value)
    assert reverse["bleu_2"].interval == pytest.approx((-high, -low))


def test_paired_text_metrics_leave_examples_without_a_reference_out_of_bleu_only():
    references = PAIRED_GOLD[:-1] + [[]]
    compared = compare_paired_text(PAIRED_VARIED, PAIRED_GENERIC, references, resamples=100)
    assert compared["bleu_1"].a == pytest.approx(corpus_bleu(PAIRED_VARIED[:-1], PAIRED_GOLD[:-1])["bleu_1"], abs=1e-12)
    assert compared["dist_1"].a == pytest.approx(distinct(PAIRED_VARIED)["dist_1"], abs=1e-12)
    with pytest.raises(ValueError, match="same non-zero number"):
        compare_paired_text(PAIRED_VARIED, PAIRED_GENERIC[:-1], PAIRED_GOLD)


def test_the_paired_bench_compares_two_eval_runs_by_id(tmp_path):
    repo = Path(__file__).resolve().parents[1]
    ids = [f"d{i}" for i in range(len(PAIRED_GOLD))]
    for name, answers in (("a", PAIRED_VARIED), ("b", PAIRED_GENERIC)):
        run = tmp_path / name
        run.mkdir()
        order = ids if name == "a" else ids[::-1]  # matched by id, not by line
        texts = dict(zip(ids, answers))
        (run / "predictions.jsonl").write_text("".join(json.dumps({"id": i, "text": texts[i], "emotion": "sad"}) + "\n"
                                                       for i in order))
        (run / "references.jsonl").write_text("".join(json.dumps({"id": i, "response": r, "emotion": "sad"}) + "\n"
                                                      for i, r in zip(ids, PAIRED_GOLD)))
    command = [sys.executable, "bench/paired_text_metrics.py", str(tmp_path / "a"), str(tmp_path / "b"),
               "--resamples", "300", "--json", str(tmp_path / "paired.json")]
    done = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| Dist-2 |" in done.stdout and "| BLEU-4 |" in done.stdout
    written = json.loads((tmp_path / "paired.json").read_text())["metrics"]
    expected = compare_paired_text(PAIRED_VARIED, PAIRED_GENERIC, PAIRED_GOLD, resamples=300)
    assert written["dist_2"]["difference"] == pytest.approx(expected["dist_2"].difference)
    assert written["bleu_2"]["interval"] == pytest.approx(list(expected["bleu_2"].interval))
    # A run that left an example out is refused, naming it.
    lines = (tmp_path / "b" / "predictions.jsonl").read_text().splitlines()
    (tmp_path / "b" / "predictions.jsonl").write_text("\n".join(l for l in lines if '"d3"' not in l) + "\n")
    done = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "run B" in done.stderr and "'d3'" in done.stderr
