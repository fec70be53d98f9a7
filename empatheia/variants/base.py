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

from typing import TYPE_CHECKING, Callable, List, Optional, Sequence, Tuple

import torch

from ..dialogue import Dialogue
from ..responding import Responder
from ..response import EmpatheticResponse

if TYPE_CHECKING:
    from ..decoding import Decoding
    from ..modeling import Empatheia


class VariantSystem(Responder):
    """A system of the field built over an :class:`Empatheia`'s parts; it answers through
    :class:`~empatheia.responding.Responder`'s ``respond`` and ``respond_in_stages``."""

    name = "variant"
    passes_content = False

    def __init__(self, model: "Empatheia"):
        self.model = model

    # What the command line, the server and evaluation read of a model.
    @property
    def config(self):
        return self.model.config

    def generators(self):
        return self.model.generators()

    def speech_generator(self):
        return self.model.speech_generator()

    def talking_head(self):
        return self.model.talking_head()

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
    def _network(self) -> torch.nn.Module:
        return self.model

    def _answer(self, items, max_new_tokens, decoding, speech_lengths, speak, progress=None):
        if speech_lengths is not None:
            raise ValueError(f"{self.name} has no Content Synchronizer: the speech generator decides the lengths")
        return self.answer(items, max_new_tokens, decoding, progress)

    def answer(self, items: Sequence[Dialogue], max_new_tokens: Optional[int], decoding: "Decoding",
               progress: Optional[Callable[[int], None]] = None) -> List[EmpatheticResponse]:
        """The responses' text, emotions and styles (no media yet), written with
        ``decoding``; ``progress`` as for :meth:`respond`."""
        raise NotImplementedError


def no_content(config) -> Tuple[torch.Tensor, torch.Tensor]:
    """Empty C^s ``(0, D_cs)`` and C^v ``(0, D_cv)``: a variant passes no content feature."""
    cs = config.content_synchronizer
    return torch.zeros(0, cs.speech_content_dim), torch.zeros(0, cs.video_content_dim)
