"""Answering a dialogue, the same way for every system: ``respond`` and
``respond_in_stages``.

:class:`~empatheia.modeling.Empatheia` and the variants of the field
(:mod:`empatheia.variants`) differ in how they make an answer's text, emotions and
features (``_answer``), whose avatar speaks it (``_avatar_for``) and whether the content
features reach the generators (``passes_content``); how an answer is then spoken,
animated, batched and handed over part by part is written once, here.
"""

from __future__ import annotations

from typing import Callable, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from .decoding import Decoding
from .dialogue import Dialogue
from .response import EmpatheticResponse


class Responder:
    """``respond`` and ``respond_in_stages`` over what a system defines: ``_answer``,
    ``_network`` (the module put in eval mode while answering), ``label_sets``,
    ``speech_generator``, ``talking_head`` and ``avatars``."""

    passes_content = True
    """Whether the answer's content features (C^s, C^v) drive the generators; without
    them the speech generator reads the text alone and the talking head follows that
    speech."""

    def _answer(self, items: Sequence[Dialogue], max_new_tokens: Optional[int], decoding: Decoding,
                speech_lengths: Optional[Sequence[int]], speak: bool,
                progress: Optional[Callable[[int], None]] = None) -> List[EmpatheticResponse]:
        """Each dialogue's text, chain, emotions and generator features, without speech
        or video, written with ``decoding`` (``speak`` says whether they will be spoken;
        ``progress`` is called with the number of tokens written so far)."""
        raise NotImplementedError

    def _network(self) -> torch.nn.Module:
        raise NotImplementedError

    def label_sets(self):
        """The :class:`~empatheia.labels.LabelSets` of the system's emotion and profile classes."""
        raise NotImplementedError

    def _give_label_sets(self, responses: Sequence[EmpatheticResponse]) -> None:
        # A response reads its chain's emotion with the fold of the classes it was given in.
        labels = self.label_sets()
        for response in responses:
            response.label_sets = labels

    def _avatar_for(self, dialogue: Dialogue, response: EmpatheticResponse):
        """Who speaks the answer: the listener's avatar of the dialogue."""
        return self.avatars().for_profile(dialogue.listener_profile)

    @torch.no_grad()
    def respond(
        self,
        dialogues: Union[Dialogue, Sequence[Dialogue]],
        max_new_tokens: Optional[int] = None,
        do_sample: Optional[bool] = None,
        temperature: Optional[float] = None,
        top_p: Optional[float] = None,
        speech_lengths: Optional[Sequence[int]] = None,
        speak: bool = False,
        animate: bool = False,
        progress: Optional[Callable[[int], None]] = None,
        seed: Optional[int] = None,
        no_repeat_ngram_size: Optional[int] = None,
        repetition_penalty: Optional[float] = None,
        block_repeated_sentences: Optional[bool] = None,
        sample_chain: Optional[bool] = None,
        generic_reply_penalty: Optional[float] = None,
    ) -> Union[EmpatheticResponse, List[EmpatheticResponse]]:
        """Answer one dialogue or a batch of them: the text, the Chain of Empathy, the
        emotions and the generator features of each (how, the system's class says).

        ``do_sample`` draws each token at ``temperature`` from the top-``top_p`` mass,
        reproducibly for a given ``seed`` (a dialogue gets the same answer in any batch;
        the global RNG is neither read nor moved); with ``sample_chain`` False
        only the reply's tokens are drawn and the chain is written greedily.
        ``no_repeat_ngram_size`` keeps the reply and each step of the chain from repeating
        a run of tokens, ``repetition_penalty`` the reply from reusing its tokens, and
        ``block_repeated_sentences`` the reply and each step of the chain from saying a
        sentence twice; ``generic_reply_penalty`` turns the reply's opening away from what
        the model would say to anyone. Each ``None`` is the config's
        ``language_model`` value (greedy unless the config samples).
        See :class:`~empatheia.decoding.Decoding`.

        ``speech_lengths`` gives the content lengths per dialogue (rows of C^s and C^v;
        by default the speech generator decides them). With ``speak`` the speech
        generator turns the answer into ``response.audio``; with ``animate`` the
        talking head also turns that speech into ``response.video`` (animating needs the
        speech, so it speaks too). The listener's avatar (``avatars()``) gives the voice
        and the portrait. ``progress``, when given, is called with the number of tokens
        written so far while the text is being written.
        """
        single = isinstance(dialogues, Dialogue)
        items = [dialogues] if single else list(dialogues)
        if not items:
            return []
        decoding = Decoding(do_sample, temperature, top_p, seed, no_repeat_ngram_size, repetition_penalty,
                            block_repeated_sentences, sample_chain, generic_reply_penalty)
        speak = speak or animate
        network = self._network()
        was_training = network.training
        network.eval()
        try:
            responses = self._answer(items, max_new_tokens, decoding, speech_lengths, speak, progress)
        finally:
            network.train(was_training)
        self._give_label_sets(responses)
        for dialogue, response in zip(items, responses) if speak else ():
            avatar = self._avatar_for(dialogue, response)
            self._speak(response, avatar)
            if animate:
                self._animate(response, avatar)
        return responses[0] if single else responses

    def respond_in_stages(
        self,
        dialogue: Dialogue,
        max_new_tokens: Optional[int] = None,
        speak: bool = False,
        animate: bool = False,
        avatar=None,
        progress: Optional[Callable[[int], None]] = None,
        do_sample: Optional[bool] = None,
        temperature: Optional[float] = None,
        top_p: Optional[float] = None,
        seed: Optional[int] = None,
        no_repeat_ngram_size: Optional[int] = None,
        repetition_penalty: Optional[float] = None,
        block_repeated_sentences: Optional[bool] = None,
        sample_chain: Optional[bool] = None,
        generic_reply_penalty: Optional[float] = None,
    ) -> Iterator[Tuple[str, EmpatheticResponse]]:
        """Answer one dialogue as :meth:`respond` does, handing the answer over as each
        part becomes ready: ``("text", response)`` with the text, the Chain of
        Empathy and the emotions; then, with ``speak``, ``("speech", response)`` with
        ``response.audio``; then, with ``animate``, ``("video", response)`` with
        ``response.video``. It is the same object each time, filled in further, so a
        caller can show the text while the voice is still being made.

        ``avatar`` (an :class:`empatheia.generators.base.Avatar`) speaks instead of the
        listener's avatar from ``avatars()``: one that a caller keeps for itself, such
        as a portrait a user uploaded, never enters the shared registry. ``progress`` and
        the decoding options (greedy by default) as for :meth:`respond`.
        """
        decoding = Decoding(do_sample, temperature, top_p, seed, no_repeat_ngram_size, repetition_penalty,
                            block_repeated_sentences, sample_chain, generic_reply_penalty)
        speak = speak or animate
        network = self._network()
        was_training = network.training
        network.eval()
        # Grad mode is set per step, not around the yields: it is thread state, and the
        # caller runs its own code between them.
        try:
            with torch.no_grad():
                (response,) = self._answer([dialogue], max_new_tokens, decoding, None, speak, progress)
        finally:
            network.train(was_training)
        self._give_label_sets([response])
        yield "text", response
        if not speak:
            return
        avatar = avatar if avatar is not None else self._avatar_for(dialogue, response)
        with torch.no_grad():
            self._speak(response, avatar)
        yield "speech", response
        if animate:
            with torch.no_grad():
                self._animate(response, avatar)
            yield "video", response

    def _speak(self, response: EmpatheticResponse, avatar) -> None:
        speech = self.speech_generator()
        response.avatar = avatar.key
        response.avatar_profile = dict(avatar.profile or {})
        response.voice_style = speech.describe_style(response.speech_style)
        content = response.speech_content if self.passes_content else None
        response.audio = speech.synthesize(response.text, content, response.speech_style, avatar)

    def _animate(self, response: EmpatheticResponse, avatar) -> None:
        talking_head = self.talking_head()
        response.face_style = talking_head.describe_style(response.video_style)
        content = response.video_content if self.passes_content else None
        response.video = talking_head.animate(response.audio, content, response.video_style, avatar.portrait)
