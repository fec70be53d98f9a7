"""Dialogues into model batches: prompt and target text, tokens, placeholders, media."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Optional, Protocol, Sequence, Tuple, Union

import torch
from torch.nn.utils.rnn import pad_sequence
from transformers import PreTrainedTokenizerBase

from .config import EmpatheiaConfig, MediaLimits
from .dialogue import Dialogue
from .errors import DataError
from .faces import FaceCropper
from .language_model import SpecialTokenIds, audio_signal_tokens, video_signal_tokens
from .media import frames_to_clip_input, load_audio, load_video_frames, prepare_waveform, sample_frames
from .prompts import (
    CHAIN_STEPS,
    META_EMOTION,
    ChainOfEmpathy,
    PromptMode,
    TurnLike,
    chain_text,
    context_lines,
    meta_text,
    system_prompt,
    user_message,
)
from .stages import Stage, get_stage

IGNORE_INDEX = -100
_EMOTION_STEP = dict(CHAIN_STEPS)["speaker_emotion"]
_GOAL_STEP = dict(CHAIN_STEPS)["goal_to_response"]


class MediaLookup(Protocol):
    """Where encoder outputs of media files may already be (a
    :class:`~empatheia.data.cache.MediaFeatureCache`)."""

    def lookup(self, modality: str, path: Union[str, Path]) -> Tuple[str, Optional[torch.Tensor]]:
        """``(key, features)``: the file's content key and its ``(n, D_enc)`` features, or
        ``None`` when they are not there yet."""


@dataclass
class Target:
    """What follows the prompt. ``chain`` and ``response`` are used in TEXT and FULL
    modes; ``emotion``, ``profile`` and ``response`` in PIPELINE mode (the meta-response,
    :func:`~empatheia.prompts.meta_text`); ``text`` in MCOE mode (the multimodal chain,
    written by :mod:`empatheia.variants.mcoe`); ``signals`` appends the ``<AUDi>``/``<VIDi>``
    tokens; ``eos`` ends the text."""

    response: Optional[str] = None
    chain: Optional[ChainOfEmpathy] = None
    signals: bool = False
    eos: bool = True
    emotion: Optional[str] = None
    profile: Optional[Dict[str, str]] = None
    text: Optional[str] = None

    @classmethod
    def for_mode(cls, dialogue: Dialogue, mode: PromptMode) -> "Target":
        """The training target of a stage's layout, from the dialogue's gold fields."""
        if mode is PromptMode.STYLE:
            return cls(signals=True)
        if mode is PromptMode.MCOE:
            raise ValueError("the MCOE layout's target is the multimodal chain, which the dialogue does not hold; "
                             "build it with empatheia.variants.mcoe")
        if not dialogue.response:
            raise ValueError(f"dialogue {dialogue.id}: has no gold response to train on")
        if mode is PromptMode.PIPELINE:
            # The speaker's emotion as the data names it and the listener's profile where
            # the data has one: what the pipeline's generators are then driven by.
            return cls(response=dialogue.response, emotion=dialogue.emotion, profile=dialogue.listener_profile)
        # The signal tokens close every target, the text layout's included: stage 1 is where
        # the language core learns to emit them (their rows train there), so stage 4 does
        # not meet 32 unseen tokens whose loss would swamp the chain and reply (measured on
        # the small preset: 17.6 nats a signal token against 1.9 a text token).
        return cls(response=dialogue.response, chain=dialogue.chain, signals=True)


@dataclass
class EncodedExample:
    input_ids: torch.Tensor
    """``(L,)``, with each placeholder expanded to its encoder's token count."""
    labels: torch.Tensor
    """``(L,)``, ``-100`` everywhere but the target."""
    response_mask: torch.Tensor
    """``(L,)`` True on the response text's tokens."""
    emotion_slot: torch.Tensor
    """``(L,)`` True on the one token after which the Chain of Empathy's emotion is
    written (its hidden state predicts the emotion's first token); all False when the
    target has no emotion step."""
    goal_mask: torch.Tensor
    """``(L,)`` True on the target tokens of the chain's goal step (its words after the
    lead-in, up to the line break); all False when the target has no goal step."""
    response_chars: int
    first_turn: int
    """Index of the oldest turn kept after truncation."""
    audio: List["MediaItem"] = field(default_factory=list)
    """One per ``<Aud>`` in order: a ``(T,)`` waveform or cached features."""
    video: List["MediaItem"] = field(default_factory=list)
    """One per ``<Vid>`` in order: ``(F, 3, S, S)`` encoder input frames or cached features."""


@dataclass
class MediaItem:
    """One utterance's audio or video, ready for its encoder, or its cached encoder output."""

    data: torch.Tensor
    """``(T,)`` waveform, ``(F, 3, S, S)`` frames, or (``cached``) ``(n, D_enc)`` features."""
    cached: bool = False
    key: Optional[str] = None
    """The file's content key in a :class:`~empatheia.data.cache.MediaFeatureCache`."""


ECHO_FREE_WORDS = 3
"""The listener's echo (:meth:`EmpatheiaProcessor.listener_echo_example`) is pushed against
from its fourth word: an opening shared with the listener's line ("That's so sad") is no
echo, a run of four words is one (what ``listener_echo_share`` counts)."""


class EmpatheiaProcessor:
    """Turns :class:`Dialogue` objects into the tensors :class:`Empatheia` reads.

    A batch is a dict with ``input_ids``, ``attention_mask``, ``labels`` and
    ``response_mask`` (all ``(B, L)``), ``response_chars`` ``(B,)``, and, when the prompts
    have placeholders, ``audio`` ``(N_a, T)`` with ``audio_lengths`` ``(N_a,)`` and
    ``video`` ``(N_v, F, 3, S, S)`` with ``video_lengths`` ``(N_v,)`` (zero-padded after
    the lengths), ordered as the placeholders occur row by row. Items found in a media
    cache come as ``{audio,video}_cached`` ``(K, n, D_enc)`` with ``_order`` instead.
    """

    def __init__(self, config: EmpatheiaConfig, tokenizer: PreTrainedTokenizerBase, ids: SpecialTokenIds):
        self.config = config
        self.face_cropper = FaceCropper()
        self.tokenizer = tokenizer
        self.ids = ids
        n = config.language_model.num_signal_tokens
        self.signal_text = "".join(audio_signal_tokens(n) + video_signal_tokens(n))

    # ------------------------------------------------------------------ text
    def prompt_text(self, dialogue: Dialogue, mode: PromptMode, first_turn: int = 0, notes: Optional[str] = None) -> str:
        return self._layout(user_message(context_lines(dialogue.turns[first_turn:], mode), mode, notes), mode)

    def context_free_prompt_ids(self, mode: PromptMode, turns: Sequence[TurnLike] = ()) -> torch.Tensor:
        """``(C,)`` the prompt of layout ``mode`` with an empty dialogue: the system
        prompt and the task, no turn. What the language model writes after it is what it
        would say to anyone (:class:`~empatheia.logits_processors.GenericReplyPenalty`).
        ``turns`` (e.g. the listener's own) are written into the dialogue as text alone."""
        return self._prompt_ids(self._layout(user_message(context_lines(turns, PromptMode.TEXT), mode), mode))

    def _layout(self, user: str, mode: PromptMode) -> str:
        layout = self.config.language_model.prompt_format
        system = system_prompt(mode)
        if layout == "vicuna":
            return f"{system} USER: {user} ASSISTANT:"
        if layout == "plain":
            return f"{system}\n\n{user}\n\nReply:\n"
        if layout == "chat_template":
            messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        raise ValueError(f"unknown language_model.prompt_format {layout!r} (vicuna, chat_template, plain)")

    def _prompt_ids(self, text: str) -> torch.Tensor:
        # A chat template writes its own special tokens into the text.
        add_special = self.config.language_model.prompt_format != "chat_template"
        ids = torch.tensor(self.tokenizer(text, add_special_tokens=add_special)["input_ids"], dtype=torch.long)
        repeats = torch.ones_like(ids)
        repeats[ids == self.ids.audio_placeholder] = self.config.speech_encoder.num_tokens
        repeats[ids == self.ids.video_placeholder] = self.config.video_encoder.num_tokens
        return torch.repeat_interleave(ids, repeats)

    def _target_ids(self, target: Target, mode: PromptMode):
        """Token ids of the target, with masks of the response's tokens, of the emotion
        slot and of the goal step's tokens (see :class:`EncodedExample`)."""
        text, start, end, emotion_at, goal = "", 0, 0, -1, (0, 0)
        if mode is PromptMode.PIPELINE:
            text = meta_text(target.emotion, target.profile)
            if target.emotion:
                emotion_at = len(META_EMOTION) + 1
        elif mode is PromptMode.MCOE:
            text = target.text or ""
        elif mode is not PromptMode.STYLE:
            text = chain_text(target.chain)
            if target.chain is not None and target.chain.speaker_emotion:
                marker = f"{_EMOTION_STEP}:"
                emotion_at = text.find(marker) + len(marker)
            if target.chain is not None and str(target.chain.goal_to_response or "").strip():
                at = text.find(f"{_GOAL_STEP}:") + len(_GOAL_STEP) + 1
                goal = (at, text.index("\n", at))
        if mode not in (PromptMode.STYLE, PromptMode.MCOE):
            start = len(text)
            text += (target.response or "").strip()
            end = len(text)
            # An empty generated response leaves the Content Synchronizer nothing to read;
            # it then reads the whole written text rather than failing the batch.
            if end == start:
                start = 0
        if target.signals:
            text += ("\n" if text else "") + self.signal_text
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = torch.tensor(encoded["input_ids"], dtype=torch.long)
        offsets = torch.tensor(encoded["offset_mapping"], dtype=torch.long).view(-1, 2)
        response = (offsets[:, 0] < end) & (offsets[:, 1] > start)
        goal_mask = (offsets[:, 0] < goal[1]) & (offsets[:, 1] > goal[0])
        slot = torch.zeros_like(response)
        if emotion_at > 0:
            # The emotion's first token is the first to end past the step's colon; the
            # token before it is the slot.
            first = int((offsets[:, 1] > emotion_at).nonzero()[0])
            slot[first - 1] = True
        if target.eos:
            ids = torch.cat([ids, torch.tensor([self.ids.eos])])
            response = torch.cat([response, torch.tensor([False])])
            slot = torch.cat([slot, torch.tensor([False])])
            goal_mask = torch.cat([goal_mask, torch.tensor([False])])
        return ids, response, slot, goal_mask, len((target.response or "").strip())

    # ------------------------------------------------------------------ examples
    def encode(
        self,
        dialogue: Dialogue,
        mode: PromptMode,
        target: Optional[Target] = None,
        reserve: int = 0,
        first_turn: Optional[int] = None,
        load_media: bool = True,
        media_cache: Optional[MediaLookup] = None,
        notes: Optional[str] = None,
    ) -> EncodedExample:
        """Encode one dialogue. When prompt + target (+ ``reserve`` tokens kept free for
        generation) exceed ``max_length``, the oldest turns are dropped first; if even the
        last turn does not fit, that is an error: the target is never cut. ``first_turn``
        fixes the kept turns instead. ``load_media=False`` leaves the media unread, for a
        caller that already holds their features; with ``media_cache`` a file whose
        encoder output is cached is not read at all. ``notes`` follow the dialogue in the
        prompt (:func:`~empatheia.prompts.user_message`)."""
        max_length = self.config.language_model.max_length
        if target is not None:
            target_ids, response_mask, emotion_slot, goal_mask, response_chars = self._target_ids(target, mode)
        else:
            target_ids = torch.zeros(0, dtype=torch.long)
            response_mask = emotion_slot = goal_mask = torch.zeros(0, dtype=torch.bool)
            response_chars = 0

        def prompt_from(start: int) -> Tuple[torch.Tensor, int]:
            ids = self._prompt_ids(self.prompt_text(dialogue, mode, start, notes))
            return ids, len(ids) + len(target_ids) + reserve

        if first_turn is not None:
            start = first_turn
            prompt_ids, total = prompt_from(start)
        else:
            # The oldest turn whose prompt fits, by bisection: dropping turns never makes the
            # prompt longer, and rendering and tokenizing a long dialogue once per dropped
            # turn would cost time quadratic in its length.
            start = 0
            prompt_ids, total = prompt_from(0)
            if total > max_length:
                low, high = 1, len(dialogue.turns) - 1  # the answer is in [low, high], if any
                fits = None
                while low <= high:
                    middle = (low + high) // 2
                    ids, length = prompt_from(middle)
                    if length <= max_length:
                        fits, high = (middle, ids, length), middle - 1
                    else:
                        low = middle + 1
                if fits is None:  # not even the last turn fits: the error below says by how much
                    prompt_ids, total = prompt_from(len(dialogue.turns) - 1)
                else:
                    start, prompt_ids, total = fits
        if first_turn is None and total > max_length:
            raise DataError(
                f"{total} tokens with only its last turn (target {len(target_ids)}, reserved {reserve}), "
                f"over language_model.max_length={max_length}; the target is never cut",
                record=dialogue.id,
                # Without a target (answering) only the last turn can be too long.
                field="response" if len(target_ids) else f"turns[{len(dialogue.turns) - 1}].text",
            )
        use_media = load_media and mode.reads_media
        # Without a target this is a dialogue to answer: a user's long message is answered
        # from its beginning rather than refused; a training example follows media.trim.
        limits = self.config.media if target is not None else replace(self.config.media, trim=True)
        audio, video = [], []
        for index in range(start, len(dialogue.turns)) if use_media else ():
            turn = dialogue.turns[index]
            if turn.audio is not None:
                audio.append(self.turn_media(dialogue, index, "audio", media_cache, limits))
            if turn.video is not None:
                video.append(self.turn_media(dialogue, index, "video", media_cache, limits))
        return EncodedExample(
            input_ids=torch.cat([prompt_ids, target_ids]),
            labels=torch.cat([torch.full_like(prompt_ids, IGNORE_INDEX), target_ids]),
            response_mask=torch.cat([torch.zeros_like(prompt_ids, dtype=torch.bool), response_mask]),
            emotion_slot=torch.cat([torch.zeros_like(prompt_ids, dtype=torch.bool), emotion_slot]),
            goal_mask=torch.cat([torch.zeros_like(prompt_ids, dtype=torch.bool), goal_mask]),
            response_chars=response_chars,
            first_turn=start,
            audio=audio,
            video=video,
        )

    def listener_echo_example(self, dialogue: Dialogue, encoded: EncodedExample, mode: PromptMode) -> Optional[EncodedExample]:
        """The negative beside a training example ``encoded`` of the TEXT layout: its
        prompt and the dialogue's chain, then the listener's last kept turn written again
        as the reply. Its ``labels`` mark the copy's tokens from its
        ``ECHO_FREE_WORDS + 1``-th word on, and not before the first token where it departs
        from the target's reply: up to there it is the target, which the unlikelihood must
        not push against. ``None`` when the kept turns have no listener turn or nothing of
        the copy is marked."""
        if mode is not PromptMode.TEXT:
            raise ValueError(f"the listener's echo is written beside text prompts, not {mode.value} ones")
        said = [t.text.strip() for t in dialogue.turns[encoded.first_turn:] if t.role == "listener" and t.text.strip()]
        words = said[-1].split() if said else []
        if len(words) <= ECHO_FREE_WORDS:
            return None
        ids, response, slot, goal, chars = self._target_ids(Target(response=said[-1], chain=dialogue.chain, eos=False), mode)
        # A byte-level tokenizer starts each word with its space, so the opening words'
        # tokens are the copy's first ones.
        opening = self._target_ids(Target(response=" ".join(words[:ECHO_FREE_WORDS]), chain=dialogue.chain, eos=False),
                                   mode)[1].sum()
        copy_reply, target_reply = ids[response], encoded.input_ids[encoded.response_mask]
        shared = min(len(target_reply), len(copy_reply))
        differs = (target_reply[:shared] != copy_reply[:shared]).nonzero()
        departs = max(int(differs[0]) if len(differs) else shared, int(opening))
        if departs >= len(copy_reply):
            return None
        prompt = encoded.input_ids[: int((encoded.labels != IGNORE_INDEX).nonzero()[0])]
        marked = torch.zeros_like(response)
        marked[response.nonzero().squeeze(1)[departs:]] = True
        before = torch.zeros_like(prompt, dtype=torch.bool)
        return EncodedExample(
            input_ids=torch.cat([prompt, ids]),
            labels=torch.cat([torch.full_like(prompt, IGNORE_INDEX), ids.masked_fill(~marked, IGNORE_INDEX)]),
            response_mask=torch.cat([before, response]),
            emotion_slot=torch.cat([before, slot]),
            goal_mask=torch.cat([before, goal]),
            response_chars=chars,
            first_turn=encoded.first_turn,
        )

    def turn_media(
        self,
        dialogue: Dialogue,
        index: int,
        modality: str,
        cache: Optional[MediaLookup] = None,
        limits: Optional[MediaLimits] = None,
    ) -> MediaItem:
        """Turn ``index``'s ``audio`` or ``video``: cached features when the cache has the
        file, else the encoder input, read within ``limits`` (default: the config's
        ``media``). A bad file is a :class:`DataError` naming it, the dialogue and the
        turn."""
        turn = dialogue.turns[index]
        source = getattr(turn, modality)
        try:
            key = None
            if isinstance(source, (str, Path)):
                if cache is not None and Path(source).is_file():
                    key, features = cache.lookup(modality, source)
                    if features is not None:
                        return MediaItem(features, cached=True, key=key)
            if modality == "audio":
                data = self.load_audio(source, turn.sample_rate, limits)
            else:
                data = self.load_video(source, limits)
            return MediaItem(data, key=key)
        except DataError as error:
            # Same class (a NoFaceError stays one), now saying which dialogue and turn.
            raise type(error)(error.reason, file=error.file, record=dialogue.id, field=f"turns[{index}].{modality}") from None

    def load_audio(self, source, sample_rate: Optional[int] = None, limits: Optional[MediaLimits] = None) -> torch.Tensor:
        """A file path, or a waveform at ``sample_rate``, as the ``(T,)`` speech encoder
        input, no longer than ``limits.max_seconds`` (default: the config's ``media``)."""
        rate = self.config.speech_encoder.sample_rate
        limits = limits or self.config.media
        if isinstance(source, (str, Path)):
            return load_audio(source, rate, limits)
        return prepare_waveform(source, sample_rate, rate, limits=limits)

    def load_video(self, source, limits: Optional[MediaLimits] = None) -> torch.Tensor:
        """A file path, or ``(F, H, W, 3)`` uint8 frames, as the ``(F', 3, S, S)`` video
        encoder input: frames taken at ``frame_rate`` (at most ``num_frames``) from the
        first ``limits.max_seconds`` (default: the config's ``media``), the face cropped
        (``face_crop``), resized and normalised."""
        cfg = self.config.video_encoder
        if isinstance(source, (str, Path)):
            frames = load_video_frames(source, cfg.num_frames, cfg.frame_rate, limits or self.config.media)
        else:
            frames = torch.as_tensor(source)
            if frames.dim() != 4 or frames.shape[-1] != 3:
                raise DataError(f"video frames must be (F, H, W, 3), got shape {tuple(frames.shape)}", field="video")
            if frames.shape[0] == 0:
                raise DataError("video has no frames", field="video")
            if frames.shape[0] > cfg.num_frames:
                frames = sample_frames(frames, cfg.num_frames)
        if cfg.face_crop:
            frames = self.face_cropper.crop(frames, source=source if isinstance(source, (str, Path)) else None)
        return frames_to_clip_input(frames, cfg.image_size, cfg.mean, cfg.std)

    # ------------------------------------------------------------------ batches
    def collate(self, examples: Sequence[EncodedExample], padding_side: str = "right") -> Dict[str, torch.Tensor]:
        left = padding_side == "left"

        def pad(seqs, value):
            if left:
                return pad_sequence([s.flip(0) for s in seqs], batch_first=True, padding_value=value).flip(1)
            return pad_sequence(list(seqs), batch_first=True, padding_value=value)

        ids = [e.input_ids for e in examples]
        batch = {
            "input_ids": pad(ids, self.ids.pad),
            "attention_mask": pad([torch.ones_like(i) for i in ids], 0),
            "labels": pad([e.labels for e in examples], IGNORE_INDEX),
            "response_mask": pad([e.response_mask for e in examples], False),
            "emotion_slot": pad([e.emotion_slot for e in examples], False),
            "goal_mask": pad([e.goal_mask for e in examples], False),
            "response_chars": torch.tensor([e.response_chars for e in examples]),
        }
        batch.update(collate_media([a for e in examples for a in e.audio], "audio", "audio_lengths"))
        batch.update(collate_media([v for e in examples for v in e.video], "video", "video_lengths"))
        return batch

    def __call__(self, dialogues: Sequence[Dialogue], stage: Union[int, Stage]) -> Dict[str, torch.Tensor]:
        """The training batch of ``stage`` (in its prompt layout) from dialogues with gold
        fields (generator targets and class labels are added by the data pipeline)."""
        layout = get_stage(stage).layout
        return self.collate([self.encode(d, layout, Target.for_mode(d, layout)) for d in dialogues])


def collate_media(items: Sequence[MediaItem], modality: str, lengths_key: str) -> Dict[str, object]:
    """Raw items padded along time with their lengths; cached items stacked, with the
    order that puts both back in placeholder order (see :func:`merge_features`)."""
    out: Dict[str, object] = {}
    if not items:
        return out
    raw = [item for item in items if not item.cached]
    cached = [item for item in items if item.cached]
    if raw:
        out[modality] = pad_sequence([item.data for item in raw], batch_first=True)
        out[lengths_key] = torch.tensor([item.data.shape[0] for item in raw])
        if any(item.key is not None for item in raw):
            out[f"{modality}_cache_keys"] = [item.key for item in raw]
    if cached:
        out[f"{modality}_cached"] = torch.stack([item.data for item in cached])
        is_cached = torch.tensor([item.cached for item in items])
        order = torch.empty(len(items), dtype=torch.long)
        order[~is_cached] = torch.arange(len(raw))
        order[is_cached] = len(raw) + torch.arange(len(cached))
        out[f"{modality}_order"] = order
    return out


def merge_features(batch: Dict[str, object], modality: str, raw: Optional[torch.Tensor]) -> torch.Tensor:
    """All items' encoder features in placeholder order, from freshly encoded raw media
    ``(M, n, D)`` and the batch's cached ``{modality}_cached`` ``(K, n, D)``.

    ``{modality}_order`` ``(M + K,)`` says, for each placeholder, its row in
    ``cat([raw, cached])`` (:func:`collate_media` writes it).
    """
    cached = batch.get(f"{modality}_cached")
    if cached is None:
        return raw
    rows = cached if raw is None else torch.cat([raw, cached.to(raw.device, raw.dtype)])
    return rows[batch[f"{modality}_order"].to(rows.device)]
