"""A bag-of-words emotion classifier: the bar a trained model's emotion accuracy must clear.

TF-IDF weighted unigrams and bigrams of the dialogue's text (the turns the model reads),
into a multinomial logistic regression trained with L2 regularisation by full-batch
L-BFGS. It sees exactly what the model sees, so the comparison is fair.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .text import tokenize


def dialogue_text(dialogue) -> str:
    """The text of a dialogue as the model reads it: every turn, oldest first."""
    return " ".join(turn.text for turn in dialogue.turns)


def fit_softmax_regression(x: torch.Tensor, y: torch.Tensor, classes: int, l2: float,
                           max_iterations: int) -> torch.Tensor:
    """Multinomial logistic regression by full-batch L-BFGS: ``x`` ``(N, D + 1)`` rows
    whose last column is the bias's 1, ``y`` ``(N,)`` class indices; returns the weights
    ``(D + 1, classes)`` minimising the mean cross-entropy plus ``l2`` times the squared
    norm of every row but the bias's."""
    weights = torch.zeros(x.shape[1], classes, requires_grad=True)
    optimizer = torch.optim.LBFGS([weights], max_iter=max_iterations, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ weights, y) + l2 * weights[:-1].pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return weights.detach()


@dataclass
class BagOfWordsEmotion:
    """Fit on texts and labels; ``predict`` returns labels.

    Args:
        min_count: keep n-grams seen in at least this many training texts.
        ngrams: the n-gram orders used (1 and 2).
        l2: the weight of the squared-norm penalty (per training example).
        max_iterations: L-BFGS iterations.
    """

    min_count: int = 2
    ngrams: Sequence[int] = (1, 2)
    l2: float = 1e-4
    max_iterations: int = 200
    vocabulary: Dict[str, int] = field(default_factory=dict)
    labels: List[str] = field(default_factory=list)
    _idf: Optional[torch.Tensor] = None
    _weights: Optional[torch.Tensor] = None

    def _grams(self, text: str) -> List[str]:
        tokens = tokenize(text)
        return [" ".join(tokens[i : i + n]) for n in self.ngrams for i in range(len(tokens) - n + 1)]

    def _features(self, texts: Sequence[str]) -> torch.Tensor:
        """``(N, V + 1)`` L2-normalised TF-IDF rows with a bias column."""
        rows, cols, values = [], [], []
        for row, text in enumerate(texts):
            counts = Counter(g for g in self._grams(text) if g in self.vocabulary)
            for gram, count in counts.items():
                rows.append(row)
                cols.append(self.vocabulary[gram])
                values.append(1.0 + math.log(count))
        dense = torch.zeros(len(texts), len(self.vocabulary))
        if rows:
            dense[rows, cols] = torch.tensor(values)
        dense = dense * self._idf
        dense = dense / dense.norm(dim=1, keepdim=True).clamp_min(1e-12)
        return torch.cat([dense, torch.ones(len(texts), 1)], dim=1)

    def fit(self, texts: Sequence[str], labels: Sequence[str]) -> "BagOfWordsEmotion":
        if not texts or len(texts) != len(labels):
            raise ValueError(f"need as many labels as texts (got {len(texts)} texts, {len(labels)} labels)")
        document_counts = Counter(g for text in texts for g in set(self._grams(text)))
        kept = sorted(g for g, c in document_counts.items() if c >= self.min_count)
        self.vocabulary = {g: i for i, g in enumerate(kept)}
        n = len(texts)
        self._idf = torch.tensor([math.log((1 + n) / (1 + document_counts[g])) + 1.0 for g in kept])
        self.labels = sorted(set(labels))
        index = {label: i for i, label in enumerate(self.labels)}
        y = torch.tensor([index[label] for label in labels])
        self._weights = fit_softmax_regression(self._features(texts), y, len(self.labels), self.l2, self.max_iterations)
        return self

    def _scores(self, texts: Sequence[str]) -> torch.Tensor:
        """``(N, C)`` logits over :attr:`labels`."""
        if self._weights is None:
            raise RuntimeError("fit the classifier first")
        if not texts:
            return torch.zeros(0, len(self.labels))
        return self._features(texts) @ self._weights

    def predict(self, texts: Sequence[str]) -> List[str]:
        scores = self._scores(texts)
        return [self.labels[i] for i in scores.argmax(1).tolist()]

    def predict_proba(self, texts: Sequence[str]) -> torch.Tensor:
        """``(N, C)`` probabilities over :attr:`labels` (softmax of the logits; its argmax
        is what :meth:`predict` returns)."""
        return torch.softmax(self._scores(texts), dim=1)


@dataclass(frozen=True)
class PairedAccuracy:
    """Two classifiers scored on the same examples.

    ``difference`` is ``accuracy_a - accuracy_b``; ``interval`` its paired-bootstrap 95 %
    interval; ``p_value`` the exact two-sided McNemar test on the examples where exactly
    one of the two is right (``only_a``, ``only_b``).
    """

    examples: int
    accuracy_a: float
    accuracy_b: float
    difference: float
    interval: Tuple[float, float]
    only_a: int
    only_b: int
    p_value: float


def compare_paired_accuracy(
    correct_a: Sequence[bool], correct_b: Sequence[bool], resamples: int = 10_000, seed: int = 0
) -> PairedAccuracy:
    """Is classifier A's accuracy really above B's on these examples?

    Both lists say, example by example, whether that classifier was right. Pairing matters:
    on the same examples the two are correlated, and an unpaired standard error overstates
    the noise in their difference.
    """
    if len(correct_a) != len(correct_b) or not correct_a:
        raise ValueError(f"need the same non-zero number of examples (got {len(correct_a)} and {len(correct_b)})")
    a = torch.tensor([bool(x) for x in correct_a], dtype=torch.float64)
    b = torch.tensor([bool(x) for x in correct_b], dtype=torch.float64)
    n = len(a)
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randint(n, (resamples, n), generator=generator)
    differences = (a[rows] - b[rows]).mean(1)
    low, high = torch.quantile(differences, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    only_a, only_b = int((a > b).sum()), int((b > a).sum())
    return PairedAccuracy(
        examples=n,
        accuracy_a=float(a.mean()),
        accuracy_b=float(b.mean()),
        difference=float((a - b).mean()),
        interval=(low, high),
        only_a=only_a,
        only_b=only_b,
        p_value=exact_sign_test(only_a, only_b),
    )


def exact_sign_test(wins_a: int, wins_b: int) -> float:
    """Two-sided exact p-value of ``wins_a`` against ``Binomial(wins_a + wins_b, 1/2)``:
    McNemar's test on the discordant pairs, or a sign test on preferences (ties left out)."""
    trials = wins_a + wins_b
    if not trials:
        return 1.0
    tail = sum(math.comb(trials, k) for k in range(min(wins_a, wins_b) + 1)) / 2.0**trials
    return min(1.0, 2.0 * tail)
