"""The paper's pipeline baseline (Empatheia, §6 and Appendix E.2).

The same language core, tuned on text to write an explicit meta-response (the speaker's
emotion, the listener's profile where the data has one, then the reply; stage
``pipeline_text`` of :mod:`empatheia.stages`), with no Chain of Empathy, no signal tokens
and no heads. The written emotion picks the voice's and the face's styles from a
:class:`~empatheia.variants.styles.StyleTable` measured on the generators; the written
profile, where the dialogue names none, picks the avatar; the speech generator reads the
text and the talking head animates that speech. Nothing the model computes reaches the
generators but the text: that is the baseline's point (no feature passing).

Its language model reads the turns' text only (the paper's baseline has no multimodal
understanding), so a dialogue's speech and video do not change its answer.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Union

import torch

from ..dialogue import Dialogue
from ..labels import EMOTION_LABELS, UnknownEmotionError, fold_emotion
from ..prompts import META_EMOTION, ChainOfEmpathy, PromptMode, parse_meta
from ..response import EmpatheticResponse, LabelPrediction
from .base import VariantSystem, no_content
from .styles import StyleTable

if TYPE_CHECKING:
    from ..modeling import GeneratedText

PIPELINE_WEIGHTS = "pipeline_core.safetensors"
"""The pipeline's trained language-model adapter, beside a preset's shipped weights."""
PIPELINE_STYLES = "pipeline_styles.json"
EMOTION_STEP_LIMIT = 12
"""The meta-response starts with ``Emotion:``: its emotion is written within this many
generated tokens, or the text does not follow the format."""
"""The pipeline's emotion -> style table, beside a preset's shipped weights."""


def fold_distribution(probabilities: Dict[str, float], fold=None) -> Dict[str, float]:
    """A distribution over fine labels summed into the emotion classes they fold to
    (labels of no class are left out; the rest renormalised)."""
    folded = {c: 0.0 for c in EMOTION_LABELS}
    for label, p in probabilities.items():
        try:
            target = fold_emotion(label, fold)
        except UnknownEmotionError:
            continue
        folded[target] = folded.get(target, 0.0) + p
    total = sum(folded.values())
    return {c: v / total for c, v in folded.items()} if total > 0 else folded


class PipelineSystem(VariantSystem):
    """The pipeline baseline over ``model``'s parts (its language model tuned with stage
    ``pipeline_text``), its generators driven by ``styles``."""

    name = "pipeline"

    def __init__(self, model, styles: StyleTable):
        super().__init__(model)
        sd = model.config.style_disentangler
        styles.check_widths(sd.speech_style_dim, sd.video_style_dim, f"preset {model.config.preset or '?'}'s generators")
        self.styles = styles

    title = "Pipeline baseline"
    """How the page and the records name the system that answered."""

    def answer(self, items: Sequence[Dialogue], max_new_tokens, decoding, progress=None) -> List[EmpatheticResponse]:
        written = self.write(items, max_new_tokens, decoding, progress)
        return self.package(items, written)

    def write(self, items: Sequence[Dialogue], max_new_tokens, decoding, progress=None) -> GeneratedText:
        """The meta-response of each dialogue, with the logits of its first
        :data:`EMOTION_STEP_LIMIT` steps (the written emotion's distribution). MERIA and
        early fusion write the same target from a language core that reads more."""
        if not self.model.training:
            self.model.merge_adapter()  # its one adapter: answer at the base model's speed
        return self.model.generate_text(items, PromptMode.PIPELINE, max_new_tokens, decoding, reserve_signals=False,
                                        score_steps=EMOTION_STEP_LIMIT, progress=progress)

    def package(self, items: Sequence[Dialogue], written: GeneratedText,
                chains: Optional[Sequence[Optional[ChainOfEmpathy]]] = None,
                preambles: Optional[Sequence[str]] = None) -> List[EmpatheticResponse]:
        """Responses from written meta-responses: the written emotion's class picks the
        table's styles. ``chains`` (MERIA's) stand in the response's chain, with the
        written emotion as its emotion step; ``preambles`` (what was written before the
        meta-response) lead each ``generated_text``."""
        steps = self._emotion_steps(written.sequences)
        speech_content, video_content = no_content(self.model.config)
        responses = []
        for row, (dialogue, text) in enumerate(zip(items, written.texts)):
            meta = parse_meta(text)
            fine = None
            if steps[row] is not None:
                (fine,) = self.model.label_predictions(written.scores[steps[row]][row : row + 1].float())
            named = meta.emotion
            if fine is not None and (named not in fine.probabilities
                                     or not all(math.isfinite(p) for p in fine.probabilities.values())):
                # A label outside the known ones (or sampling that filtered every label's
                # token): the distribution does not describe what it wrote.
                fine = None
            emotion = self._emotion_class(named, fine)
            speech_style, video_style = self.styles.styles(emotion.label)
            given = chains[row] if chains is not None else None
            if given is not None:
                chain = dataclasses.replace(given, speaker_emotion=named or given.speaker_emotion)
            else:
                # No Chain of Empathy: only the emotion it wrote stands in the chain's emotion step.
                chain = ChainOfEmpathy(speaker_emotion=named, raw=text, parsed=meta.parsed)
            preamble = preambles[row] if preambles is not None else ""
            responses.append(EmpatheticResponse(
                text=meta.response,
                chain=chain,
                emotion=emotion,
                chain_emotion=fine,
                profile={k: LabelPrediction(v, {v: 1.0}) for k, v in meta.profile.items()},
                speech_content=speech_content,
                speech_style=speech_style,
                video_content=video_content,
                video_style=video_style,
                dialogue_id=dialogue.id,
                generated_text=f"{preamble}\n\n{text}" if preamble else text,
                system=self.title,
                emotion_source="the emotion it wrote",
                has_chain=given is not None,
                dropped_turns=written.prompts[row].first_turn,
            ))
        return responses

    def _avatar_for(self, dialogue: Dialogue, response: EmpatheticResponse):
        """The dialogue's listener profile where it gives one, else what the model wrote."""
        written = {k: p.label for k, p in response.profile.items()}
        return self.avatars().for_profile({**written, **(dialogue.listener_profile or {})} or None)

    def _emotion_class(self, named: Optional[str], fine: Optional[LabelPrediction]) -> LabelPrediction:
        """The class of the written emotion (the table's row), with the fine distribution
        folded where there is one; an emotion of no known class falls back to the folded
        distribution's best class, or the table's first class."""
        folded = fold_distribution(fine.probabilities) if fine is not None else None
        label = None
        if named:
            try:
                label = fold_emotion(named)
            except UnknownEmotionError:
                label = None
        if label is None or label not in self.styles.speech:
            label = max(folded, key=folded.get) if folded else self.styles.classes[0]
        return LabelPrediction(label, folded if folded is not None else {label: 1.0})

    def _emotion_steps(self, sequences: torch.Tensor) -> List[Optional[int]]:
        """Per row, the generated step that wrote the emotion's first token (the step after
        ``Emotion:``), or ``None`` when the text does not start that way."""
        steps: List[Optional[int]] = []
        tokenizer = self.model.tokenizer
        for row in sequences.tolist():
            found = None
            for k in range(1, min(len(row), EMOTION_STEP_LIMIT)):
                if tokenizer.decode(row[:k], skip_special_tokens=True).strip() == f"{META_EMOTION}:":
                    found = k
                    break
            steps.append(found)
        return steps


def load_pipeline_core(model, path: Union[str, Path]) -> None:
    """Load a pipeline language-model adapter (what ``export_pipeline_core`` writes) into
    ``model``'s language model; a file of another shape is an error naming the keys."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    from ..language_model import adapter_state_dict

    state = load_file(str(path))
    expected = set(adapter_state_dict(model.language_model))
    if set(state) != expected:
        raise ValueError(
            f"{path} does not match this language model's adapter: missing {sorted(expected - set(state))[:5]}, "
            f"unexpected {sorted(set(state) - expected)[:5]}"
        )
    set_peft_model_state_dict(model.language_model, state)


def export_pipeline_core(model, path: Union[str, Path], dtype: torch.dtype = torch.float16) -> Path:
    """Write the language model's adapter (LoRA and token rows) of a model trained with
    stage ``pipeline_text``: all the pipeline trains."""
    from safetensors.torch import save_file

    from ..io import atomic_path
    from ..language_model import adapter_state_dict

    state = {k: v.detach().to(dtype).contiguous().cpu() for k, v in adapter_state_dict(model.language_model).items()}
    path = Path(path)
    with atomic_path(path) as temporary:
        save_file(state, str(temporary))
    return path
