"""Logits processors that apply a :class:`~empatheia.decoding.Decoding` during
``generate``: the choice of the chain's emotion among the trained labels, the reply's
repetition control and seeded sampling.

Both are vectorised over the batch: each step is a few tensor operations on the tokens
written so far ``(B, T)`` and the next-token scores ``(B, V)``, whatever ``B``. With
``inputs_embeds`` (how :meth:`~empatheia.modeling.Empatheia.generate_text` calls
``generate``) the ids a processor sees are the generated tokens only, so the prompt and
its left padding never enter them.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import torch
from transformers import LogitsProcessor

from .prompts import CHAIN_STEPS, META_RESPONSE, RESPONSE_LABEL, ChainOfEmpathy, PromptMode, chain_text, meta_text

_EMOTION_STEP = dict(CHAIN_STEPS)["speaker_emotion"]


def reply_markers(tokenizer: Any, mode: PromptMode) -> List[List[int]]:
    """The token ids of the lead-in after which the reply starts in prompt layout
    ``mode``, tokenized as a training target writes them (one sequence per form the
    lead-in takes): ``the response is:`` after a chain, ``The response is:`` without
    one, ``Response:`` after a meta-response. None for layouts without a reply (the
    style and M-CoE layouts). The lead-in's full label is needed: ``response is:``
    alone also ends the chain's goal step (``the goal to response is:``)."""
    if mode is PromptMode.PIPELINE:
        label, leads = f"{META_RESPONSE}:", [meta_text("sad", None), meta_text(None, None)]
    elif mode in (PromptMode.TEXT, PromptMode.FULL):
        label, leads = f"{RESPONSE_LABEL}:", [chain_text(ChainOfEmpathy(event_scenario="a party")), chain_text(None)]
    else:
        return []
    markers: List[List[int]] = []
    for lead in leads:
        text = lead + "Thank you."  # the lead-in as a target writes it, a reply after it
        at = text.lower().rfind(label.lower())
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = [token for token, (begin, end) in zip(encoded["input_ids"], encoded["offset_mapping"])
               if begin < at + len(label) and end > at]
        if ids not in markers:
            markers.append(ids)
    return markers


def reply_starts(input_ids: torch.Tensor, markers: Sequence[torch.Tensor]) -> torch.Tensor:
    """``(B,)`` the position in ``input_ids`` ``(B, T)`` of each row's first reply token:
    just after the first occurrence of any of ``markers`` (1-D token id sequences), or
    ``T`` where none occurs yet (no reply token)."""
    rows, length = input_ids.shape
    start = torch.full((rows,), length, dtype=torch.long, device=input_ids.device)
    for marker in markers:
        end, found = marker_ends(input_ids, marker)
        start = torch.minimum(start, torch.where(found, end, length))
    return start


def marker_ends(input_ids: torch.Tensor, marker: torch.Tensor):
    """``(end, found)``, both ``(B,)``: the position just after the first occurrence of
    ``marker`` (a 1-D token id sequence) in each row of ``input_ids`` ``(B, T)``, and
    whether it occurs at all (``end`` is 0 where not)."""
    rows, length = input_ids.shape
    size = marker.numel()
    if size == 0 or size > length:
        none = torch.zeros(rows, dtype=torch.long, device=input_ids.device)
        return none, none.bool()
    hits = (input_ids.unfold(1, size, 1) == marker.to(input_ids.device)).all(-1)  # (B, T - size + 1)
    found = hits.any(1)
    # argmax of a 0/1 row is its first 1.
    return torch.where(found, hits.int().argmax(1) + size, 0), found


def emotion_step_tokens(tokenizer: Any, labels: Sequence[str]):
    """``(marker, spellings)``: the token ids of the chain's emotion-step lead-in
    (``the emotion of the speaker is:``) and of each label written after it with the line
    break that ends the step (so ``content`` cannot go on as ``contented``), both as a
    training target tokenizes them (a label's tokens can depend on what precedes it)."""
    marker: Optional[List[int]] = None
    spellings: List[List[int]] = []
    for label in labels:
        text = chain_text(ChainOfEmpathy(event_scenario="a party", speaker_emotion=label))
        at = text.lower().find(_EMOTION_STEP)
        lead = at + len(_EMOTION_STEP) + 1  # past the colon
        stop = text.index(label, lead) + len(label)  # the line break chain_text ends the step with
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        pairs = list(zip(encoded["input_ids"], encoded["offset_mapping"]))
        mine = [token for token, (begin, end) in pairs if begin < lead and end > at]
        spelled = [token for token, (begin, end) in pairs if end > lead and begin <= stop]
        if marker is None:
            marker = mine
        elif mine != marker:
            raise ValueError(f"the chain's emotion lead-in tokenizes differently before {label!r}")
        spellings.append(spelled)
    return marker or [], spellings


class ChainEmotionChoice(LogitsProcessor):
    """The chain's emotion chosen among the labels the chain was trained to write, by their
    likelihood, then spelled out.

    Right after a row writes the emotion step's lead-in (``marker``), the label whose first
    token scores highest is chosen and its first token is the only one left standing; the
    next tokens are forced to spell the rest of it. Greedy decoding
    would let any word win there ("helpless", "amazed"), which the labels' folds cannot
    read; sampling would draw the emotion, which is a reading of the dialogue rather than
    a choice of words, so it is taken as the most likely label in both. After the label
    the row writes on unconstrained.

    Args:
        marker: token ids of the lead-in (:func:`emotion_step_tokens`).
        spellings: each label's token ids, first tokens distinct.
    """

    def __init__(self, marker: Sequence[int], spellings: Sequence[Sequence[int]]):
        firsts = [s[0] for s in spellings]
        if len(set(firsts)) != len(firsts):
            raise ValueError("the labels' first tokens must differ to choose among them")
        self.marker = torch.as_tensor(list(marker), dtype=torch.long)
        width = max(len(s) for s in spellings)
        self.spellings = torch.tensor([list(s) + [-1] * (width - len(s)) for s in spellings], dtype=torch.long)  # (K, W)
        self.lengths = torch.tensor([len(s) for s in spellings], dtype=torch.long)  # (K,)
        self.firsts = self.spellings[:, 0]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        end, found = marker_ends(input_ids, self.marker)
        if not bool(found.any()):
            return scores
        device, length = scores.device, input_ids.shape[1]
        firsts, spellings, lengths = self.firsts.to(device), self.spellings.to(device), self.lengths.to(device)
        written = length - end  # (B,) tokens written after the lead-in
        # The next token of each row: its label's first (choosing) or next token (spelling).
        choice = scores[:, firsts].argmax(1)  # (B,)
        first_written = input_ids.gather(1, end.clamp(max=length - 1)[:, None]).squeeze(1)  # (B,)
        matches = first_written[:, None] == firsts[None, :]  # (B, K)
        label, spelled = matches.float().argmax(1), matches.any(1)  # (B,) which label a row is spelling, if any
        choose = found & (written == 0)
        spell = found & spelled & (written > 0) & (written < lengths[label])
        forced = torch.where(choose, firsts[choice], spellings[label, written.clamp(max=spellings.shape[1] - 1)])
        constrained = choose | spell
        if not bool(constrained.any()):
            return scores
        only = torch.full_like(scores, float("-inf")).scatter(1, forced.clamp(min=0)[:, None], 0.0)
        return torch.where(constrained[:, None], only, scores)


class ReplyRepetitionControl(LogitsProcessor):
    """n-gram blocking and a repetition penalty over the reply alone.

    The reply of a row starts after the first occurrence of one of ``markers`` (the token
    ids of the lead-in the model writes before it); before that, and in rows that never
    write one, scores pass unchanged. ``protected`` token ids (the end of text, the signal
    tokens) are never penalised nor blocked, so the model can always stop.

    Args:
        markers: token id sequences that end the text before the reply.
        no_repeat_ngram_size: ``n``; 0 turns blocking off. A token that would complete an
            n-gram the reply already holds gets a score of ``-inf``.
        repetition_penalty: ``p``; 1 turns it off. A token the reply already holds has its
            score divided by ``p`` where positive and multiplied by ``p`` where negative.
        protected: token ids left alone.
    """

    def __init__(self, markers: Sequence[Sequence[int]], no_repeat_ngram_size: int = 0,
                 repetition_penalty: float = 1.0, protected: Sequence[int] = ()):
        self.markers: List[torch.Tensor] = [torch.as_tensor(list(m), dtype=torch.long) for m in markers if len(m)]
        self.ngram = int(no_repeat_ngram_size)
        self.penalty = float(repetition_penalty)
        self.protected = torch.as_tensor(sorted(set(int(i) for i in protected)), dtype=torch.long)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if not self.markers or (self.ngram <= 0 and self.penalty == 1.0):
            return scores
        rows, length = input_ids.shape
        vocab = scores.shape[-1]
        start = reply_starts(input_ids, self.markers)  # (B,)
        if bool((start >= length).all()):
            return scores  # no row has written a reply token yet
        protected = self.protected.to(scores.device)
        if self.penalty != 1.0:
            in_reply = torch.arange(length, device=input_ids.device) >= start[:, None]  # (B, T)
            seen = _token_set(torch.where(in_reply, input_ids, vocab), vocab)  # (B, V)
            seen[:, protected] = False
            penalised = torch.where(scores > 0, scores / self.penalty, scores * self.penalty)
            scores = torch.where(seen, penalised, scores)
        if self.ngram > 0:
            banned = self.banned_tokens(input_ids, start, vocab)
            banned[:, protected] = False
            scores = scores.masked_fill(banned, float("-inf"))
        return scores

    def banned_tokens(self, input_ids: torch.Tensor, start: torch.Tensor, vocab: int) -> torch.Tensor:
        """``(B, V)`` True where the next token would complete an n-gram (all its tokens
        in the reply) that the reply already holds."""
        rows, length = input_ids.shape
        n = self.ngram
        if length < n:
            return torch.zeros(rows, vocab, dtype=torch.bool, device=input_ids.device)
        grams = input_ids.unfold(1, n, 1)  # (B, W, n), W = T - n + 1
        tail = input_ids[:, length - n + 1:]  # (B, n - 1): the n-gram the next token would complete
        same_prefix = (grams[..., :-1] == tail[:, None, :]).all(-1)  # (B, W)
        in_reply = torch.arange(grams.shape[1], device=input_ids.device) >= start[:, None]
        tail_in_reply = (length - n + 1 >= start)[:, None]
        hit = same_prefix & in_reply & tail_in_reply
        return _token_set(torch.where(hit, grams[..., -1], vocab), vocab)


class SeededSampling(LogitsProcessor):
    """Temperature and nucleus (top-p) sampling from a ``torch.Generator`` of its own.

    Each step it draws one token per row from ``softmax(scores / temperature)``, cut to
    the smallest set of tokens whose probability reaches ``top_p`` (the most probable
    token always stays), and returns scores that are ``-inf`` everywhere but at the drawn
    token; ``generate`` then runs greedy, which picks it. Drawing here rather than in
    ``generate`` keeps the draws off the global RNG: a ``seed`` makes them reproducible
    without touching the caller's random state, and ``None`` seeds the generator from
    the operating system.
    """

    def __init__(self, temperature: float = 1.0, top_p: float = 1.0, seed: Optional[int] = None):
        self.temperature, self.top_p, self.seed = float(temperature), float(top_p), seed
        self.generator: Optional[torch.Generator] = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.generator is None:
            # Made on the first step, on the scores' device (a generator draws on its own).
            self.generator = torch.Generator(device=scores.device)
            if self.seed is None:
                self.generator.seed()
            else:
                self.generator.manual_seed(self.seed)
        probs = (scores.float() / self.temperature).softmax(-1)  # (B, V)
        if self.top_p < 1.0:
            ranked, order = probs.sort(-1, descending=True)
            before = ranked.cumsum(-1) - ranked  # mass of the tokens ranked above each
            keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before < self.top_p)
            probs = probs.masked_fill(~keep, 0.0)
        drawn = torch.multinomial(probs, 1, generator=self.generator)  # (B, 1)
        return torch.full_like(scores, float("-inf")).scatter(-1, drawn, 0.0)


def _token_set(ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """``(B, V)`` True at each id of ``ids`` ``(B, K)``; the id ``vocab`` marks an empty
    slot. Every duplicate writes the same True, so the result is deterministic."""
    found = torch.zeros(ids.shape[0], vocab + 1, dtype=torch.bool, device=ids.device)
    return found.scatter_(1, ids, True)[:, :vocab]
