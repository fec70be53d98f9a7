"""E3RG's emotion vote: several readers of the user's emotion, one decision.

Rule: a weighted sum of the readers' distributions over the emotion classes, each reader
that has something to read (a distribution, not ``None``) counting with its weight; the
class with the largest sum wins, ties going to the class that comes first in
:data:`~empatheia.labels.EMOTION_LABELS`. The sum, renormalised over the readers that
voted, is the vote's distribution. A soft vote keeps a reader's doubt: a face read as
half fear, half surprise does not outvote a confident text.

The default weights (:data:`DEFAULT_WEIGHTS`) are each reader's accuracy over the seven
classes on real data (:data:`READER_ACCURACY`), corrected for chance: ``(a - 1/7) / (1 -
1/7)``, so a reader no better than guessing weighs nothing and a perfect one 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping, Optional

from ..labels import EMOTION_LABELS

READER_ACCURACY: Dict[str, float] = {
    # The small preset's chain on the 571 held-out EmpatheticDialogues examples (README): the
    # core's reading fused with the readers of the speaker's words (bag-of-words and
    # sentence, language_model.chain_emotion_reader).
    "chain": 0.771,
    # The shipped text classifier on the same examples (docs/small_preset/sentence_reader.json).
    "text": 0.611,
    # FER2013's network on the 21 emotional MEAD clips of shared/data (same file).
    "face": 0.619,
    # The prosody reader on the 6 real emotional speech clips of shared/data: fitted on the
    # offline voice's renderings (94.5 % on held-out ones), it does not carry to real voices.
    "prosody": 0.167,
}
"""Accuracy over the seven classes of each reader of the shipped ``small`` parts on real data."""

_CHANCE = 1.0 / len(EMOTION_LABELS)
DEFAULT_WEIGHTS: Dict[str, float] = {
    name: round(max(0.0, (accuracy - _CHANCE) / (1.0 - _CHANCE)), 3) for name, accuracy in READER_ACCURACY.items()
}
"""Chance-corrected :data:`READER_ACCURACY`: chain 0.733, text 0.546, face 0.555, prosody 0.028."""


@dataclass(frozen=True)
class VoteResult:
    label: str
    probabilities: Dict[str, float]
    """The weighted mean of the voting readers' distributions."""
    readings: Dict[str, Optional[Dict[str, float]]]
    """Each reader's distribution (``None``: it had nothing to read)."""
    weights: Dict[str, float]
    """The weights of the readers that voted."""


def emotion_vote(
    readings: Mapping[str, Optional[Mapping[str, float]]],
    weights: Optional[Mapping[str, float]] = None,
    classes=EMOTION_LABELS,
) -> VoteResult:
    """The vote of ``readings`` (reader name -> distribution over ``classes``, or
    ``None``) with ``weights`` (reader name -> weight >= 0; default
    :data:`DEFAULT_WEIGHTS`, a reader it does not name weighs 1). At least one reader
    must vote with a positive weight."""
    weights = dict(DEFAULT_WEIGHTS if weights is None else weights)
    totals = {c: 0.0 for c in classes}
    used: Dict[str, float] = {}
    for name, reading in readings.items():
        weight = float(weights.get(name, 1.0))
        if weight < 0:
            raise ValueError(f"reader {name!r} has a negative weight {weight}")
        if reading is None or weight == 0:
            continue
        unknown = set(reading) - set(classes)
        if unknown:
            raise ValueError(f"reader {name!r} names classes outside the vote's: {sorted(unknown)}")
        mass = sum(reading.values())
        if mass <= 0:
            continue
        for c, p in reading.items():
            totals[c] += weight * p / mass
        used[name] = weight
    if not used:
        raise ValueError("no reader voted: every reading is None or weighs 0")
    total = sum(used.values())
    probabilities = {c: v / total for c, v in totals.items()}
    # max() keeps the first of equal values: ties go to the earlier class.
    label = max(classes, key=lambda c: probabilities[c])
    return VoteResult(label, probabilities, {k: (dict(v) if v is not None else None) for k, v in readings.items()}, used)
