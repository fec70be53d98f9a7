"""Label sets of the Style Disentangler's classifiers, and the emotion fold that maps
free-text emotions onto them.

AvaMERG uses 7 coarse emotions and three profile attributes of the responding avatar
(§3, Appendix C). A dataset with other label sets passes its own lists through
:class:`~empatheia.config.StyleDisentanglerConfig` (``emotion_labels``,
``profile_labels``); :class:`LabelSets` turns a dataset's labels into class indices and
names what does not fit.

AvaMERG annotates each dialogue with a free-text ``speaker_emotion`` drawn from the 32
EmpatheticDialogues labels and their variants. :data:`EMOTION_FOLD` is this project's
complete mapping onto the 7 classes. It follows the fold of the public AvaMERG code except
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

A dataset with classes of its own maps onto them with its own ``emotion_fold``, which
extends this one (:class:`LabelSets`): ``{fear: stressed}`` also takes in ``anxious``,
``afraid`` and every other label this fold sends to ``fear``.

This module imports nothing else of the package, so every layer can read it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Union

EMOTION_LABELS = ("sad", "happy", "angry", "fear", "surprised", "contempt", "disgusted")
AGE_LABELS = ("child", "young", "middle-aged", "elderly")
GENDER_LABELS = ("male", "female")
TIMBRE_LABELS = ("high", "mid", "low")

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
    _check_is_text(label)
    table = EMOTION_FOLD if fold is None else {normalize_label(k): v for k, v in fold.items()}
    key = normalize_label(label)
    if key not in table:
        known = (
            "the 32 EmpatheticDialogues labels, the class names and their variants; see "
            "empatheia.labels.EMOTION_FOLD, or pass your own label sets"
            if fold is None else f"the fold's keys {_shortened(table)}"
        )
        raise UnknownEmotionError(f"unknown emotion {label!r}: it is not in the emotion fold (known: {known})")
    return table[key]


def _check_is_text(label: object) -> None:
    if not isinstance(label, str):
        raise UnknownEmotionError(f"emotion label must be a string, got {type(label).__name__} {label!r}")


def _shortened(names, limit: int = 12) -> str:
    """``[a, b, ...]`` of at most ``limit`` names, then how many more there are."""
    names = list(dict.fromkeys(names))
    shown = ", ".join(repr(name) for name in names[:limit])
    return f"[{shown}, ... and {len(names) - limit} more]" if len(names) > limit else f"[{shown}]"


def _key(value: str) -> str:
    # "Middle aged", "middle_aged" and "middle-aged" are one label.
    return "".join(ch for ch in value.lower() if ch.isalnum())


@dataclass
class LabelSets:
    """The classes a model predicts, and how a dataset's free-text labels map onto them.

    A free-text emotion is looked up among the ``emotions`` themselves and in
    ``emotion_fold`` first. Any other label goes through the built-in :data:`EMOTION_FOLD`
    (EmpatheticDialogues' 32 labels and their variants onto AvaMERG's 7 classes), and the
    class it gives is then looked up the same way: with ``emotion_fold: {fear: stressed}``,
    ``anxious``, ``afraid`` and ``terrified`` are ``stressed`` too. So a dataset's fold
    extends the built-in one, and ``LabelSets()`` (the AvaMERG classes, no fold of its own)
    is the built-in fold itself. With ``emotion_fold_replace`` the dataset's fold is the
    only one. A label that reaches none of the ``emotions`` is unknown
    (:class:`UnknownEmotionError`, naming what these label sets know), never a default.
    """

    emotions: List[str] = field(default_factory=lambda: list(EMOTION_LABELS))
    profile: Dict[str, List[str]] = field(
        default_factory=lambda: {"age": list(AGE_LABELS), "gender": list(GENDER_LABELS), "timbre": list(TIMBRE_LABELS)}
    )
    emotion_fold: Optional[Dict[str, str]] = None
    emotion_fold_replace: bool = False
    """Use ``emotion_fold`` alone, without the built-in fold behind it."""

    def __post_init__(self):
        if not self.emotions:
            raise ValueError("label sets need at least one emotion")
        if not isinstance(self.emotion_fold_replace, bool):
            raise ValueError(f"emotion_fold_replace must be true or false, got {self.emotion_fold_replace!r}")
        own = {normalize_label(k): v for k, v in (self.emotion_fold or {}).items()}
        stray = sorted({v for v in own.values() if v not in self.emotions})
        if stray:
            raise ValueError(f"emotion_fold maps onto {stray}, which are not among the emotions {list(self.emotions)}")
        # The dataset's own names win over its fold's keys, which win over the built-in fold.
        self._fold = {**own, **{normalize_label(e): e for e in self.emotions}}
        self._emotion_index = {e: i for i, e in enumerate(self.emotions)}
        self._profile_index = {
            attr: {_key(v): i for i, v in enumerate(values)} for attr, values in self.profile.items()
        }

    @classmethod
    def from_yaml(cls, path: "Union[str, Path]") -> "LabelSets":
        """Label sets from a YAML file with ``emotions``, ``profile``, ``emotion_fold`` and
        ``emotion_fold_replace``; a problem is a ``ValueError`` naming the file."""
        import yaml

        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as error:
            raise ValueError(f"{path}: cannot read label sets: {error}") from None
        keys = ("emotions", "profile", "emotion_fold", "emotion_fold_replace")
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping with {', '.join(keys)}")
        unknown = sorted(set(data) - set(keys))
        if unknown:
            raise ValueError(f"{path}: unknown keys {unknown} (known: {', '.join(keys)})")
        try:
            return cls(**data)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{path}: {error}") from None

    @classmethod
    def from_config(
        cls, config: Any, emotion_fold: Optional[Mapping[str, str]] = None, emotion_fold_replace: bool = False
    ) -> "LabelSets":
        """The classes of a :class:`~empatheia.config.StyleDisentanglerConfig` (anything with
        ``emotion_labels`` and ``profile_labels``), read through ``emotion_fold``."""
        return cls(
            list(config.emotion_labels),
            {k: list(v) for k, v in config.profile_labels.items()},
            dict(emotion_fold) if emotion_fold else None,
            emotion_fold_replace,
        )

    def emotion_class(self, label: str) -> str:
        """The class of a free-text emotion; ``UnknownEmotionError`` names an unknown one
        and what these label sets know."""
        _check_is_text(label)
        key = normalize_label(label)
        if key in self._fold:
            return self._fold[key]
        if not self.emotion_fold_replace and key in EMOTION_FOLD:
            folded = normalize_label(EMOTION_FOLD[key])
            if folded in self._fold:
                return self._fold[folded]
        raise UnknownEmotionError(f"unknown emotion {label!r}: {self._known()}")

    def _known(self) -> str:
        """What an unknown emotion's error says these label sets read, and the fix."""
        names = {normalize_label(e) for e in self.emotions}
        own = [k for k in self._fold if k not in names]
        known = f"the emotions {_shortened(self.emotions)}" + (f" and the emotion_fold's keys {_shortened(own)}" if own else "")
        fix = "map it to one of the emotions in the labels file's emotion_fold"
        if self.emotion_fold_replace:
            return f"these label sets know {known} (emotion_fold_replace: only those); {fix}"
        taken = sorted({c for c in EMOTION_FOLD.values() if c in self._fold})
        through = (
            f", and the labels the built-in fold (empatheia.labels.EMOTION_FOLD) sends to {taken}" if taken
            else "; the built-in fold (empatheia.labels.EMOTION_FOLD) reaches none of them"
        )
        return f"these label sets know {known}{through}; {fix}"

    def emotion_index(self, label: str) -> int:
        return self._emotion_index[self.emotion_class(label)]

    def profile_value(self, attribute: str, value: str) -> str:
        """The canonical spelling of a profile value; ``ValueError`` names an unknown one."""
        index = self.profile_index(attribute, value)
        return self.profile[attribute][index]

    def profile_index(self, attribute: str, value: str) -> int:
        if attribute not in self._profile_index:
            raise ValueError(f"unknown profile attribute {attribute!r} (known: {sorted(self.profile)})")
        if not isinstance(value, str) or _key(value) not in self._profile_index[attribute]:
            raise ValueError(f"unknown {attribute} {value!r} (expected one of {self.profile[attribute]})")
        return self._profile_index[attribute][_key(value)]
