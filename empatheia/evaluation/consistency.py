"""Cross-modal consistency of a multimodal response: do text, speech and video agree?

The paper's human MCC and MSC scores (multimodal content and style consistency, §6.1)
ask whether the three modalities say the same thing in the same way. Automatic
counterparts:

* **emotion agreement** (:func:`emotion_agreement`): the emotion read from the text (e.g.
  the model's predicted class), from the speech (a speech-emotion classifier, or the
  emotion the speech style was asked to carry) and from the face
  (:class:`~empatheia.evaluation.fer.FacialExpressionClassifier`), given per item as
  labels or probability distributions: agreement of every pair and of all three;
* **content agreement** (:func:`content_agreement`): whether the speech says the
  response text: ``1 - WER`` of its transcript (:class:`~empatheia.evaluation.speech.
  Transcriber`) and a character-level similarity.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .speech import character_errors, normalize_text, word_errors

EmotionReading = Union[str, Sequence[float], np.ndarray, None]
"""One item's emotion in one modality: a label, a ``(C,)`` distribution over the label
set, or ``None`` when that modality is missing for the item."""

MODALITIES = ("text", "speech", "video")


@dataclass
class EmotionAgreement:
    """Result of :func:`emotion_agreement`."""

    pairwise: Dict[Tuple[str, str], float]
    """Share of items whose two modalities read the same emotion (argmax for
    distributions), per pair of modalities."""
    all_three: float
    """Share of items on which all modalities agree (NaN when no item has them all)."""
    soft_pairwise: Dict[Tuple[str, str], float] = field(default_factory=dict)
    """Mean overlap ``sum_c min(p_a(c), p_b(c))`` (``1 -`` total variation distance) per
    pair; a label counts as a one-hot distribution."""
    counts: Dict[Union[Tuple[str, str], str], int] = field(default_factory=dict)
    """Items scored per pair, and under ``"all"`` for all three."""

    @property
    def mean_pairwise(self) -> float:
        """Mean of the pairwise agreements that had items."""
        values = [v for v in self.pairwise.values() if not np.isnan(v)]
        return float(np.mean(values)) if values else float("nan")


def _distribution(reading: EmotionReading, labels: Sequence[str], fold) -> Optional[np.ndarray]:
    """A reading as a ``(C,)`` distribution over ``labels`` (one-hot for a label)."""
    if reading is None:
        return None
    if isinstance(reading, str):
        label = fold(reading)
        if label not in labels:
            raise ValueError(f"emotion {reading!r} is not one of {list(labels)}")
        out = np.zeros(len(labels))
        out[list(labels).index(label)] = 1.0
        return out
    p = np.asarray(reading, dtype=np.float64)
    if p.shape != (len(labels),):
        raise ValueError(f"a distribution must have {len(labels)} entries (one per label), got shape {p.shape}")
    if np.any(p < 0) or p.sum() <= 0:
        raise ValueError(f"a distribution needs non-negative entries with a positive sum, got {p}")
    return p / p.sum()


def emotion_agreement(
    readings: Mapping[str, Sequence[EmotionReading]],
    labels: Optional[Sequence[str]] = None,
) -> EmotionAgreement:
    """Agreement of the emotions read from each modality, item by item.

    Args:
        readings: modality name (``"text"``, ``"speech"``, ``"video"`` or any other) ->
            one reading per item (:data:`EmotionReading`), all of the same length.
            Labels may be free text that :class:`empatheia.labels.LabelSets` folds onto
            ``labels`` (``"Grossed out"`` -> ``disgusted``).
        labels: the shared label set (default :data:`empatheia.labels.EMOTION_LABELS`).
            Map other label sets first, e.g. FER2013 classes with
            :func:`~empatheia.evaluation.fer.to_empatheia_probabilities`.

    For a pair of modalities ``(a, b)`` over the items where both are present:
    ``agreement = mean [argmax p_a == argmax p_b]`` and ``soft = mean sum_c min(p_a(c),
    p_b(c))`` (ties of a distribution go to the first label). ``all_three`` (all modalities, whatever their number) is the share of
    items with every modality present whose argmaxes are all equal. A pair without
    common items scores NaN.
    """
    from empatheia.labels import EMOTION_LABELS

    from .video import _emotion_folder

    labels = list(EMOTION_LABELS if labels is None else labels)
    fold = _emotion_folder(labels)

    names = list(readings)
    if len(names) < 2:
        raise ValueError("emotion agreement needs at least two modalities")
    lengths = {name: len(readings[name]) for name in names}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"every modality needs one reading per item, got {lengths}")
    # (modalities, items, C) with NaN rows for missing readings.
    count = lengths[names[0]]
    dist = np.full((len(names), count, len(labels)), np.nan)
    for m, name in enumerate(names):
        for i, reading in enumerate(readings[name]):
            p = _distribution(reading, labels, fold)
            if p is not None:
                dist[m, i] = p
    present = ~np.isnan(dist[..., 0])  # (modalities, items)
    winner = np.where(present, np.argmax(np.nan_to_num(dist, nan=-1.0), axis=-1), -1)

    pairwise, soft, counts = {}, {}, {}
    for a, b in combinations(range(len(names)), 2):
        both = present[a] & present[b]
        key = (names[a], names[b])
        counts[key] = int(both.sum())
        if not both.any():
            pairwise[key] = soft[key] = float("nan")
            continue
        pairwise[key] = float(np.mean(winner[a, both] == winner[b, both]))
        soft[key] = float(np.mean(np.minimum(dist[a, both], dist[b, both]).sum(-1)))
    everywhere = present.all(axis=0)
    counts["all"] = int(everywhere.sum())
    all_agree = (winner[:, everywhere] == winner[:1, everywhere]).all(axis=0)
    all_three = float(all_agree.mean()) if everywhere.any() else float("nan")
    return EmotionAgreement(pairwise, all_three, soft, counts)


@dataclass
class ContentAgreement:
    """Result of :func:`content_agreement`."""

    word_agreement: float
    """``max(0, 1 - WER)`` of the transcript against the text, in ``[0, 1]``."""
    char_similarity: float
    """``1 - lev(a, b) / max(|a|, |b|)`` over the normalised strings, in ``[0, 1]``."""
    wer: float
    cer: float


def character_similarity(a: str, b: str, normalize: bool = True) -> float:
    """Symmetric character-level similarity ``1 - lev(a, b) / max(|a|, |b|)`` of two
    strings (normalised with :func:`~empatheia.evaluation.speech.normalize_text` unless
    ``normalize`` is False); 1.0 for two empty strings. Unlike CER it is bounded and does
    not single out one string as the reference."""
    if normalize:
        a, b = normalize_text(a), normalize_text(b)
    longest = max(len(a), len(b))
    if longest == 0:
        return 1.0
    return 1.0 - character_errors(a, b, normalize=False).errors / longest


def content_agreement(text: str, transcript: str) -> ContentAgreement:
    """Does the speech say the response? ``text`` is what it should say, ``transcript``
    what a recogniser heard (:meth:`~empatheia.evaluation.speech.Transcriber.transcribe`).

    ``word_agreement = max(0, 1 - WER)`` (WER can exceed 1 with many insertions, hence
    the clip), ``char_similarity`` from :func:`character_similarity`; ``wer`` and ``cer``
    are given as they are.
    """
    words = word_errors(text, transcript)
    characters = character_errors(text, transcript)
    return ContentAgreement(
        word_agreement=max(0.0, 1.0 - words.rate),
        char_similarity=character_similarity(text, transcript),
        wer=words.rate,
        cer=characters.rate,
    )


def mean_content_agreement(texts: Sequence[str], transcripts: Sequence[str]) -> ContentAgreement:
    """:func:`content_agreement` averaged over items (each item weighs the same; for a
    corpus WER use :func:`~empatheia.evaluation.speech.corpus_error_rate`)."""
    if len(texts) != len(transcripts) or not texts:
        raise ValueError(f"need as many transcripts as texts (>= 1), got {len(texts)} and {len(transcripts)}")
    items: List[ContentAgreement] = [content_agreement(t, h) for t, h in zip(texts, transcripts)]
    return ContentAgreement(
        word_agreement=float(np.mean([x.word_agreement for x in items])),
        char_similarity=float(np.mean([x.char_similarity for x in items])),
        wer=float(np.mean([x.wer for x in items])),
        cer=float(np.mean([x.cer for x in items])),
    )
