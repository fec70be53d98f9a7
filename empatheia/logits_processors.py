"""Logits processors that apply a :class:`~empatheia.decoding.Decoding` during
``generate``: the choice of the chain's emotion among the trained labels and of its goal
among the goals that fit that emotion, the reply's
repetition control and least length, the block on repeated sentences, the penalty on
generic openings and seeded sampling.

All are vectorised over the batch: each step is a few tensor operations on the tokens
written so far ``(B, T)`` and the next-token scores ``(B, V)``, whatever ``B`` (the
penalty on generic openings adds one language-model pass over the rows still in their
opening). With
``inputs_embeds`` (how :meth:`~empatheia.modeling.Empatheia.generate_text` calls
``generate``) the ids a processor sees are the generated tokens only, so the prompt and
its left padding never enter them.
"""

from __future__ import annotations

import hashlib
import math
import re
import secrets
from typing import Any, List, Optional, Sequence

import torch
from transformers import LogitsProcessor

from .prompts import CHAIN_STEPS, META_RESPONSE, RESPONSE_LABEL, ChainOfEmpathy, PromptMode, chain_text, meta_text

_WORD = re.compile(r"\w")
_CLOSE = re.compile(r"[.!?\u2026]")


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


def reply_lengths(input_ids: torch.Tensor, markers: Sequence[torch.Tensor]) -> torch.Tensor:
    """``(B,)`` how many reply tokens each row of ``input_ids`` ``(B, T)`` holds: the tokens
    after the first occurrence of any of ``markers``; 0 just after the lead-in and -1 before
    it, which :func:`reply_starts` (``T`` for both) does not tell apart."""
    rows, length = input_ids.shape
    start = torch.full((rows,), length + 1, dtype=torch.long, device=input_ids.device)
    for marker in markers:
        end, found = marker_ends(input_ids, marker)
        start = torch.minimum(start, torch.where(found, end, length + 1))
    return length - start


def _marker_tensors(markers: Sequence[Sequence[int]]) -> List[torch.Tensor]:
    """The non-empty token id sequences of ``markers`` as 1-D tensors."""
    return [torch.as_tensor(list(m), dtype=torch.long) for m in markers if len(m)]


def line_starts(input_ids: torch.Tensor, line_end: torch.Tensor) -> torch.Tensor:
    """``(B,)`` the position in ``input_ids`` ``(B, T)``, ``T`` > 0, just after each row's
    last token that holds a line break (``line_end``, ``(V,)`` bool), 0 where none does."""
    position = torch.arange(input_ids.shape[1], device=input_ids.device)
    return torch.where(line_end[input_ids], position, -1).max(1).values + 1


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
    return _step_tokens(tokenizer, "speaker_emotion", labels,
                        lambda label: ChainOfEmpathy(event_scenario="a party", speaker_emotion=label))


def goal_step_tokens(tokenizer: Any, goals: Sequence[str]):
    """``(marker, spellings)``: the token ids of the chain's goal-step lead-in (``the goal
    to response is:``) and of each goal written after it with the line break that ends the
    step, as a four-step training target tokenizes them."""
    return _step_tokens(tokenizer, "goal_to_response", goals,
                        lambda goal: ChainOfEmpathy(event_scenario="a party", speaker_emotion="sad",
                                                    emotion_cause="the rain", goal_to_response=goal))


def _step_tokens(tokenizer: Any, step: str, values: Sequence[str], chain_with):
    """The lead-in of chain step ``step`` (a field of ``CHAIN_STEPS``) and each of
    ``values`` written in it, line break included, tokenized inside ``chain_with(value)``'s
    target text."""
    label = dict(CHAIN_STEPS)[step]
    marker: Optional[List[int]] = None
    spellings: List[List[int]] = []
    for value in values:
        text = chain_text(chain_with(value))
        at = text.lower().find(label)
        lead = at + len(label) + 1  # past the colon
        stop = text.index(value, lead) + len(value)  # the line break chain_text ends the step with
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        pairs = list(zip(encoded["input_ids"], encoded["offset_mapping"]))
        mine = [token for token, (begin, end) in pairs if begin < lead and end > at]
        if marker is None:
            marker = mine
        elif mine != marker:
            raise ValueError(f"the chain's lead-in {label!r} tokenizes differently before {value!r}")
        spellings.append([token for token, (begin, end) in pairs if end > lead and begin <= stop])
    return marker or [], spellings


def chain_lead_ins(tokenizer: Any) -> List[List[int]]:
    """The token ids of each line's lead-in in a four-step chain as a training target
    writes it (``chain_text``): ``Firstly, the event scenario of this conversation is:``,
    ..., ``Fourthly, the goal to response is:``, ``Finally, the response is:``; five
    sequences. A ``ValueError`` if a token of this tokenizer straddles a lead-in's start
    or end, where :class:`ChainTemplate` could not force it token by token."""
    chain = ChainOfEmpathy(event_scenario="a party", speaker_emotion="sad", emotion_cause="the rain",
                           goal_to_response="comfort")
    text = chain_text(chain) + "Thank you."
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    pairs = list(zip(encoded["input_ids"], encoded["offset_mapping"]))
    leads: List[List[int]] = []
    start = 0
    for line in text.split("\n"):
        end = start + line.index(":") + 1
        inside = [token for token, (begin, stop) in pairs if begin >= start and stop <= end and stop > begin]
        straddling = [token for token, (begin, stop) in pairs if begin < start < stop or begin < end < stop]
        if straddling or not inside:
            raise ValueError(f"the chain's lead-in {line[: end - start]!r} does not fall on token boundaries")
        leads.append(inside)
        start += len(line) + 1
    return leads


class ChainTemplate(LogitsProcessor):
    """The chain's template written as trained, whatever the model would write there.

    Each line of a chain begins with its step's lead-in (``leads``, from
    :func:`chain_lead_ins`): after the row's ``k``-th line break (``k`` < 5) its next
    tokens are forced to spell lead-in ``k``, so the chain names its four steps in order and
    then the response, with the template's exact words ("the goal to response is", not
    "the goal of the response is"); between lead-ins, and after the fifth, the row writes
    freely. A small core trained briefly on the four-step form otherwise renames steps,
    repeats one or stops after two; the template is format, not content, so forcing it
    leaves every word of every step the model's own.

    Args:
        leads: the lead-ins' token ids, in order.
        line_end: ``(V,)`` True for token ids that hold a line break.
    """

    def __init__(self, leads: Sequence[Sequence[int]], line_end: torch.Tensor):
        width = max(len(lead) for lead in leads)
        self.leads = torch.tensor([list(lead) + [-1] * (width - len(lead)) for lead in leads], dtype=torch.long)
        self.lengths = torch.tensor([len(lead) for lead in leads], dtype=torch.long)
        self.line_end = line_end.bool()

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        length = input_ids.shape[1]
        device = scores.device
        if self.leads.device != device:
            self.leads, self.lengths, self.line_end = self.leads.to(device), self.lengths.to(device), self.line_end.to(device)
        if length == 0:  # the first token: the first lead-in's
            return torch.full_like(scores, float("-inf")).index_fill(1, self.leads[0, :1], 0.0)
        line = self.line_end[input_ids].long().sum(1)  # (B,) the line each row is writing
        begin = line_starts(input_ids, self.line_end)
        written = length - begin  # (B,) tokens of the current line so far
        count, width = self.leads.shape
        lead = self.leads[line.clamp(max=count - 1)]  # (B, W)
        # The current line's first W tokens beside its lead-in: forced so far means equal so far.
        at = begin[:, None] + torch.arange(width, device=device)  # (B, W)
        seen = input_ids.gather(1, at.clamp(max=length - 1))
        upto = torch.arange(width, device=device) < written[:, None]
        on_track = ((seen == lead) | ~upto).all(1)
        forcing = (line < count) & on_track & (written < self.lengths[line.clamp(max=count - 1)])
        if not bool(forcing.any()):
            return scores
        forced = lead.gather(1, written.clamp(max=width - 1)[:, None]).squeeze(1)  # (B,)
        only = torch.full_like(scores, float("-inf")).scatter(1, forced.clamp(min=0)[:, None], 0.0)
        return torch.where(forcing[:, None], only, scores)


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

    With ``prior``, each row's labels are scored by their first tokens' log-probabilities
    (renormalised over the labels) plus ``prior``: another reader's log-probabilities of the
    same labels for that row's dialogue, already weighted (:func:`fused_label_scores`).

    Args:
        marker: token ids of the lead-in (:func:`emotion_step_tokens`).
        spellings: each label's token ids, first tokens distinct.
        prior: ``(B, K)`` added to the labels' log-probabilities of each row, or ``None``.
    """

    def __init__(self, marker: Sequence[int], spellings: Sequence[Sequence[int]],
                 prior: Optional[torch.Tensor] = None):
        firsts = [s[0] for s in spellings]
        if len(set(firsts)) != len(firsts):
            raise ValueError("the labels' first tokens must differ to choose among them")
        if prior is not None and (prior.dim() != 2 or prior.shape[1] != len(spellings)):
            raise ValueError(f"prior must be (B, {len(spellings)}), one score per label and row; "
                             f"got {tuple(prior.shape)}")
        self.marker = torch.as_tensor(list(marker), dtype=torch.long)
        width = max(len(s) for s in spellings)
        self.spellings = torch.tensor([list(s) + [-1] * (width - len(s)) for s in spellings], dtype=torch.long)  # (K, W)
        self.lengths = torch.tensor([len(s) for s in spellings], dtype=torch.long)  # (K,)
        self.firsts = self.spellings[:, 0]
        self.prior = prior

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        end, found = marker_ends(input_ids, self.marker)
        if not bool(found.any()):
            return scores
        device, length = scores.device, input_ids.shape[1]
        firsts, spellings, lengths = self.firsts.to(device), self.spellings.to(device), self.lengths.to(device)
        written = length - end  # (B,) tokens written after the lead-in
        # The next token of each row: its label's first (choosing) or next token (spelling).
        choice = fused_label_scores(scores[:, firsts], self.prior).argmax(1)  # (B,)
        label, spelled = spelled_labels(input_ids, end, firsts)  # which label a row is spelling, if any
        choose = found & (written == 0)
        spell = found & spelled & (written > 0) & (written < lengths[label])
        forced = torch.where(choose, firsts[choice], spellings[label, written.clamp(max=spellings.shape[1] - 1)])
        constrained = choose | spell
        if not bool(constrained.any()):
            return scores
        only = torch.full_like(scores, float("-inf")).scatter(1, forced.clamp(min=0)[:, None], 0.0)
        return torch.where(constrained[:, None], only, scores)


class ChainGoalChoice(LogitsProcessor):
    """The chain's goal written as one of the goals that fit the emotion the chain chose.

    After a row writes the goal step's lead-in (``marker``) it may only go on along the
    spellings of the goals allowed for its emotion (a trie walked token by token): at each
    step every token that continues one of them is left as the model scored it and every
    other is masked, so the model's own scores pick the goal, its first act first. A goal
    ends with the step's line break; after it the row writes on unconstrained.

    The row's emotion is the label spelled after the emotion step's lead-in (the labels'
    first tokens differ, :class:`ChainEmotionChoice`); a row without one (the step missing
    or holding another word) may write any of the goals. With ``goal_leads`` and
    ``row_leads`` a row writes only goals of its own lead (whether the speaker asked a
    question or for advice, which the dialogue decides).

    Args:
        marker: token ids of the goal step's lead-in (:func:`goal_step_tokens`).
        spellings: each goal's token ids, line break included (``N`` goals).
        allowed: ``(K, N)`` bool, which goals fit each of the ``K`` labels.
        emotion_marker: token ids of the emotion step's lead-in (:func:`emotion_step_tokens`).
        label_firsts: the ``K`` labels' first token ids after it.
        goal_leads: ``(N,)`` which lead each goal opens with, or ``None``.
        row_leads: ``(B,)`` which lead each row's goal must open with, or ``None``.
        prior: ``(K, N)`` positive weights of the goals for each label (what listeners
            chose), or ``None``. Each goal's probability is multiplied by its weight raised
            to ``prior_weight``: at each token the prior's share of the goals that go on
            with it, among the goals still open, is added to the token's score (in log),
            so the goal as a whole gets the product.
        prior_weight: the exponent of ``prior``.
    """

    def __init__(self, marker: Sequence[int], spellings: Sequence[Sequence[int]], allowed: torch.Tensor,
                 emotion_marker: Sequence[int], label_firsts: Sequence[int],
                 goal_leads: Optional[torch.Tensor] = None, row_leads: Optional[torch.Tensor] = None,
                 prior: Optional[torch.Tensor] = None, prior_weight: float = 1.0):
        if allowed.dim() != 2 or allowed.shape != (len(label_firsts), len(spellings)):
            raise ValueError(f"allowed must be ({len(label_firsts)}, {len(spellings)}), one row per label and a "
                             f"column per goal; got {tuple(allowed.shape)}")
        if not spellings or any(len(s) == 0 for s in spellings):
            raise ValueError("every goal needs at least one token")
        self.marker = torch.as_tensor(list(marker), dtype=torch.long)
        self.emotion_marker = torch.as_tensor(list(emotion_marker), dtype=torch.long)
        self.firsts = torch.as_tensor(list(label_firsts), dtype=torch.long)  # (K,)
        width = max(len(s) for s in spellings)
        self.spellings = torch.tensor([list(s) + [-1] * (width - len(s)) for s in spellings], dtype=torch.long)  # (N, W)
        self.lengths = torch.tensor([len(s) for s in spellings], dtype=torch.long)  # (N,)
        # The last row: any goal, for a row whose emotion is not a label.
        self.allowed = torch.cat([allowed.bool(), allowed.new_ones(1, len(spellings), dtype=torch.bool)])  # (K+1, N)
        if (goal_leads is None) != (row_leads is None):
            raise ValueError("goal_leads and row_leads go together")
        if goal_leads is not None and goal_leads.shape != (len(spellings),):
            raise ValueError(f"goal_leads must be ({len(spellings)},), one per goal; got {tuple(goal_leads.shape)}")
        self.goal_leads, self.row_leads = goal_leads, row_leads
        self.log_prior = None
        if prior is not None:
            if prior.shape != allowed.shape or not bool((prior > 0).all()):
                raise ValueError(f"prior must be {tuple(allowed.shape)} and positive; got {tuple(prior.shape)}")
            # The last row (no label): no prior.
            self.log_prior = torch.cat([prior.double().log().float(), prior.new_zeros(1, len(spellings)).float()])
        self.prior_weight = float(prior_weight)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        end, found = marker_ends(input_ids, self.marker)
        if not bool(found.any()):
            return scores
        device, length = scores.device, input_ids.shape[1]
        if self.spellings.device != device:
            self.spellings, self.lengths = self.spellings.to(device), self.lengths.to(device)
            self.allowed, self.firsts = self.allowed.to(device), self.firsts.to(device)
        written = length - end  # (B,) tokens of the goal so far
        width = self.spellings.shape[1]
        emotion_end, has_emotion = marker_ends(input_ids, self.emotion_marker)
        label, spelled = spelled_labels(input_ids, emotion_end, self.firsts)
        label = torch.where(spelled & has_emotion, label, self.firsts.numel())  # (B,) K: no label
        # Goals whose spelling the row has followed so far and that go on past it.
        step = torch.arange(width, device=device)
        seen = input_ids.gather(1, (end[:, None] + step).clamp(max=length - 1))  # (B, W)
        upto = step[None, :] < written[:, None]  # (B, W)
        agree = ((seen[:, None, :] == self.spellings[None]) | ~upto[:, None, :]).all(-1)  # (B, N)
        open_goals = agree & self.allowed[label] & (self.lengths[None, :] > written[:, None])  # (B, N)
        if self.goal_leads is not None:
            if self.row_leads.shape != (input_ids.shape[0],):
                raise ValueError(f"row_leads must be ({input_ids.shape[0]},), one per row; "
                                 f"got {tuple(self.row_leads.shape)}")
            open_goals &= self.goal_leads.to(device)[None, :] == self.row_leads.to(device)[:, None]
        constrained = found & open_goals.any(1)
        if not bool(constrained.any()):
            return scores
        following = self.spellings[:, written.clamp(max=width - 1)].T.clamp(min=0)  # (B, N) each goal's next token
        votes = torch.zeros_like(scores).scatter_add_(1, following, open_goals.to(scores.dtype))
        allowed = (votes > 0) & constrained[:, None]  # (B, V)
        kept = torch.where(allowed, scores, torch.full_like(scores, float("-inf")))
        if self.log_prior is not None and self.prior_weight:
            kept = kept + self.prior_weight * self._prior_shares(label, open_goals, following, constrained, scores)
        # Where a block before this choice masked every continuation, the goal still goes on
        # (the first of them): a step must not end in a word no goal has.
        stuck = constrained & ~torch.isfinite(kept).any(1)
        kept = torch.where(stuck[:, None] & allowed, torch.zeros_like(scores), kept)
        return torch.where(constrained[:, None], kept, scores)


    def _prior_shares(self, label: torch.Tensor, open_goals: torch.Tensor, following: torch.Tensor,
                      constrained: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """``(B, V)`` the log of the prior's share of each next token among the open goals
        (0 off the constrained rows, -inf for tokens no open goal takes)."""
        log_prior = self.log_prior.to(scores.device)[label]  # (B, N)
        weights = torch.where(open_goals, log_prior, float("-inf"))
        top = torch.where(constrained, weights.max(1).values, 0.0)[:, None]  # (B, 1)
        mass = torch.zeros(scores.shape, dtype=torch.float, device=scores.device).scatter_add_(
            1, following, (weights - top).exp())  # (B, V)
        shares = mass.log() - mass.sum(1, keepdim=True).log()
        return torch.where(constrained[:, None], shares, 0.0).to(scores.dtype)


class ReplyGoalOpenings(LogitsProcessor):
    """The reply does what its chain's goal says: each act the goal names opens a sentence
    of the reply, in the goal's order, with one of the openings listeners give that act.

    Once a row is in its reply (after ``markers``), the goal it wrote (one of ``goals``,
    matched whole after the goal step's lead-in ``marker``) decides its acts; the reply's
    sentence ``k`` (counted by sentence ends) opens with an opening of act ``k`` for as
    many sentences as the goal names acts. While an opening is under way only tokens that
    continue one of its act's openings are left as the model scored them (a trie walked
    token by token, as :class:`ChainGoalChoice` walks goals), so the model's scores choose
    the words; after an opening is complete the sentence goes on freely. The end of text
    and the signal tokens are not among an opening's tokens: a reply whose goal names two
    acts does not end before the second opens. A row whose goal names no act (the
    emotion's own goal) or matches none of ``goals`` writes its reply unconstrained.

    Args:
        marker: token ids of the goal step's lead-in (:func:`goal_step_tokens`).
        goals: each goal's token ids as the goal step writes them, line break included
            (``N`` goals).
        goal_acts: ``(N, A)`` the act each goal names ``a``-th (an index into ``openings``'
            acts), -1 past its last.
        openings: ``(act, token ids)`` pairs, each act's openings as a reply writes them
            after a space (``M`` in all).
        markers: token id sequences that end the text before the reply.
        sentence_end: ``(V,)`` bool, the tokens that close a sentence
            (:func:`sentence_token_classes`).
        bonus: ``None`` holds the reply to the openings; a number is added to the scores of
            the tokens that go on with one instead, every other token left as scored, so
            the model keeps its own words where it prefers them by more than that.
    """

    def __init__(self, marker: Sequence[int], goals: Sequence[Sequence[int]], goal_acts: torch.Tensor,
                 openings: Sequence[tuple], markers: Sequence[Sequence[int]], sentence_end: torch.Tensor,
                 bonus: Optional[float] = None):
        if bonus is not None and not bonus >= 0:
            raise ValueError(f"bonus must be None or 0 or more, got {bonus}")
        self.bonus = bonus
        if goal_acts.dim() != 2 or goal_acts.shape[0] != len(goals):
            raise ValueError(f"goal_acts must be ({len(goals)}, A), a row per goal; got {tuple(goal_acts.shape)}")
        if not goals or any(len(g) == 0 for g in goals) or any(len(ids) == 0 for _, ids in openings):
            raise ValueError("every goal and every opening needs at least one token")
        self.marker = torch.as_tensor(list(marker), dtype=torch.long)
        self.goals, self.goal_lengths = _padded([list(g) for g in goals])  # (N, W), (N,)
        self.goal_acts = goal_acts.long()
        self.opening_acts = torch.tensor([int(act) for act, _ in openings], dtype=torch.long)  # (M,)
        self.openings, self.opening_lengths = _padded([list(ids) for _, ids in openings])  # (M, Wo), (M,)
        self.markers = _marker_tensors(markers)
        self.sentence_end = sentence_end.bool()

    def _to(self, device) -> None:
        if self.goals.device != device:
            for name in ("goals", "goal_lengths", "goal_acts", "opening_acts", "openings", "opening_lengths",
                         "sentence_end"):
                setattr(self, name, getattr(self, name).to(device))

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        rows, length = input_ids.shape
        written = reply_lengths(input_ids, self.markers)  # (B,) -1 before the reply
        if length == 0 or not bool((written >= 0).any()):
            return scores
        device = scores.device
        self._to(device)
        # The goal each row wrote, whole.
        end, found = marker_ends(input_ids, self.marker)
        goal_match = _spelled_whole(input_ids, end, self.goals, self.goal_lengths) & found[:, None]  # (B, N)
        has_goal = goal_match.any(1)
        goal = goal_match.float().argmax(1)  # (B,)
        # The reply's sentence being written and its tokens so far.
        position = torch.arange(length, device=device)
        in_reply = position[None, :] >= (length - written)[:, None]  # (B, T)
        known = input_ids < self.sentence_end.numel()
        closes = self.sentence_end[input_ids.clamp(max=self.sentence_end.numel() - 1)] & known & in_reply
        sentence = closes.sum(1)  # (B,)
        start = torch.where(closes, position + 1, (length - written)[:, None]).max(1).values  # (B,)
        so_far = length - start  # (B,)
        width = self.goal_acts.shape[1]
        act = self.goal_acts[goal, sentence.clamp(max=width - 1)]
        due = (written >= 0) & has_goal & (sentence < width) & (act >= 0)  # (B,)
        if not bool(due.any()):
            return scores
        steps = self.openings.shape[1]
        step = torch.arange(steps, device=device)
        seen = input_ids.gather(1, (start[:, None] + step).clamp(max=length - 1))  # (B, Wo)
        agree = ((seen[:, None, :] == self.openings[None]) | (step >= so_far[:, None])[:, None, :]).all(-1)
        agree &= self.opening_acts[None, :] == act[:, None]  # (B, M)
        complete = (agree & (self.opening_lengths[None, :] == so_far[:, None])).any(1)
        open_ones = agree & (self.opening_lengths[None, :] > so_far[:, None])
        constrained = due & ~complete & open_ones.any(1)
        if not bool(constrained.any()):
            return scores
        following = self.openings[:, so_far.clamp(max=steps - 1)].T.clamp(min=0)  # (B, M)
        votes = torch.zeros_like(scores).scatter_add_(1, following, open_ones.to(scores.dtype))
        allowed = votes > 0
        if self.bonus is not None:
            return torch.where(constrained[:, None] & allowed, scores + self.bonus, scores)
        kept = torch.where(allowed, scores, torch.full_like(scores, float("-inf")))
        # Where a block before this one masked every continuation, the opening still goes on:
        # half an opening would leave the act undone.
        stuck = constrained & ~torch.isfinite(kept).any(1)
        kept = torch.where(stuck[:, None] & allowed, torch.zeros_like(scores), kept)
        return torch.where(constrained[:, None], kept, scores)


def _padded(sequences: Sequence[Sequence[int]]):
    """``(ids, lengths)``: ``sequences`` as one ``(N, W)`` tensor padded with -1, and their
    ``(N,)`` lengths."""
    width = max(len(s) for s in sequences)
    ids = torch.tensor([list(s) + [-1] * (width - len(s)) for s in sequences], dtype=torch.long)
    return ids, torch.tensor([len(s) for s in sequences], dtype=torch.long)


def _spelled_whole(input_ids: torch.Tensor, end: torch.Tensor, spellings: torch.Tensor,
                   lengths: torch.Tensor) -> torch.Tensor:
    """``(B, N)`` whether each row of ``input_ids`` ``(B, T)`` holds the whole of each of
    ``spellings`` ``(N, W)`` (-1 padded, ``lengths`` ``(N,)``) from position ``end``
    ``(B,)`` on."""
    length, width = input_ids.shape[1], spellings.shape[1]
    step = torch.arange(width, device=input_ids.device)
    seen = input_ids.gather(1, (end[:, None] + step).clamp(max=length - 1))  # (B, W)
    inside = step[None, :] < lengths[:, None]  # (N, W)
    same = ((seen[:, None, :] == spellings[None]) | ~inside[None]).all(-1)  # (B, N)
    return same & (end[:, None] + lengths[None, :] <= length)


def spelled_labels(input_ids: torch.Tensor, end: torch.Tensor, firsts: torch.Tensor):
    """``(label, spelled)``, both ``(B,)``: which of the labels (their distinct first token
    ids ``firsts``, ``(K,)``) each row of ``input_ids`` ``(B, T)`` wrote at position
    ``end`` ``(B,)``, and whether it wrote one at all (``label`` is 0 where not)."""
    first = input_ids.gather(1, end.clamp(max=input_ids.shape[1] - 1)[:, None])  # (B, 1)
    matches = first == firsts[None, :]  # (B, K)
    return matches.float().argmax(1), matches.any(1)


def fused_label_scores(logits: torch.Tensor, prior: Optional[torch.Tensor]) -> torch.Tensor:
    """``(B, K)`` label scores: the labels' logits ``(B, K)`` as log-probabilities over the
    labels, plus ``prior`` ``(B, K)`` where given. Their softmax is the fused distribution,
    a product of the two readings (:meth:`Empatheia.chain_emotion_prior`)."""
    scores = logits.float().log_softmax(-1)
    return scores if prior is None else scores + prior.to(scores.device, scores.dtype)


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
        self.markers = _marker_tensors(markers)
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
            banned = repeated_ngram_tokens(input_ids, start, self.ngram, vocab)
            banned[:, protected] = False
            scores = scores.masked_fill(banned, float("-inf"))
        return scores


class ReplyMinLength(LogitsProcessor):
    """The reply may not end before it holds ``tokens`` tokens: the ``stops`` (the end of
    text, the signal tokens that follow the reply, the line breaks that end its line) get
    a score of ``-inf`` in every row whose reply is shorter. Rows before their reply pass
    unchanged.

    Why: a core trained on short distilled replies ends after its first sentence ("I'm so
    sorry."), where the listeners of EmpatheticDialogues go on to say what they make of it
    or to ask; withholding the end lets the model write its own next sentence, every word
    still its choice.

    Args:
        markers: token id sequences that end the text before the reply.
        tokens: the fewest reply tokens, at least 1.
        stops: token ids that end the reply.
    """

    def __init__(self, markers: Sequence[Sequence[int]], tokens: int, stops: Sequence[int]):
        if isinstance(tokens, bool) or int(tokens) != tokens or tokens < 1:
            raise ValueError(f"ReplyMinLength needs tokens >= 1, got {tokens!r}")
        if not len(stops):
            raise ValueError("ReplyMinLength needs the token ids that end the reply")
        self.markers = _marker_tensors(markers)
        self.tokens = int(tokens)
        self.stops = torch.as_tensor(sorted(set(int(i) for i in stops)), dtype=torch.long)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if not self.markers:
            return scores
        written = reply_lengths(input_ids, self.markers)  # (B,) -1 before the reply
        short = (written >= 0) & (written < self.tokens)
        if not bool(short.any()):
            return scores
        scores = scores.clone()
        stops = self.stops.to(scores.device)
        scores[short.nonzero()[:, :1], stops[None, :]] = float("-inf")
        return scores


def repeated_ngram_tokens(input_ids: torch.Tensor, start: torch.Tensor, n: int, vocab: int) -> torch.Tensor:
    """``(B, V)`` True where a row's next token would complete an n-gram (``n`` tokens, all
    at or after the row's ``start``, ``(B,)``) that the row already holds from ``start`` on."""
    rows, length = input_ids.shape
    if length < n:
        return torch.zeros(rows, vocab, dtype=torch.bool, device=input_ids.device)
    grams = input_ids.unfold(1, n, 1)  # (B, W, n), W = T - n + 1
    tail = input_ids[:, length - n + 1:]  # (B, n - 1): the n-gram the next token would complete
    same_prefix = (grams[..., :-1] == tail[:, None, :]).all(-1)  # (B, W)
    in_scope = torch.arange(grams.shape[1], device=input_ids.device) >= start[:, None]
    tail_in_scope = (length - n + 1 >= start)[:, None]
    hit = same_prefix & in_scope & tail_in_scope
    return _token_set(torch.where(hit, grams[..., -1], vocab), vocab)


# Where a sentence of a turn ends, for the forms its words can take in a reply.
_TURN_SENTENCE_END = re.compile(r"(?<=[.!?\u2026])\s+")


def turn_ngrams(tokenizer: Any, texts: Sequence[str], n: int) -> torch.Tensor:
    """``(K, n)`` every run of ``n`` token ids in ``texts`` as a reply could spell them:
    each text and each of its sentences encoded alone and after a space (a word opens a
    reply without one and a later sentence with one, and byte-level tokenizers spell the
    two differently); sorted, without repeats."""
    grams = set()
    for text in texts:
        for piece in (text, *_TURN_SENTENCE_END.split(text.strip())):
            piece = piece.strip()
            for form in (piece, " " + piece):
                ids = tokenizer.encode(form, add_special_tokens=False)
                grams.update(tuple(ids[i:i + n]) for i in range(len(ids) - n + 1))
    return torch.tensor(sorted(grams), dtype=torch.long).view(-1, n)


class ListenerEchoBlock(LogitsProcessor):
    """The reply does not repeat a run of ``n`` tokens of what the listener (the avatar
    itself) said earlier in the dialogue.

    Why: a core that learned to answer one listener turn at a time often answers a later
    turn with its earlier one (asked "How are you holding up?", it asks it again after
    the speaker answered). The n-gram block of :class:`ReplyRepetitionControl` sees only
    the reply, so this one blocks, in the reply, a token that would complete one of each
    row's ``grams``: the n-grams of that row's listener turns (:func:`turn_ngrams`).

    Args:
        markers: token id sequences that end the text before the reply.
        grams: one ``(K_b, n)`` tensor per row (``K_b`` may be 0), in batch order.
        protected: token ids never blocked (the end of text, the signal tokens).
    """

    def __init__(self, markers: Sequence[Sequence[int]], grams: Sequence[torch.Tensor], protected: Sequence[int] = ()):
        sizes = {int(g.shape[1]) for g in grams if g.numel()}
        if len(sizes) > 1 or (sizes and min(sizes) < 2):
            raise ValueError(f"every row's n-grams must have one length of at least 2, got {sorted(sizes)}")
        self.markers = _marker_tensors(markers)
        self.n = sizes.pop() if sizes else 0
        width = max((int(g.shape[0]) for g in grams if g.numel()), default=0)
        self.grams = torch.full((len(grams), width, max(self.n, 1)), -1, dtype=torch.long)  # (B, K, n), -1 pads
        for row, g in enumerate(grams):
            if g.numel():
                self.grams[row, :g.shape[0]] = g
        self.protected = torch.as_tensor(sorted(set(int(i) for i in protected)), dtype=torch.long)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        rows, length = input_ids.shape
        if self.n == 0 or length < self.n - 1:
            return scores
        if rows != self.grams.shape[0]:
            raise ValueError(f"ListenerEchoBlock holds n-grams for {self.grams.shape[0]} rows, got {rows}")
        device, vocab = scores.device, scores.shape[-1]
        if self.grams.device != device:
            self.grams = self.grams.to(device)
        # The n - 1 tokens the next one would follow, all of them in the reply.
        tail_in_reply = length - self.n + 1 >= reply_starts(input_ids, self.markers)  # (B,)
        if not bool(tail_in_reply.any()):
            return scores
        tail = input_ids[:, length - self.n + 1:]  # (B, n - 1)
        hit = (self.grams[..., :-1] == tail[:, None, :]).all(-1) & (self.grams[..., -1] >= 0)  # (B, K)
        hit &= tail_in_reply[:, None]
        banned = _token_set(torch.where(hit, self.grams[..., -1], vocab), vocab)
        banned[:, self.protected.to(device)] = False
        return scores.masked_fill(banned, float("-inf"))


class ReplyRestart(LogitsProcessor):
    """Writes each row again as an earlier generation did up to a point, then makes it
    take another token there: row ``b`` is held to ``forced[b]`` (its first tokens, one per
    step) and, at the step right after them, may not write any of ``banned[b]``; a row
    whose ``forced`` is ``None`` passes unchanged.

    Why: an answer that repeats the listener's earlier turn
    (:meth:`~empatheia.modeling.Empatheia.generate_text` with
    ``language_model.listener_echo_restarts``) is written again from where the copy
    began, with the copy's first token refused there. Unlike a block on the copy's n-th
    token (:class:`ListenerEchoBlock`), which cuts a phrase the model has already
    committed to, the model chooses its words again from a clean point. With nothing
    refused it holds a reply written again for another prompt
    (``language_model.listener_echo_reanswer``) to the chain the first one wrote.

    Args:
        forced: one 1-D tensor of token ids (may be empty) or ``None`` per row.
        banned: one 1-D tensor of token ids per row refused at step ``len(forced[b])``.
    """

    def __init__(self, forced: Sequence[Optional[torch.Tensor]], banned: Sequence[Optional[torch.Tensor]]):
        if len(forced) != len(banned):
            raise ValueError(f"ReplyRestart needs one banned set per forced row: {len(forced)} and {len(banned)}")
        self.lengths = torch.tensor([-1 if f is None else int(f.numel()) for f in forced], dtype=torch.long)  # (B,)
        width = max(int(self.lengths.max()) if len(forced) else 0, 1)
        self.forced = torch.zeros(len(forced), width, dtype=torch.long)  # (B, F), read below each row's length
        for row, f in enumerate(forced):
            if f is not None and f.numel():
                self.forced[row, :f.numel()] = f
        banned = [[] if b is None else torch.as_tensor(b, dtype=torch.long).flatten().tolist() for b in banned]
        self.banned, _ = _padded([b or [-1] for b in banned])  # (B, K), -1 pads

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        rows, step = input_ids.shape
        if rows != self.lengths.numel():
            raise ValueError(f"ReplyRestart holds {self.lengths.numel()} rows, got {rows}")
        device = scores.device
        lengths = self.lengths.to(device)
        forcing = step < lengths  # (B,)
        if bool(forcing.any()):
            token = self.forced.to(device)[:, min(step, self.forced.shape[1] - 1)]  # (B,)
            only = torch.full_like(scores, float("-inf")).scatter(1, token[:, None], 0.0)
            scores = torch.where(forcing[:, None], only, scores)
        vocab = scores.shape[-1]
        banned = self.banned.to(device)
        at_restart = (lengths == step)[:, None] & (banned >= 0)  # (B, K)
        return scores.masked_fill(_token_set(torch.where(at_restart, banned, vocab), vocab), float("-inf"))


class ChainStepNgramBlock(LogitsProcessor):
    """n-gram blocking within each step of the chain, before the reply.

    A step that loops inside one sentence ("a big ol' tom tom tom ...", "I am so sad, I am
    so sad, ...") never closes a sentence, so :class:`SentenceRepetitionBlock` cannot stop
    it, and it runs to the token budget without reaching the reply. Here a token that would
    complete an n-gram the row's current line (since its last line break) already holds
    gets a score of ``-inf``. Steps may restate each other, and the template repeats its
    own words from line to line, so the scope is one line. Once a row has written the
    reply's lead-in (``markers``) its scores pass unchanged (the reply has
    :class:`ReplyRepetitionControl`). Line breaks, which end a step, and the ``protected``
    ids (the end of text, the signal tokens) are never blocked. Put it before the
    processors that force tokens (:class:`ChainTemplate`, :class:`ChainEmotionChoice`),
    which then override it.

    Args:
        markers: token id sequences that end the text before the reply.
        no_repeat_ngram_size: ``n`` > 0.
        line_end: ``(V,)`` True for token ids that hold a line break.
        protected: token ids left alone.
    """

    def __init__(self, markers: Sequence[Sequence[int]], no_repeat_ngram_size: int, line_end: torch.Tensor,
                 protected: Sequence[int] = ()):
        if no_repeat_ngram_size <= 0:
            raise ValueError(f"no_repeat_ngram_size must be > 0 to block, got {no_repeat_ngram_size}")
        self.markers = _marker_tensors(markers)
        self.ngram = int(no_repeat_ngram_size)
        self.line_end = line_end.bool()
        self.protected = torch.as_tensor(sorted(set(int(i) for i in protected)), dtype=torch.long)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        rows, length = input_ids.shape
        if length < self.ngram:
            return scores
        device, vocab = scores.device, scores.shape[-1]
        if self.line_end.device != device:
            self.line_end = self.line_end.to(device)
        in_chain = reply_starts(input_ids, self.markers) >= length  # (B,)
        if not bool(in_chain.any()):
            return scores
        banned = repeated_ngram_tokens(input_ids, line_starts(input_ids, self.line_end), self.ngram, vocab)
        banned[:, self.protected.to(device)] = False
        width = min(vocab, self.line_end.numel())
        banned[:, :width] &= ~self.line_end[:width]
        return scores.masked_fill(banned & in_chain[:, None], float("-inf"))


def token_texts(tokenizer: Any, count: int) -> List[str]:
    """The text of each of the first ``count`` token ids, decoded alone.

    One ``decode`` call over all ids, each followed by a special token that splits them
    again, rather than one call per id: a 49 k-token vocabulary decodes in a fraction of
    the seconds ``batch_decode`` takes. Special and added tokens (whose text may hold the
    separator) are decoded one by one."""
    separator = tokenizer.eos_token
    apart = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    plain = [i for i in range(count) if i not in apart]
    texts: List[Optional[str]] = [None] * count
    if separator and tokenizer.eos_token_id is not None and plain:
        joined = [x for i in plain for x in (i, tokenizer.eos_token_id)]
        pieces = tokenizer.decode(joined, skip_special_tokens=False, clean_up_tokenization_spaces=False).split(separator)
        if len(pieces) == len(plain) + 1:
            for i, piece in zip(plain, pieces):
                texts[i] = piece
    missing = [i for i in range(count) if texts[i] is None]
    for i, text in zip(missing, tokenizer.batch_decode([[i] for i in missing], clean_up_tokenization_spaces=False)):
        texts[i] = text
    return texts


def sentence_token_classes(tokenizer: Any, vocab: int):
    """``(word, sentence_end, clause_end, line_end)``, each ``(vocab,)`` bool: which token
    ids carry a word character, which carry none but close a sentence (``.``, ``!``,
    ``?``, ``…``), which carry none but a colon, and which hold a line break; how
    :class:`SentenceRepetitionBlock` reads the text. Ids past the tokenizer's are none of
    these."""
    texts = token_texts(tokenizer, min(len(tokenizer), vocab))
    pad = [False] * (vocab - len(texts))
    word = [_WORD.search(text) is not None for text in texts]
    sentence_end = [not w and _CLOSE.search(text) is not None for w, text in zip(word, texts)]
    clause_end = [not w and not e and ":" in text for w, e, text in zip(word, sentence_end, texts)]
    line_end = ["\n" in text for text in texts]
    return tuple(torch.tensor(mask + pad, dtype=torch.bool) for mask in (word, sentence_end, clause_end, line_end))


class SentenceRepetitionBlock(LogitsProcessor):
    """No sentence said twice: not in the reply, nor within one step of the chain.

    A sentence is the words between two sentence ends (or line breaks); it is compared by
    its word tokens alone, so white space and punctuation inside it do not make it new
    ("Congratulations!  Congratulations!" repeats, though no 3-gram of its tokens does).
    When the sentence a row is writing equals an earlier one of its scope, every token
    that would close it (a sentence end, a line break, the ``closing`` ids: the end of text
    and the signal tokens) is blocked, so the row has to go on and make it a different
    sentence. The scope is the reply once the row has written the lead-in before it
    (``markers``), and until then the chain's current line: the chain's steps may restate
    each other (the cause quotes the event), but a step that says one thing twice is a
    loop that would never reach the reply. A colon also ends a sentence, without being
    blocked itself, so a step's first sentence is told apart from its lead-in
    (``...is: I lost it. I lost it`` repeats).

    Sentences are compared by a polynomial hash of their word tokens' ids and by their
    length in words, all in tensor operations over ``(B, T)``.

    Args:
        markers: token id sequences that end the text before the reply.
        word, sentence_end, clause_end, line_end: ``(V,)`` masks of
            :func:`sentence_token_classes`.
        closing: token ids that end the text (blocked like a sentence end).
    """

    _MODULUS = 2_147_483_647  # 2**31 - 1, so id * power stays well inside int64
    _BASE = 1_000_003

    def __init__(self, markers: Sequence[Sequence[int]], word: torch.Tensor, sentence_end: torch.Tensor,
                 clause_end: torch.Tensor, line_end: torch.Tensor, closing: Sequence[int] = ()):
        self.markers = _marker_tensors(markers)
        self.word, self.line_end = word.bool(), line_end.bool()
        self.close = sentence_end.bool() | self.line_end
        self.boundary = self.close | clause_end.bool()
        self.close[torch.as_tensor(list(closing), dtype=torch.long)] = True
        self.powers = torch.ones(1, dtype=torch.long)

    def _powers(self, length: int, device) -> torch.Tensor:
        while self.powers.numel() < length:
            self.powers = torch.cat([self.powers, self.powers * pow(self._BASE, self.powers.numel(), self._MODULUS)
                                     % self._MODULUS])
        return self.powers[:length].to(device)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        rows, length = input_ids.shape
        if length == 0:
            return scores
        device = input_ids.device
        if self.word.device != device:
            self.word, self.line_end = self.word.to(device), self.line_end.to(device)
            self.boundary, self.close = self.boundary.to(device), self.close.to(device)
        reply = reply_starts(input_ids, self.markers)  # (B,)
        start = torch.where(reply < length, reply, line_starts(input_ids, self.line_end))  # (B,) each row's scope
        in_scope = torch.arange(length, device=device) >= start[:, None]  # (B, T)
        boundary = self.boundary[input_ids] & in_scope
        word = self.word[input_ids] & in_scope
        # The sentence each token belongs to (a boundary to the one it closes), the one being
        # written, and each word's place in its sentence.
        closed = boundary.long().cumsum(1)
        sentence = closed - boundary.long()  # (B, T)
        current = closed[:, -1]  # (B,)
        words = word.long().cumsum(1)
        before = torch.where(boundary, words, 0).cummax(1).values  # words of the sentences closed so far
        place = (words - 1 - before).clamp(min=0)
        term = torch.where(word, (input_ids + 1) * self._powers(length, device)[place] % self._MODULUS, 0)
        hashes = torch.zeros(rows, length + 1, dtype=torch.long, device=device).scatter_add_(1, sentence, term)
        hashes = hashes % self._MODULUS
        sizes = torch.zeros(rows, length + 1, dtype=torch.long, device=device).scatter_add_(1, sentence, word.long())
        now_hash, now_size = hashes.gather(1, current[:, None]), sizes.gather(1, current[:, None])  # (B, 1)
        earlier = torch.arange(length + 1, device=device) < current[:, None]
        repeats = ((hashes == now_hash) & (sizes == now_size) & earlier).any(1) & (now_size[:, 0] > 0)  # (B,)
        if not bool(repeats.any()):
            return scores
        close = self.close
        if close.numel() < scores.shape[-1]:
            close = torch.cat([close, close.new_zeros(scores.shape[-1] - close.numel())])
        return scores.masked_fill(repeats[:, None] & close[None, :], float("-inf"))


_HASH_MASK = 0xFFFFFFFF
_HASH_MULTIPLIER = 0x45D9F3B


def mix32(x):
    """A 32-bit integer hash (two multiply-xorshift rounds) of ``x``, a whole number or an
    int64 tensor of whole numbers in ``[0, 2**32)``; the product stays below ``2**59``,
    inside int64, and Python ints and tensors give the same values."""
    x = ((x >> 16) ^ x) * _HASH_MULTIPLIER & _HASH_MASK
    x = ((x >> 16) ^ x) * _HASH_MULTIPLIER & _HASH_MASK
    return (x >> 16) ^ x


def prompt_keys(prompts: Sequence[Sequence[int]]) -> List[int]:
    """One 32-bit key per prompt (its token ids), what :class:`SeededSampling` draws by: the
    same prompt gets the same key in any batch."""
    return [int.from_bytes(hashlib.blake2b(str(list(ids)).encode(), digest_size=4).digest(), "little")
            for ids in prompts]


class SeededSampling(LogitsProcessor):
    """Temperature and nucleus (top-p) sampling whose draws depend only on the seed, the
    row's key and the step.

    Each step it draws one token per row from ``softmax(scores / temperature)``, cut to
    the smallest set of tokens whose probability reaches ``top_p`` (the most probable
    token always stays), and returns scores that are ``-inf`` everywhere but at the drawn
    token; ``generate`` then runs greedy, which picks it. Row ``b``'s draw at step ``t``
    inverts its distribution's cumulative sum at a uniform number hashed from ``(seed,
    keys[b], t)`` (:func:`mix32`), not drawn from a shared generator: with each dialogue's
    own key (:func:`prompt_keys`) a dialogue gets the same answer for a seed whatever batch
    it is answered in and whatever the other rows write, and no global RNG is read or
    moved. ``seed`` ``None`` takes one from the operating system; ``keys`` ``None`` gives
    every row key 0. With ``reply_only`` (the reply's lead-in markers,
    :func:`reply_markers`) a row's scores pass unchanged until it has written one of
    them, so the text before the reply is written greedily and every reply token, the
    first included, is drawn.
    """

    def __init__(self, temperature: float = 1.0, top_p: float = 1.0, seed: Optional[int] = None,
                 reply_only: Optional[Sequence[Sequence[int]]] = None, keys: Optional[Sequence[int]] = None):
        self.temperature, self.top_p, self.seed = float(temperature), float(top_p), seed
        if seed is None:
            seed = secrets.randbits(63)
        # The seed's 64 bits folded into one 32-bit word.
        self.seed_word = mix32(mix32(seed & _HASH_MASK) ^ ((seed >> 32) & _HASH_MASK))
        self.keys = None if keys is None else torch.as_tensor([int(k) & _HASH_MASK for k in keys], dtype=torch.long)
        self.step = 0
        self.markers = None if reply_only is None else _marker_tensors(reply_only)

    def uniforms(self, rows: int, device) -> torch.Tensor:
        """``(rows,)`` this step's uniform numbers in ``[0, 1)``, one per row."""
        keys = torch.zeros(rows, dtype=torch.long) if self.keys is None else self.keys
        if keys.numel() != rows:
            raise ValueError(f"SeededSampling has {keys.numel()} row keys for a batch of {rows} rows")
        step_word = mix32((self.seed_word ^ mix32(self.step & _HASH_MASK)) & _HASH_MASK)
        words = mix32(mix32(keys ^ step_word) ^ self.seed_word)
        return (words.double() / 2.0**32).to(device)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        probs = (scores.double() / self.temperature).softmax(-1)  # (B, V)
        if self.top_p < 1.0:
            ranked, order = probs.sort(-1, descending=True)
            before = ranked.cumsum(-1) - ranked  # mass of the tokens ranked above each
            keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before < self.top_p)
            probs = probs.masked_fill(~keep, 0.0)
        cumulative = probs.cumsum(-1)  # (B, V)
        targets = self.uniforms(scores.shape[0], scores.device) * cumulative[:, -1]  # (B,) below each row's total
        drawn = torch.searchsorted(cumulative, targets[:, None], right=True).clamp(max=scores.shape[-1] - 1)
        self.step += 1
        chosen = torch.full_like(scores, float("-inf")).scatter(-1, drawn, 0.0)
        if self.markers is None:
            return chosen
        # A lead-in just written counts: the reply's first token is drawn too.
        in_reply = reply_lengths(input_ids, self.markers) >= 0  # (B,)
        return torch.where(in_reply.to(scores.device)[:, None], chosen, scores)


def _token_set(ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """``(B, V)`` True at each id of ``ids`` ``(B, K)``; the id ``vocab`` marks an empty
    slot. Every duplicate writes the same True, so the result is deterministic."""
    found = torch.zeros(ids.shape[0], vocab + 1, dtype=torch.bool, device=ids.device)
    return found.scatter_(1, ids, True)[:, :vocab]


class GenericReplyPenalty(LogitsProcessor):
    """Mutual-information decoding of the reply's first tokens: each candidate's
    log-probability given the dialogue minus ``weight`` times its log-probability given no
    dialogue at all, so that what the model would say to anyone ("I'm so sorry to hear
    that.") loses to what it says to this speaker.

    This is the anti-language-model objective of Li et al. (2016, "A diversity-promoting
    objective function for neural conversation models"), log p(T|S) - lambda log p(T),
    with the penalty on the first ``tokens`` tokens of the reply only: that is where an
    answer becomes generic, and where the penalty does not yet cost grammar. Only tokens
    whose probability given the dialogue is at least ``plausibility`` times the best one's
    compete (the plausibility constraint of contrastive decoding, Li et al., 2023), so a
    token is never chosen for being rare everywhere. ``protected`` tokens (the end of text,
    the signal tokens) keep their score given the dialogue: an empty reply is never
    rewarded for being unlikely without one.

    Args:
        context_free: called with the reply tokens written so far ``(n, w)`` (right-padded),
            their counts ``(n,)`` and ``rows``, the batch rows they belong to ``(n,)``,
            returns the next token's log-probabilities given no dialogue ``(n, V')``,
            ``V' >= V`` (:class:`~empatheia.modeling.ContextFreeScorer`; given only the
            listener's turns, :class:`~empatheia.modeling.ListenerTurnScorer`).
        markers: token id sequences that end the text before the reply.
        weight: ``lambda`` > 0.
        tokens: how many of the reply's first tokens are chosen this way.
        plausibility: ``alpha`` in (0, 1].
        protected: token ids left alone.
    """

    def __init__(self, context_free: Any, markers: Sequence[Sequence[int]], weight: float, tokens: int,
                 plausibility: float = 0.1, protected: Sequence[int] = ()):
        if not weight > 0 or tokens < 1 or not 0 < plausibility <= 1:
            raise ValueError(f"GenericReplyPenalty needs weight > 0, tokens >= 1 and plausibility in (0, 1], "
                             f"got {weight}, {tokens}, {plausibility}")
        self.context_free = context_free
        self.markers = _marker_tensors(markers)
        self.weight = float(weight)
        self.tokens = int(tokens)
        self.log_plausibility = math.log(plausibility)
        self.protected = torch.as_tensor(sorted(set(int(i) for i in protected)), dtype=torch.long)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        length, device = input_ids.shape[1], input_ids.device
        written = reply_lengths(input_ids, self.markers)  # (B,) -1 before the reply
        start = length - written
        active = ((written >= 0) & (written < self.tokens)).nonzero().squeeze(1)  # (n,)
        if active.numel() == 0:
            return scores
        count = written[active]  # (n,)
        offsets = torch.arange(max(int(count.max()), 1), device=device)
        valid = offsets[None, :] < count[:, None]  # (n, w)
        positions = (start[active, None] + offsets[None, :]).clamp(max=length - 1)
        reply = torch.where(valid, input_ids[active[:, None], positions], 0)  # (n, w)
        free = self.context_free(reply, count, rows=active)[:, : scores.shape[-1]].float()  # (n, V)
        given = torch.log_softmax(scores[active].float(), dim=-1)  # (n, V)
        plausible = given >= given.max(-1, keepdim=True).values + self.log_plausibility
        mixed = torch.where(plausible, given - self.weight * free, float("-inf"))
        protected = self.protected.to(device)
        mixed[:, protected] = given[:, protected]
        scores = scores.clone()
        scores[active] = mixed.to(scores.dtype)
        return scores
