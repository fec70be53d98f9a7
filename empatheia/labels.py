"""Label sets of the Style Disentangler's classifiers.

AvaMERG uses 7 coarse emotions and three profile attributes of the responding avatar
(§3, Appendix C). A dataset with other label sets passes its own lists through
:class:`~empatheia.config.StyleDisentanglerConfig` (``emotion_labels``,
``profile_labels``); :class:`LabelSets` turns a dataset's labels into class indices and
names what does not fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Union

if TYPE_CHECKING:
    from .config import StyleDisentanglerConfig

EMOTION_LABELS = ("sad", "happy", "angry", "fear", "surprised", "contempt", "disgusted")
AGE_LABELS = ("child", "young", "middle-aged", "elderly")
GENDER_LABELS = ("male", "female")
TIMBRE_LABELS = ("high", "mid", "low")


def _key(value: str) -> str:
    # "Middle aged", "middle_aged" and "middle-aged" are one label.
    return "".join(ch for ch in value.lower() if ch.isalnum())


@dataclass
class LabelSets:
    """The classes a model predicts, and how a dataset's free-text labels map onto them.

    ``emotion_fold`` maps free-text emotions to classes; ``None`` means: the AvaMERG
    :data:`~empatheia.data.emotions.EMOTION_FOLD` when ``emotions`` are the AvaMERG
    classes, otherwise the class names only.
    """

    emotions: List[str] = field(default_factory=lambda: list(EMOTION_LABELS))
    profile: Dict[str, List[str]] = field(
        default_factory=lambda: {"age": list(AGE_LABELS), "gender": list(GENDER_LABELS), "timbre": list(TIMBRE_LABELS)}
    )
    emotion_fold: Optional[Dict[str, str]] = None

    def __post_init__(self):
        from .data.emotions import EMOTION_FOLD, normalize_label

        if not self.emotions:
            raise ValueError("label sets need at least one emotion")
        fold = self.emotion_fold
        if fold is None:
            fold = dict(EMOTION_FOLD) if list(self.emotions) == list(EMOTION_LABELS) else {}
        fold = {**{normalize_label(k): v for k, v in fold.items()}, **{normalize_label(e): e for e in self.emotions}}
        stray = sorted({v for v in fold.values() if v not in self.emotions})
        if stray:
            raise ValueError(f"emotion_fold maps onto {stray}, which are not among the emotions {list(self.emotions)}")
        self._fold = fold
        self._emotion_index = {e: i for i, e in enumerate(self.emotions)}
        self._profile_index = {
            attr: {_key(v): i for i, v in enumerate(values)} for attr, values in self.profile.items()
        }

    @classmethod
    def from_yaml(cls, path: "Union[str, Path]") -> "LabelSets":
        """Label sets from a YAML file with ``emotions``, ``profile`` and ``emotion_fold``;
        a problem is a ``ValueError`` naming the file."""
        import yaml

        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as error:
            raise ValueError(f"{path}: cannot read label sets: {error}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping with emotions, profile and emotion_fold")
        unknown = sorted(set(data) - {"emotions", "profile", "emotion_fold"})
        if unknown:
            raise ValueError(f"{path}: unknown keys {unknown} (known: emotions, profile, emotion_fold)")
        try:
            return cls(**data)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{path}: {error}") from None

    @classmethod
    def from_config(cls, config: "StyleDisentanglerConfig", emotion_fold: Optional[Mapping[str, str]] = None) -> "LabelSets":
        return cls(list(config.emotion_labels), {k: list(v) for k, v in config.profile_labels.items()}, dict(emotion_fold) if emotion_fold else None)

    def emotion_class(self, label: str) -> str:
        """The class of a free-text emotion; ``UnknownEmotionError`` names an unknown one."""
        from .data.emotions import fold_emotion

        return fold_emotion(label, self._fold)

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
