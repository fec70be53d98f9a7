"""How the language model picks its tokens: greedy or sampled, and how a reply is kept from
repeating itself.

A :class:`Decoding` holds one call's settings. Its repetition control (n-gram blocking and
a repetition penalty) reaches the reply: the tokens after the lead-in that starts it
(``the response is:`` after a Chain of Empathy, ``Response:`` after the pipeline's
meta-response). n-gram blocking also holds within each line before it, one step of the
chain at a time: the chain's template repeats its own words from step to step by design
("the emotion of the speaker is", "the emotion cause is"), but a step that repeats itself
is a loop that never reaches the reply. The signal tokens and the end of text stay
reachable whatever was written before them. Where a setting is left ``None`` the model
config's ``language_model.no_repeat_ngram_size`` / ``repetition_penalty`` applies
(:meth:`Decoding.resolved`).

This module imports no torch, so the command line builds its options from it without
loading the model libraries; the logits processors that apply the settings during
generation are :mod:`empatheia.logits_processors`.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Optional

from .config import check_generic_reply_penalty, check_no_repeat_ngram_size, check_repetition_penalty, check_sampling


@dataclass(frozen=True)
class Decoding:
    """One generation's decoding settings; ``None`` leaves a setting to the model config's
    ``language_model`` section (:meth:`resolved`).

    With ``do_sample`` tokens are drawn from the ``temperature``-scaled distribution cut
    to its top-``top_p`` mass, by numbers hashed from ``seed`` (``None`` in the config
    too: fresh randomness), the dialogue and the step, so the caller's global RNG is never
    read or moved and the same seed and dialogue give the same answer in any batch.
    ``sample_chain`` False draws the reply's tokens only and writes the Chain of Empathy
    greedily: the chain is the model's reading of the dialogue, the reply its choice of
    words. Without ``do_sample`` every token is the likeliest (greedy).

    ``no_repeat_ngram_size`` ``n`` > 0 forbids a reply token that would complete an n-gram
    (of the language model's tokens) the reply already holds, and a chain token that would
    complete one its step (its line) already holds; ``repetition_penalty`` ``p``
    divides the positive logits of tokens the reply already holds by ``p`` and multiplies
    the negative ones by ``p`` (CTRL's penalty; > 1 discourages, 1 is off);
    ``block_repeated_sentences`` keeps the reply, and each step of the chain, from closing
    a sentence it already said (n-gram blocking misses short ones: "Congratulations!
    Congratulations!"); ``generic_reply_penalty`` ``lambda`` > 0 chooses the reply's first
    tokens by their log-probability given the dialogue minus ``lambda`` times that given no
    dialogue, so that openings the model would write to anyone give way to ones it writes
    to this speaker (:class:`~empatheia.logits_processors.GenericReplyPenalty`)."""

    do_sample: Optional[bool] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    seed: Optional[int] = None
    no_repeat_ngram_size: Optional[int] = None
    repetition_penalty: Optional[float] = None
    block_repeated_sentences: Optional[bool] = None
    sample_chain: Optional[bool] = None
    generic_reply_penalty: Optional[float] = None

    def __post_init__(self):
        check_sampling(self.temperature, self.top_p, self.seed)
        if self.no_repeat_ngram_size is not None:
            check_no_repeat_ngram_size(self.no_repeat_ngram_size)
        if self.repetition_penalty is not None:
            check_repetition_penalty(self.repetition_penalty)
        if self.generic_reply_penalty is not None:
            check_generic_reply_penalty(self.generic_reply_penalty)
        for name in ("do_sample", "block_repeated_sentences", "sample_chain"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, got {value!r}")

    def resolved(self, language_model: Any) -> "Decoding":
        """These settings with each ``None`` filled in from ``language_model`` (a
        :class:`~empatheia.config.LanguageModelConfig`); the seed stays ``None`` where the
        config has none."""
        return dataclasses.replace(self, **{
            field.name: getattr(language_model, field.name) if getattr(self, field.name) is None else getattr(self, field.name)
            for field in dataclasses.fields(self)
        })

    @property
    def controls_repetition(self) -> bool:
        return bool(self.no_repeat_ngram_size) or (self.repetition_penalty or 1.0) != 1.0

    def kwargs(self) -> Dict[str, Any]:
        """The keyword arguments of ``respond`` / ``respond_in_stages`` that say the same."""
        return dataclasses.asdict(self)

    def record(self) -> Dict[str, Any]:
        """What a run records of its decoding (``run.json``, ``metrics.json``): the
        repetition control, and the sampling settings only when sampling (greedy
        decoding reads none of them). On unresolved settings ``None`` stands for the
        config's value."""
        out: Dict[str, Any] = {"do_sample": self.do_sample}
        if self.do_sample is not False:
            out.update(temperature=self.temperature, top_p=self.top_p, seed=self.seed, sample_chain=self.sample_chain)
        penalty = self.repetition_penalty
        out.update(no_repeat_ngram_size=self.no_repeat_ngram_size,
                   repetition_penalty=None if penalty is None else float(penalty),
                   block_repeated_sentences=self.block_repeated_sentences)
        generic = self.generic_reply_penalty
        out["generic_reply_penalty"] = None if generic is None else float(generic)
        return out


GREEDY_RECORD: Dict[str, Any] = {"do_sample": False, "no_repeat_ngram_size": 0, "repetition_penalty": 1.0,
                                 "block_repeated_sentences": False, "generic_reply_penalty": 0.0}
""":meth:`Decoding.record` of plain greedy decoding, what every run made before the
settings existed used."""


# ---------------------------------------------------------------------- command line
_SAMPLING_FLAGS = (("temperature", "--temperature"), ("top_p", "--top-p"), ("seed", "--seed"))
_MODE_FLAGS = {"greedy": "--greedy", "all": "--sample", "reply": "--sample-reply"}
_MODES = {"greedy": {"do_sample": False}, "all": {"do_sample": True, "sample_chain": True},
          "reply": {"do_sample": True, "sample_chain": False}}


def add_decoding_arguments(parser) -> None:
    """``--greedy`` / ``--sample`` / ``--sample-reply``, ``--temperature``, ``--top-p``,
    ``--seed``, ``--no-repeat-ngram``, ``--repetition-penalty`` and
    ``--block-repeated-sentences`` / ``--allow-repeated-sentences`` (on a parser or an
    argument group); :func:`decoding_from_args` reads them. Each left out is the model
    config's ``language_model`` setting."""
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--greedy", dest="decoding_mode", action="store_const", const="greedy", default=None,
                       help="write the likeliest token every step (default: language_model.do_sample)")
    modes.add_argument("--sample", dest="decoding_mode", action="store_const", const="all",
                       help="draw every token, the chain's and the reply's")
    modes.add_argument("--sample-reply", dest="decoding_mode", action="store_const", const="reply",
                       help="write the chain greedily and draw the reply's tokens")
    parser.add_argument("--temperature", type=float, default=None,
                        help="when sampling: softmax temperature (default: language_model.temperature)")
    parser.add_argument("--top-p", type=float, default=None,
                        help="when sampling: draw from the smallest set of tokens holding this much probability "
                             "(default: language_model.top_p)")
    parser.add_argument("--seed", type=int, default=None,
                        help="when sampling: seed of the draws; the same seed gives the same answer "
                             "(default: language_model.seed, else random)")
    parser.add_argument("--no-repeat-ngram", type=int, default=None, metavar="N",
                        help="neither the reply nor a step of the chain repeats a run of N tokens; 0 turns it off "
                             "(default: language_model.no_repeat_ngram_size)")
    parser.add_argument("--repetition-penalty", type=float, default=None, metavar="X",
                        help="divide the scores of tokens the reply already holds by X (> 1 discourages repeats; 1 is "
                             "off; default: language_model.repetition_penalty)")
    parser.add_argument("--generic-penalty", dest="generic_reply_penalty", type=float, default=None, metavar="X",
                        help="choose the reply's first tokens by their log-probability given the dialogue minus X "
                             "times that given none, against answers that fit anyone; 0 is off (default: "
                             "language_model.generic_reply_penalty)")
    sentences = parser.add_mutually_exclusive_group()
    sentences.add_argument("--block-repeated-sentences", dest="block_repeated_sentences", action="store_const",
                           const=True, default=None,
                           help="neither the reply nor a step of the chain says one sentence twice (default: "
                                "language_model.block_repeated_sentences)")
    sentences.add_argument("--allow-repeated-sentences", dest="block_repeated_sentences", action="store_const",
                           const=False, help="turn that block off")


def decoding_given(args: argparse.Namespace) -> list:
    """The decoding flags given on the command line (``["--sample", "--seed"]``)."""
    mode = getattr(args, "decoding_mode", None)
    given = [_MODE_FLAGS[mode]] if mode else []
    names = _SAMPLING_FLAGS + (("no_repeat_ngram", "--no-repeat-ngram"), ("repetition_penalty", "--repetition-penalty"),
                               ("generic_reply_penalty", "--generic-penalty"))
    given += [flag for name, flag in names if getattr(args, name, None) is not None]
    block = getattr(args, "block_repeated_sentences", None)
    if block is not None:
        given.append("--block-repeated-sentences" if block else "--allow-repeated-sentences")
    return given


def decoding_from_args(args: argparse.Namespace) -> Decoding:
    """The :class:`Decoding` of :func:`add_decoding_arguments`' flags. A sampling flag
    with ``--greedy``, or without ``--sample`` / ``--sample-reply`` (the config decides
    whether to sample, and a seed it might ignore would be lost), or a value out of range
    is a ``SystemExit`` naming the flag."""
    mode = getattr(args, "decoding_mode", None)
    if mode in (None, "greedy"):
        stray = [flag for name, flag in _SAMPLING_FLAGS if getattr(args, name) is not None]
        if stray:
            raise SystemExit(f"error: {', '.join(stray)} only apply with --sample or --sample-reply "
                             f"(greedy decoding draws nothing)")
    values = {
        **(_MODES[mode] if mode else {}),
        "temperature": args.temperature,
        "top_p": args.top_p,
        "seed": args.seed,
        "no_repeat_ngram_size": args.no_repeat_ngram,
        "repetition_penalty": args.repetition_penalty,
        "block_repeated_sentences": getattr(args, "block_repeated_sentences", None),
        "generic_reply_penalty": getattr(args, "generic_reply_penalty", None),
    }
    flags = dict(_SAMPLING_FLAGS, no_repeat_ngram_size="--no-repeat-ngram", repetition_penalty="--repetition-penalty",
                 generic_reply_penalty="--generic-penalty")
    for name, value in values.items():
        if name not in flags or value is None:
            continue
        try:
            Decoding(**{name: value})
        except ValueError as error:
            raise SystemExit(f"error: {flags[name]}: {error}") from None
    return Decoding(**{k: v for k, v in values.items() if v is not None})
