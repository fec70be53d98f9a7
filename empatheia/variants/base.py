"""What the variants share: answering like :class:`~empatheia.modeling.Empatheia` does,
with generators driven by the text alone.

A variant wraps a built :class:`Empatheia` for its parts (tokenizer, language model,
encoders, generators, avatars) and answers with the same
:class:`~empatheia.response.EmpatheticResponse` records through the same ``respond`` and
``respond_in_stages``, so the command line, the server and evaluation take it in the
model's place. Unlike Empatheia, no model feature reaches its generators: the speech
generator reads the text (C^s is ``None``) in a style taken from a table, and the talking
head derives its content from that speech (C^v is ``None``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from ..dialogue import Dialogue
from ..response import EmpatheticResponse

if TYPE_CHECKING:
    from ..modeling import Empatheia


class VariantSystem:
    """A system of the field built over an :class:`Empatheia`'s parts."""

    name = "variant"

    def __init__(self, model: "Empatheia"):
        self.model = model

    # What the command line, the server and evaluation read of a model.
    @property
    def config(self):
        return self.model.config

    def generators(self):
        return self.model.generators()

    def set_generators(self, speech=None, talking_head=None) -> "VariantSystem":
        self.model.set_generators(speech, talking_head)
        return self

    def avatars(self):
        return self.model.avatars()

    def label_sets(self):
        return self.model.label_sets()

    def to(self, *args, **kwargs) -> "VariantSystem":
        self.model.to(*args, **kwargs)
        return self

    # ---------------------------------------------------------------- answering
    def answer(self, items: Sequence[Dialogue], max_new_tokens: Optional[int], do_sample: bool, temperature: float,
               top_p: float) -> List[EmpatheticResponse]:
        """The responses' text, emotions and styles (no media yet)."""
        raise NotImplementedError

    def avatar_for(self, dialogue: Dialogue, response: EmpatheticResponse):
        """Who speaks the answer: the listener's avatar of the dialogue."""
        return self.avatars().for_profile(dialogue.listener_profile)

    @torch.no_grad()
    def respond(
        self,
        dialogues: Union[Dialogue, Sequence[Dialogue]],
        max_new_tokens: Optional[int] = None,
        do_sample: bool = False,
        temperature: float = 0.7,
        top_p: float = 0.9,
        speech_lengths: Optional[Sequence[int]] = None,
        speak: bool = False,
        animate: bool = False,
    ) -> Union[EmpatheticResponse, List[EmpatheticResponse]]:
        """Answer one dialogue or a batch, as :meth:`Empatheia.respond` does.
        ``speech_lengths`` is accepted for the same signature and must be ``None``: the
        speech generator alone decides the speech's length here."""
        if speech_lengths is not None:
            raise ValueError(f"{self.name} has no Content Synchronizer: the speech generator decides the lengths")
        single = isinstance(dialogues, Dialogue)
        items = [dialogues] if single else list(dialogues)
        if not items:
            return []
        was_training = self.model.training
        self.model.eval()
        try:
            responses = self.answer(items, max_new_tokens, do_sample, temperature, top_p)
        finally:
            self.model.train(was_training)
        if speak or animate:
            for dialogue, response in zip(items, responses):
                avatar = self.avatar_for(dialogue, response)
                self.speak(response, avatar)
                if animate:
                    self.animate(response, avatar)
        return responses[0] if single else responses

    def respond_in_stages(
        self, dialogue: Dialogue, max_new_tokens: Optional[int] = None, speak: bool = False, animate: bool = False,
        avatar=None,
    ) -> Iterator[Tuple[str, EmpatheticResponse]]:
        """As :meth:`Empatheia.respond_in_stages`: the text first, then the speech, then
        the video, in the same response object."""
        speak = speak or animate
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                (response,) = self.answer([dialogue], max_new_tokens, False, 1.0, 1.0)
        finally:
            self.model.train(was_training)
        yield "text", response
        if not speak:
            return
        avatar = avatar if avatar is not None else self.avatar_for(dialogue, response)
        with torch.no_grad():
            self.speak(response, avatar)
        yield "speech", response
        if animate:
            with torch.no_grad():
                self.animate(response, avatar)
            yield "video", response

    def speak(self, response: EmpatheticResponse, avatar) -> None:
        """The text alone, in the response's table style, in the avatar's own voice."""
        speech = self.generators()[0]
        response.avatar = avatar.key
        response.avatar_profile = dict(avatar.profile or {})
        response.voice_style = speech.describe_style(response.speech_style)
        response.audio = speech.synthesize(response.text, None, response.speech_style, avatar)

    def animate(self, response: EmpatheticResponse, avatar) -> None:
        """The talking head from the speech itself (no C^v), in the table's face style."""
        talking_head = self.generators()[1]
        response.face_style = talking_head.describe_style(response.video_style)
        response.video = talking_head.animate(response.audio, None, response.video_style, avatar.portrait)


def no_content(config) -> Tuple[torch.Tensor, torch.Tensor]:
    """Empty C^s ``(0, D_cs)`` and C^v ``(0, D_cv)``: a variant passes no content feature."""
    cs = config.content_synchronizer
    return torch.zeros(0, cs.speech_content_dim), torch.zeros(0, cs.video_content_dim)
