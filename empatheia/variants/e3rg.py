"""E3RG (ACM MM'25 avatar challenge; ``shared/papers/004``): training-free, over parts we
already have.

* **Understanding**: the user's emotion by a vote (:func:`~empatheia.variants.vote.emotion_vote`)
  of several readers: the emotion the language core's Chain of Empathy weighs, a text
  classifier, the facial-expression network on the user's video and a prosody reader on
  the user's speech (:mod:`empatheia.variants.readers`).
* **Memory**: the avatar's identity (portrait, voice, profile) and the user's earlier
  turns, kept across turns and sessions (:class:`~empatheia.variants.memory.EmpathyMemory`);
  the turns most like the current one are put back into the prompt.
* **Generation**: the language core writes the reply (with its chain); the voted emotion
  picks reference styles for the voice and the face from an emotion bank measured on real
  clips (:func:`~empatheia.variants.styles.measure_clip_styles`); the speech generator reads
  the text in the avatar's own voice and the talking head animates that speech.

Where E3RG's public code goes wrong, this one does not: the seven classes are the fold of
:mod:`empatheia.labels` (one key each), the speech is driven by the emotion, the avatar
never speaks with the user's voice (its voice is its own, from the memory), and nothing is
a hard-coded path or device.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence

from ..dialogue import Dialogue
from ..labels import EMOTION_LABELS, UnknownEmotionError, fold_emotion
from ..response import EmpatheticResponse, LabelPrediction
from .base import VariantSystem, no_content
from .memory import EmpathyMemory
from .pipeline import fold_distribution
from .styles import StyleTable
from .vote import DEFAULT_WEIGHTS, emotion_vote

E3RG_STYLES = "e3rg_styles.json"
"""The emotion bank shipped beside a preset's weights."""


class E3RGSystem(VariantSystem):
    """E3RG over ``model`` (a trained Empatheia whose language core writes the text and
    the chain), with ``readers`` beside the chain, the emotion ``bank`` and ``memory``.

    Args:
        readers: objects with ``name`` and ``read(dialogue) -> {class: p} | None``.
        weights: the vote's weight per reader name (``chain`` included); default
            :data:`~empatheia.variants.vote.DEFAULT_WEIGHTS`.
        recall: how many earlier user turns the memory puts back into the prompt.
    """

    name = "e3rg"

    def __init__(self, model, bank: StyleTable, readers: Sequence = (), memory: Optional[EmpathyMemory] = None,
                 weights: Optional[Mapping[str, float]] = None, recall: int = 2):
        super().__init__(model)
        sd = model.config.style_disentangler
        bank.check_widths(sd.speech_style_dim, sd.video_style_dim, f"preset {model.config.preset or '?'}'s generators")
        missing = set(EMOTION_LABELS) - set(bank.speech)
        if missing:
            raise ValueError(f"the emotion bank lacks the classes {sorted(missing)}")
        self.bank = bank
        self.readers = list(readers)
        self.memory = memory if memory is not None else EmpathyMemory()
        self.weights = dict(DEFAULT_WEIGHTS if weights is None else weights)
        self.recall = recall
        self.last_votes: List[object] = []
        """The :class:`~empatheia.variants.vote.VoteResult` of each dialogue of the last call."""

    def avatars(self):
        """The memory's avatars: identities that last across sessions, each speaking in
        its own voice (a user's audio is never a voice here)."""
        return self.memory.avatars

    def answer(self, items: Sequence[Dialogue], max_new_tokens, decoding, progress=None) -> List[EmpatheticResponse]:
        prompts = [self.memory.with_recalled(d, self.recall) for d in items]
        # The language core's answer with its chain; its second pass gives the chain
        # emotion's probabilities (the chain's vote), and its heads' features go unused.
        answers = self.model.respond(prompts, max_new_tokens, progress=progress, **decoding.kwargs())
        speech_content, video_content = no_content(self.model.config)
        responses, votes = [], []
        for dialogue, answer in zip(items, answers):
            readings: Dict[str, Optional[Dict[str, float]]] = {"chain": self._chain_reading(answer)}
            for reader in self.readers:
                readings[reader.name] = reader.read(dialogue)
            try:
                vote = emotion_vote(readings, self.weights)
            except ValueError as error:
                raise ValueError(f"dialogue {dialogue.id}: {error} (readings: {sorted(readings)})") from None
            votes.append(vote)
            speech_style, video_style = self.bank.styles(vote.label)
            # The vote decides the class that styles the voice and the face; the fine
            # emotion stays the one the chain wrote.
            answer.emotion = LabelPrediction(vote.label, vote.probabilities)
            answer.system, answer.emotion_source = "E3RG", "the vote of its emotion readers"
            answer.speech_content, answer.video_content = speech_content, video_content
            answer.speech_style, answer.video_style = speech_style, video_style
            answer.profile = {}
            answer.dialogue_id = dialogue.id
            responses.append(answer)
            self.memory.remember(dialogue)
        self.last_votes = votes
        return responses

    @staticmethod
    def _chain_reading(answer: EmpatheticResponse) -> Optional[Dict[str, float]]:
        """The chain's emotion folded to the classes: its probabilities where the core
        gives them, else the label it wrote."""
        if answer.chain_emotion is not None:
            return fold_distribution(answer.chain_emotion.probabilities)
        named = answer.chain.speaker_emotion
        try:
            return {fold_emotion(named): 1.0} if named else None
        except UnknownEmotionError:
            return None
