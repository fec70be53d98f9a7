"""Training examples of each stage and the collator that batches them.

:class:`StageDataset` pairs each dialogue with what its stage (:mod:`empatheia.stages`)
trains on, in the stage's prompt layout (Appendix D.1):

====== ============================ ===================================================
stage  prompt                       target and gold data
====== ============================ ===================================================
1      turn texts                   Chain of Empathy + response (NLL)
2      turn texts                   same text; gold speech and video content features
3      ``<Aud> <Vid>`` per turn     the 32 signal tokens; gold speech and video style
                                    features, emotion and profile labels
4      texts with placeholders      chain + response + signal tokens; all of the above
====== ============================ ===================================================

Gold features come from a :class:`~empatheia.data.gold_features.GoldFeatureStore`, keyed
by the dialogue's ``id``; the emotion label is the dialogue's free-text emotion folded by
the :class:`~empatheia.labels.LabelSets`; profile labels are the listener's (the avatar
that responds). A label the data does not have is ``-100`` (ignored by the loss).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Union

import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset

from ..dialogue import Dialogue
from ..labels import LabelSets, UnknownEmotionError
from ..processing import IGNORE_INDEX, EmpatheiaProcessor, EncodedExample, Target
from ..prompts import PromptMode
from ..stages import CONTENT_FEATURES, STYLE_FEATURES, Stage, get_stage
from ..errors import DataError, SkippedSample, skipped_or_raised
from .readers import LabelsLike, as_label_sets

if TYPE_CHECKING:
    from .cache import MediaFeatureCache
    from .gold_features import FeatureSource, GoldFeatureStore


@dataclass
class StageExample:
    """One dialogue encoded for a stage, with its gold targets."""

    encoded: EncodedExample
    features: Dict[str, torch.Tensor] = field(default_factory=dict)
    """Gold generator features: ``speech_content`` ``(Ls, D)``, ``video_content``
    ``(Ls, D)`` (per speech unit), ``speech_units`` ``(Ls,)`` int64 (when the Content
    Synchronizer reads unit ids), ``speech_style`` ``(D,)``, ``video_style`` ``(D,)`` as
    the stage needs."""
    labels: Dict[str, int] = field(default_factory=dict)
    """``emotion`` and each profile attribute -> class index (``-100``: unknown)."""
    stage: Optional[Stage] = None
    """The stage it was encoded for; with ``features`` empty in a stage that reads gold
    features, a text dialogue (``StageDataset``'s ``text_dialogues``) without them."""
    id: Optional[str] = None
    """The dialogue's id, carried into the batch's ``ids`` so errors can name examples."""
    listener_echo: Optional[EncodedExample] = None
    """Stage 1 with ``loss.listener_echo_weight``: the listener's last turn written as the
    reply (:meth:`~empatheia.processing.EmpatheiaProcessor.listener_echo_example`), whose
    unlikelihood the loss adds; ``None`` without a listener turn."""


def stable_fraction(key: str) -> float:
    """A number in [0, 1) fixed by ``key`` (from its SHA-256): the same in every run,
    epoch and process, unlike a random draw, and spread uniformly over keys."""
    digest = hashlib.sha256(key.encode()).digest()[:8]
    return int.from_bytes(digest, "little") / float(1 << 64)


def _without_media(dialogue: Dialogue) -> Dialogue:
    """The dialogue as a user who only types gives it: its turns without speech or video."""
    return dataclasses.replace(dialogue, turns=[dataclasses.replace(t, audio=None, video=None) for t in dialogue.turns])


def text_only(example_id: Optional[str], share: float) -> bool:
    """Whether the example ``example_id`` falls in the ``share`` shown as text alone
    (a hash of the id, so the choice is the same in every epoch and process)."""
    return stable_fraction(f"text-only:{example_id}") < share


class StageDataset(Dataset):
    """The examples of one training stage.

    Args:
        dialogues: training dialogues (e.g. a :class:`~empatheia.data.readers.DialogueCorpus`).
        processor: the model's :class:`~empatheia.processing.EmpatheiaProcessor`.
        stage: 1-4 (or the :class:`~empatheia.stages.Stage`).
        gold_features: the store of gold generator features (stages 2-4).
        labels: label sets, or the path of a labels YAML file (default: the model
            config's).
        media_cache: encoder outputs cached on disk; cached files are not read again.
        on_error: ``"raise"`` on a bad example, or ``"skip"`` it: it comes back as a
            :class:`~empatheia.errors.SkippedSample` that :class:`StageCollator`
            reports in the batch's ``skipped`` list.
        text_only_share: stage 4 only: this share of the examples (by a hash of their
            id) is shown without the turns' speech and video.
        text_dialogues: stage 4 only: more dialogues, read as text alone, that have no
            media and no gold generator features (e.g. the stage-1 file). They follow
            ``dialogues`` in the index and train L_emp and the Style Disentangler's
            classifiers; L_ccl and L_sal leave them out (their rows are masked).
    """

    def __init__(
        self,
        dialogues: Sequence[Dialogue],
        processor: EmpatheiaProcessor,
        stage: Union[int, Stage],
        gold_features: Optional["GoldFeatureStore"] = None,
        labels: Optional[LabelsLike] = None,
        media_cache: Optional["MediaFeatureCache"] = None,
        on_error: str = "raise",
        text_only_share: float = 0.0,
        text_dialogues: Sequence[Dialogue] = (),
    ):
        stage = get_stage(stage)
        if text_dialogues and not stage.mixes_text_and_media:
            raise ValueError(f"text_dialogues join stage 4 (the stage that reads text and media), not stage {stage.number}")
        if not 0.0 <= text_only_share <= 1.0:
            raise ValueError(f"text_only_share must be in [0, 1], got {text_only_share}")
        if text_only_share and not stage.mixes_text_and_media:
            raise ValueError(f"text_only_share applies to stage 4 (text beside media), not stage {stage.number}")
        self.text_only_share = text_only_share
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if stage.gold_features and gold_features is None:
            raise ValueError(f"stage {stage.number} trains on gold features {list(stage.gold_features)}: pass gold_features")
        self.dialogues = dialogues
        self.text_dialogues = text_dialogues
        self.processor = processor
        self.stage = stage
        self.gold_features = gold_features
        self.labels = as_label_sets(labels) or LabelSets.from_config(processor.config.style_disentangler)
        self.media_cache = media_cache
        self.on_error = on_error

    @property
    def mode(self) -> PromptMode:
        """The stage's prompt layout."""
        return self.stage.layout

    def collator(self) -> "StageCollator":
        """What batches its examples (the training loop asks each dataset)."""
        return StageCollator(self.processor)

    def __len__(self) -> int:
        return len(self.dialogues) + len(self.text_dialogues)

    def __getitem__(self, index: int) -> Union[StageExample, SkippedSample]:
        with_media = index < len(self.dialogues)
        dialogue = self.dialogues[index] if with_media else self.text_dialogues[index - len(self.dialogues)]
        try:
            return self.example(dialogue) if with_media else self.text_example(dialogue)
        except DataError as error:
            return skipped_or_raised(error, dialogue.id, self.on_error)

    def example(self, dialogue: Dialogue) -> StageExample:
        if self.stage.reads_media and not any(t.audio is not None or t.video is not None for t in dialogue.turns):
            raise DataError(f"stage {self.stage.number} reads the turns' speech and video, and this dialogue has none",
                            field="turns")
        if not dialogue.response and self.stage.reads_response:
            raise DataError("has no gold response to train on", field="response")
        if self.text_only_share and text_only(dialogue.id, self.text_only_share):
            dialogue = _without_media(dialogue)
        encoded = self.processor.encode(dialogue, self.mode, Target.for_mode(dialogue, self.mode), media_cache=self.media_cache)
        return StageExample(encoded, self._features(dialogue), self._labels(dialogue), self.stage, dialogue.id,
                            self._listener_echo(dialogue, encoded))

    def text_example(self, dialogue: Dialogue) -> StageExample:
        """A text dialogue: its turns without media, no gold features."""
        if not dialogue.response:
            raise DataError("has no gold response to train on", field="response")
        dialogue = _without_media(dialogue)
        encoded = self.processor.encode(dialogue, self.mode, Target.for_mode(dialogue, self.mode))
        return StageExample(encoded, {}, self._labels(dialogue), self.stage, dialogue.id,
                            self._listener_echo(dialogue, encoded))

    def _listener_echo(self, dialogue: Dialogue, encoded: EncodedExample) -> Optional[EncodedExample]:
        if not trains_listener_echo(self.processor.config, self.stage):
            return None
        return self.processor.listener_echo_example(dialogue, encoded, self.mode)

    def _features(self, dialogue: Dialogue) -> Dict[str, torch.Tensor]:
        names = self.stage.gold_features
        if not names:
            return {}
        cs = self.processor.config.content_synchronizer
        if "speech_content" in names and cs.unit_vocab_size > 0:
            names = names + ("speech_units",)
        stored = self.gold_features.get(dialogue.id) if dialogue.id in self.gold_features else None
        if stored is None:
            raise DataError(
                f"no gold features in {self.gold_features} (extract them with `empatheia data extract-features`)",
                field="gold features",
            )
        missing = [n for n in names if n not in stored]
        if missing:
            raise DataError(f"the gold feature store has no {missing} for it", field="gold features")
        limits = {"speech_content": cs.max_speech_length, "video_content": cs.max_speech_length}
        for name, limit in limits.items():
            if name in names and stored[name].shape[0] > limit:
                raise DataError(
                    f"{name} has {stored[name].shape[0]} steps, over content_synchronizer's limit of {limit}; "
                    "targets are never cut",
                    field=f"gold features.{name}",
                )
        features = {n: stored[n] for n in names}
        if "video_content" in features and features["video_content"].shape[0] != features["speech_content"].shape[0]:
            raise DataError(
                f"video_content has {features['video_content'].shape[0]} rows but speech_content "
                f"{features['speech_content'].shape[0]}: C^v is one row per speech unit (a store of per-frame "
                "features? re-extract them)",
                field="gold features.video_content",
            )
        if "speech_units" in features:
            features["speech_units"] = features["speech_units"].reshape(-1).long()
            if features["speech_units"].shape[0] != features["speech_content"].shape[0]:
                raise DataError("speech_units and speech_content differ in length", field="gold features.speech_units")
        return features

    def _labels(self, dialogue: Dialogue) -> Dict[str, int]:
        if not self.stage.class_labels:
            return {}
        return class_labels(self.labels, dialogue.emotion, dialogue.listener_profile, "listener_profile")


def trains_listener_echo(config, stage: Optional[Stage]) -> bool:
    """Whether ``stage``'s examples carry the listener's echo: its loss has the
    ``listener_echo`` term and ``config.loss.listener_echo_weight`` is above 0."""
    return stage is not None and config.loss.listener_echo_weight > 0 and stage.has_term("listener_echo")


def class_labels(labels: LabelSets, emotion: Optional[str], profile: Optional[Dict[str, str]],
                 profile_field: str) -> Dict[str, int]:
    """``emotion`` and each of ``labels``' profile attributes -> class index (``-100``
    where the data has none); a label outside the sets is a :class:`DataError` naming
    ``emotion`` or ``<profile_field>.<attribute>``."""
    out = {"emotion": IGNORE_INDEX}
    if emotion is not None:
        try:
            out["emotion"] = labels.emotion_index(emotion)
        except UnknownEmotionError as error:
            raise DataError(str(error), field="emotion") from None
    profile = profile or {}
    for attribute in labels.profile:
        value = profile.get(attribute)
        out[attribute] = IGNORE_INDEX
        if value is not None:
            try:
                out[attribute] = labels.profile_index(attribute, value)
            except ValueError as error:
                raise DataError(str(error), field=f"{profile_field}.{attribute}") from None
    return out


class StageCollator:
    """Batches :class:`StageExample` items into what :meth:`Empatheia.forward` reads.

    Skipped samples are left out and listed in the batch's ``skipped``; a batch of only
    skipped samples is ``{"skipped": [...]}``. Examples that carry the listener's echo
    (stage 1 with ``loss.listener_echo_weight``) add ``echo_input_ids``,
    ``echo_attention_mask`` and ``echo_labels`` ``(B_e, L_e)``, one row per such example
    (none when no example has a listener turn). ``ids`` lists the examples' dialogue ids.
    Gold content features are zero-padded to the longest in the batch with a mask; style
    features and labels are stacked. A text dialogue without gold features (stage 4's
    ``text_dialogues``) gets one zero content row with a False mask and a zero style row,
    and ``style_target_mask`` ``(B,)`` marks which items have style targets.
    """

    def __init__(self, processor: EmpatheiaProcessor):
        self.processor = processor

    def _widths(self) -> Dict[str, int]:
        config = self.processor.config
        cs, sd = config.content_synchronizer, config.style_disentangler
        return {
            "speech_content": cs.speech_content_dim,
            "video_content": cs.video_content_dim,
            "speech_style": sd.speech_style_dim,
            "video_style": sd.video_style_dim,
        }

    def __call__(self, items: Sequence[Union[StageExample, SkippedSample]]) -> Dict[str, object]:
        skipped = [item for item in items if isinstance(item, SkippedSample)]
        examples = [item for item in items if not isinstance(item, SkippedSample)]
        if not examples:
            return {"skipped": skipped}
        batch: Dict[str, object] = self.processor.collate([e.encoded for e in examples])
        batch["ids"] = [e.id for e in examples]
        names = list(dict.fromkeys(name for e in examples for name in e.features))
        if any(not e.features and e.stage is not None and e.stage.gold_features for e in examples):
            stage_names = next(e.stage for e in examples if e.stage is not None).gold_features
            names = list(dict.fromkeys(list(stage_names) + names))
        if "speech_content" in names and "speech_units" not in names and self.processor.config.content_synchronizer.unit_vocab_size > 0:
            names.append("speech_units")
        widths = self._widths()
        has_gold = [bool(e.features) for e in examples]
        for name in names:
            if name == "speech_units":
                values = [e.features.get(name, torch.zeros(1, dtype=torch.long)) for e in examples]
                batch["speech_units"] = pad_sequence(values, batch_first=True)
            elif name in CONTENT_FEATURES:
                values = [e.features.get(name, torch.zeros(1, widths[name])) for e in examples]
                batch[f"{name}_target"] = pad_sequence(values, batch_first=True)
                lengths = torch.tensor([v.shape[0] if gold else 0 for v, gold in zip(values, has_gold)])
                batch[f"{name}_mask"] = torch.arange(batch[f"{name}_target"].shape[1])[None, :] < lengths[:, None]
            else:
                batch[f"{name}_target"] = torch.stack([e.features.get(name, torch.zeros(widths[name])) for e in examples])
        if not all(has_gold) and any(name in STYLE_FEATURES for name in names):
            batch["style_target_mask"] = torch.tensor(has_gold)
        for name in examples[0].labels:
            batch[f"{name}_label"] = torch.tensor([e.labels[name] for e in examples])
        if trains_listener_echo(self.processor.config, examples[0].stage):
            batch.update(self._listener_echoes([e.listener_echo for e in examples if e.listener_echo is not None]))
        if skipped:
            batch["skipped"] = skipped
        return batch


    def _listener_echoes(self, echoes: Sequence[EncodedExample]) -> Dict[str, torch.Tensor]:
        """``echo_input_ids``, ``echo_attention_mask``, ``echo_labels`` ``(B_e, L_e)``; with
        no example to echo, ``(0, 1)`` each, so the loss sees the term is on and has no row."""
        if not echoes:
            return {"echo_input_ids": torch.zeros(0, 1, dtype=torch.long),
                    "echo_attention_mask": torch.zeros(0, 1, dtype=torch.long),
                    "echo_labels": torch.full((0, 1), IGNORE_INDEX, dtype=torch.long)}
        echo = self.processor.collate(echoes)
        return {f"echo_{key}": echo[key] for key in ("input_ids", "attention_mask", "labels")}


def gold_feature_sources(dialogues: Sequence[Dialogue]) -> List["FeatureSource"]:
    """What the gold feature extractors read for each training dialogue: the response's
    text, speech and video, keyed by the dialogue's ``id``."""
    from .gold_features import FeatureSource

    return [
        FeatureSource(key=d.id, text=d.response, audio=d.response_audio, video=d.response_video)
        for d in dialogues
        if d.response is not None
    ]
