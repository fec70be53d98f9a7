"""Folding free-text emotion labels onto the 7 AvaMERG classes.

AvaMERG annotates each dialogue with a free-text ``speaker_emotion`` drawn from the 32
EmpatheticDialogues labels and their variants; the Style Disentangler classifies 7 coarse
classes (``sad, happy, angry, fear, surprised, contempt, disgusted``). :data:`EMOTION_FOLD`
is this project's complete mapping. It follows the fold of the public AvaMERG code except
where that fold is wrong or incomplete:

* ``anxious`` goes to ``fear`` (the public fold says ``sad``): anxiety is anticipatory
  fear, and ED's ``apprehensive`` and ``afraid`` already go there;
* ``devastated`` goes to ``sad`` (the public fold says ``surprised``);
* ``sad`` itself and ``tired`` are mapped (the public fold has no ``sad`` entry and maps
  ``tired`` to itself, which is not a class).

``jealous`` stays with ``contempt`` as in the public fold: it is the only ED label the
benchmark's labels put in that class, and moving it would change the class distribution
the published numbers were measured on.

A label that is not in the fold is an error that names it; nothing falls back to a
default class. ``neutral`` has no class among the seven and is therefore unknown.
"""

from __future__ import annotations

import re
from typing import Dict, Mapping, Optional

# The 32 EmpatheticDialogues labels, each with its class.
ED_EMOTIONS: Dict[str, str] = {
    "afraid": "fear",
    "angry": "angry",
    "annoyed": "angry",
    "anticipating": "happy",
    "anxious": "fear",
    "apprehensive": "fear",
    "ashamed": "sad",
    "caring": "happy",
    "confident": "happy",
    "content": "happy",
    "devastated": "sad",
    "disappointed": "sad",
    "disgusted": "disgusted",
    "embarrassed": "sad",
    "excited": "happy",
    "faithful": "happy",
    "furious": "angry",
    "grateful": "happy",
    "guilty": "sad",
    "hopeful": "happy",
    "impressed": "surprised",
    "jealous": "contempt",
    "joyful": "happy",
    "lonely": "sad",
    "nostalgic": "sad",
    "prepared": "happy",
    "proud": "happy",
    "sad": "sad",
    "sentimental": "sad",
    "surprised": "surprised",
    "terrified": "fear",
    "trusting": "happy",
}

# Other spellings met in AvaMERG's free text and in other corpora (MEAD, FER, RAVDESS),
# grouped by class: the class names themselves, nouns, and near-synonyms.
_VARIANTS: Dict[str, tuple] = {
    "sad": (
        "sadness", "unhappy", "sorrow", "sorrowful", "depressed", "depression", "devastation",
        "disappointment", "loneliness", "nostalgia", "guilt", "shame", "embarrassment", "hurt",
        "heartbroken", "grief", "grieving", "upset", "regret", "regretful", "melancholy",
        "miserable", "gloomy", "tired", "exhausted", "hopeless", "despair", "helpless",
    ),
    "happy": (
        "happiness", "joy", "joyous", "excitement", "contentment", "gratitude", "thankful",
        "pride", "hope", "confidence", "care", "faith", "trust", "anticipation", "glad",
        "pleased", "delighted", "cheerful", "relieved", "relief", "love", "loving", "satisfied",
        "optimistic", "amused", "enthusiastic", "eager", "calm", "peaceful",
    ),
    "angry": (
        "anger", "fury", "annoyance", "irritated", "irritation", "frustrated", "frustration",
        "mad", "rage", "outraged", "resentful", "resentment", "bitter", "hostile",
    ),
    "fear": (
        "fearful", "scared", "frightened", "terror", "anxiety", "apprehension", "worried",
        "worry", "nervous", "panic", "panicked", "stressed", "stress", "overwhelmed",
        "insecure", "uneasy", "concerned",
    ),
    "surprised": ("surprise", "amazed", "amazement", "astonished", "shocked", "shock", "startled", "stunned", "awe"),
    "contempt": ("contemptuous", "disdain", "scorn", "jealousy", "envious", "envy"),
    "disgusted": ("disgust", "revolted", "repulsed", "grossed out", "disgusting"),
}

EMOTION_FOLD: Dict[str, str] = {
    **{cls: cls for cls in _VARIANTS},
    **ED_EMOTIONS,
    **{variant: cls for cls, variants in _VARIANTS.items() for variant in variants},
}
"""Every known free-text emotion (normalised, see :func:`normalize_label`) -> its class."""


def normalize_label(label: str) -> str:
    """Lower case, ``_``/``-``/runs of spaces as one space, no surrounding punctuation:
    ``"Grossed_Out."`` -> ``"grossed out"``."""
    return re.sub(r"[\s_\-]+", " ", label.strip().lower()).strip(" .,;:!?\"'")


class UnknownEmotionError(ValueError):
    """A free-text emotion that the fold does not know."""


def fold_emotion(label: str, fold: Optional[Mapping[str, str]] = None) -> str:
    """The coarse class of a free-text emotion label.

    ``fold`` replaces :data:`EMOTION_FOLD` (keys normalised the same way). Raises
    :class:`UnknownEmotionError` naming the label when it is not in the fold.
    """
    if not isinstance(label, str):
        raise UnknownEmotionError(f"emotion label must be a string, got {type(label).__name__} {label!r}")
    table = EMOTION_FOLD if fold is None else {normalize_label(k): v for k, v in fold.items()}
    key = normalize_label(label)
    if key not in table:
        raise UnknownEmotionError(
            f"unknown emotion {label!r}: it is not in the emotion fold (known: the 32 "
            "EmpatheticDialogues labels, the class names and their variants; see "
            "empatheia.data.emotions.EMOTION_FOLD, or pass your own label sets)"
        )
    return table[key]
