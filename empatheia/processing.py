"""Dialogues into model batches: prompt and target text, tokens, placeholders, media."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch
from torch.nn.utils.rnn import pad_sequence
from transformers import PreTrainedTokenizerBase

from .config import EmpatheiaConfig
from .dialogue import Dialogue, Turn
from .language_model import SpecialTokenIds, audio_signal_tokens, video_signal_tokens
from .media import frames_to_clip_input, load_audio, load_video_frames, prepare_waveform, sample_frames
from .prompts import SYSTEM_PROMPT, ChainOfEmpathy, PromptMode, chain_text, context_lines, user_message

IGNORE_INDEX = -100


@dataclass
class Target:
    """What follows the prompt. ``chain`` and ``response`` are used in TEXT and FULL
    modes; ``signals`` appends the ``<AUDi>``/``<VIDi>`` tokens; ``eos`` ends the text."""

    response: Optional[str] = None
    chain: Optional[ChainOfEmpathy] = None
    signals: bool = False
    eos: bool = True

    @classmethod
    def for_mode(cls, dialogue: Dialogue, mode: PromptMode) -> "Target":
        """The training target of a stage's layout, from the dialogue's gold fields."""
        if mode is PromptMode.STYLE:
            return cls(signals=True)
        if not dialogue.response:
            raise ValueError(f"dialogue {dialogue.id}: has no gold response to train on")
        return cls(response=dialogue.response, chain=dialogue.chain, signals=mode is PromptMode.FULL)


@dataclass
class EncodedExample:
    input_ids: torch.Tensor
    """``(L,)``, with each placeholder expanded to its encoder's token count."""
    labels: torch.Tensor
    """``(L,)``, ``-100`` everywhere but the target."""
    response_mask: torch.Tensor
    """``(L,)`` True on the response text's tokens."""
    response_chars: int
    first_turn: int
    """Index of the oldest turn kept after truncation."""
    audio: List[torch.Tensor] = field(default_factory=list)
    """``(T,)`` waveforms, one per ``<Aud>`` in order."""
    video: List[torch.Tensor] = field(default_factory=list)
    """``(F, 3, S, S)`` encoder inputs, one per ``<Vid>`` in order."""


class EmpatheiaProcessor:
    """Turns :class:`Dialogue` objects into the tensors :class:`Empatheia` reads.

    A batch is a dict with ``input_ids``, ``attention_mask``, ``labels`` and
    ``response_mask`` (all ``(B, L)``), ``response_chars`` ``(B,)``, and, when the prompts
    have placeholders, ``audio`` ``(N_a, T)`` with ``audio_lengths`` ``(N_a,)`` and
    ``video`` ``(N_v, F, 3, S, S)``, ordered as the placeholders occur row by row.
    """

    def __init__(self, config: EmpatheiaConfig, tokenizer: PreTrainedTokenizerBase, ids: SpecialTokenIds):
        self.config = config
        self.tokenizer = tokenizer
        self.ids = ids
        n = config.language_model.num_signal_tokens
        self.signal_text = "".join(audio_signal_tokens(n) + video_signal_tokens(n))

    # ------------------------------------------------------------------ text
    def prompt_text(self, dialogue: Dialogue, mode: PromptMode, first_turn: int = 0) -> str:
        user = user_message(context_lines(dialogue.turns[first_turn:], mode), mode)
        layout = self.config.language_model.prompt_format
        if layout == "vicuna":
            return f"{SYSTEM_PROMPT} USER: {user} ASSISTANT:"
        if layout == "plain":
            return f"{SYSTEM_PROMPT}\n\n{user}\n\nReply:\n"
        if layout == "chat_template":
            messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]
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
        """Token ids of the target, with a mask of the response's tokens."""
        text, start, end = "", 0, 0
        if mode is not PromptMode.STYLE:
            text = chain_text(target.chain)
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
        if target.eos:
            ids = torch.cat([ids, torch.tensor([self.ids.eos])])
            response = torch.cat([response, torch.tensor([False])])
        return ids, response, len((target.response or "").strip())

    # ------------------------------------------------------------------ examples
    def encode(
        self,
        dialogue: Dialogue,
        mode: PromptMode,
        target: Optional[Target] = None,
        reserve: int = 0,
        first_turn: Optional[int] = None,
        load_media: bool = True,
    ) -> EncodedExample:
        """Encode one dialogue. When prompt + target (+ ``reserve`` tokens kept free for
        generation) exceed ``max_length``, the oldest turns are dropped first; if even the
        last turn does not fit, that is an error: the target is never cut. ``first_turn``
        fixes the kept turns instead. ``load_media=False`` leaves the media unread, for a
        caller that already holds their features."""
        max_length = self.config.language_model.max_length
        if target is not None:
            target_ids, response_mask, response_chars = self._target_ids(target, mode)
        else:
            target_ids = torch.zeros(0, dtype=torch.long)
            response_mask = torch.zeros(0, dtype=torch.bool)
            response_chars = 0
        candidates = [first_turn] if first_turn is not None else range(len(dialogue.turns))
        for start in candidates:
            prompt_ids = self._prompt_ids(self.prompt_text(dialogue, mode, start))
            total = len(prompt_ids) + len(target_ids) + reserve
            if first_turn is not None or total <= max_length:
                break
        else:
            raise ValueError(
                f"dialogue {dialogue.id}: {total} tokens with only its last turn "
                f"(target {len(target_ids)}, reserved {reserve}), over language_model.max_length={max_length}"
            )
        kept = dialogue.turns[start:]
        use_media = load_media and mode is not PromptMode.TEXT
        return EncodedExample(
            input_ids=torch.cat([prompt_ids, target_ids]),
            labels=torch.cat([torch.full_like(prompt_ids, IGNORE_INDEX), target_ids]),
            response_mask=torch.cat([torch.zeros_like(prompt_ids, dtype=torch.bool), response_mask]),
            response_chars=response_chars,
            first_turn=start,
            audio=[self._audio(t, dialogue) for t in kept if use_media and t.audio is not None],
            video=[self._video(t, dialogue) for t in kept if use_media and t.video is not None],
        )

    def _audio(self, turn: Turn, dialogue: Dialogue) -> torch.Tensor:
        rate = self.config.speech_encoder.sample_rate
        try:
            if isinstance(turn.audio, (str, Path)):
                return load_audio(turn.audio, rate)
            return prepare_waveform(turn.audio, turn.sample_rate, rate)
        except (ValueError, FileNotFoundError) as error:
            raise type(error)(f"dialogue {dialogue.id}, {turn.role} turn audio: {error}") from error

    def _video(self, turn: Turn, dialogue: Dialogue) -> torch.Tensor:
        cfg = self.config.video_encoder
        try:
            if isinstance(turn.video, (str, Path)):
                frames = load_video_frames(turn.video, cfg.num_frames)
            else:
                frames = sample_frames(torch.as_tensor(turn.video), cfg.num_frames)
        except (ValueError, FileNotFoundError) as error:
            raise type(error)(f"dialogue {dialogue.id}, {turn.role} turn video: {error}") from error
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
            "response_chars": torch.tensor([e.response_chars for e in examples]),
        }
        audio = [a for e in examples for a in e.audio]
        if audio:
            batch["audio"] = pad_sequence(audio, batch_first=True)
            batch["audio_lengths"] = torch.tensor([len(a) for a in audio])
        video = [v for e in examples for v in e.video]
        if video:
            batch["video"] = torch.stack(video)
        return batch

    def __call__(self, dialogues: Sequence[Dialogue], stage: int) -> Dict[str, torch.Tensor]:
        """The training batch of ``stage`` from dialogues with gold fields (generator
        targets and class labels are added by the data pipeline)."""
        mode = stage_mode(stage)
        return self.collate([self.encode(d, mode, Target.for_mode(d, mode)) for d in dialogues])


def stage_mode(stage: int) -> PromptMode:
    """The input layout each training stage uses (Appendix D.1)."""
    modes = {1: PromptMode.TEXT, 2: PromptMode.TEXT, 3: PromptMode.STYLE, 4: PromptMode.FULL}
    if stage not in modes:
        raise ValueError(f"stage must be 1, 2, 3 or 4, got {stage!r}")
    return modes[stage]
