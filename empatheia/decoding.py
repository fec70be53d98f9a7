"""How the language model picks its tokens: greedy or sampled, and how a reply is kept from
repeating itself.

A :class:`Decoding` holds one call's settings. Its repetition control (n-gram blocking and
a repetition penalty) reaches only the reply: the tokens after the lead-in that starts it
(``the response is:`` after a Chain of Empathy, ``Response:`` after the pipeline's
meta-response). The chain's template repeats its own words by design ("the emotion of the
speaker is", "the emotion cause is"), and the signal tokens and the end of text must stay
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
import math
from dataclasses import dataclass
from typing import Any, Dict, Optional

from .config import check_no_repeat_ngram_size, check_repetition_penalty

MAX_SEED = 2**63 - 1
"""Largest seed a ``torch.Generator`` takes as given (``manual_seed``)."""


@dataclass(frozen=True)
class Decoding:
    """One generation's decoding settings.

    Greedy by default. With ``do_sample`` every token (chain and reply) is drawn from the
    ``temperature``-scaled distribution cut to its top-``top_p`` mass, with a generator of
    its own seeded by ``seed`` (``None``: fresh randomness), so the caller's global RNG is
    never read or moved; the same seed, dialogues and batching give the same answers.

    ``no_repeat_ngram_size`` ``n`` > 0 forbids a reply token that would complete an n-gram
    (of the language model's tokens) the reply already holds; ``repetition_penalty`` ``p``
    divides the positive logits of tokens the reply already holds by ``p`` and multiplies
    the negative ones by ``p`` (CTRL's penalty; > 1 discourages, 1 is off). ``None`` leaves
    either to the model config."""

    do_sample: bool = False
    temperature: float = 0.7
    top_p: float = 0.9
    seed: Optional[int] = None
    no_repeat_ngram_size: Optional[int] = None
    repetition_penalty: Optional[float] = None

    def __post_init__(self):
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature must be a positive number, got {self.temperature!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and not (isinstance(self.seed, int) and 0 <= self.seed <= MAX_SEED):
            raise ValueError(f"seed must be a whole number from 0 to {MAX_SEED}, got {self.seed!r}")
        if self.no_repeat_ngram_size is not None:
            check_no_repeat_ngram_size(self.no_repeat_ngram_size)
        if self.repetition_penalty is not None:
            check_repetition_penalty(self.repetition_penalty)

    def resolved(self, language_model: Any) -> "Decoding":
        """These settings with the repetition control's ``None`` filled in from
        ``language_model`` (a :class:`~empatheia.config.LanguageModelConfig`)."""
        return dataclasses.replace(
            self,
            no_repeat_ngram_size=(language_model.no_repeat_ngram_size if self.no_repeat_ngram_size is None
                                  else self.no_repeat_ngram_size),
            repetition_penalty=(language_model.repetition_penalty if self.repetition_penalty is None
                                else self.repetition_penalty),
        )

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
        if self.do_sample:
            out.update(temperature=self.temperature, top_p=self.top_p, seed=self.seed)
        penalty = self.repetition_penalty
        out.update(no_repeat_ngram_size=self.no_repeat_ngram_size,
                   repetition_penalty=None if penalty is None else float(penalty))
        return out


GREEDY_RECORD: Dict[str, Any] = {"do_sample": False, "no_repeat_ngram_size": 0, "repetition_penalty": 1.0}
""":meth:`Decoding.record` of plain greedy decoding, what every run made before the
settings existed used."""


# ---------------------------------------------------------------------- command line
_SAMPLING_FLAGS = (("temperature", "--temperature"), ("top_p", "--top-p"), ("seed", "--seed"))


def add_decoding_arguments(parser) -> None:
    """``--sample``, ``--temperature``, ``--top-p``, ``--seed``, ``--no-repeat-ngram`` and
    ``--repetition-penalty`` (on a parser or an argument group); :func:`decoding_from_args`
    reads them."""
    defaults = Decoding()
    parser.add_argument("--sample", action="store_true", help="sample the answer instead of greedy decoding")
    parser.add_argument("--temperature", type=float, default=None,
                        help=f"with --sample: softmax temperature (default {defaults.temperature})")
    parser.add_argument("--top-p", type=float, default=None,
                        help=f"with --sample: draw from the smallest set of tokens holding this much probability "
                             f"(default {defaults.top_p})")
    parser.add_argument("--seed", type=int, default=None,
                        help="with --sample: seed of the draws; the same seed gives the same answer (default: random)")
    parser.add_argument("--no-repeat-ngram", type=int, default=None, metavar="N",
                        help="the reply never repeats a run of N tokens; 0 turns it off "
                             "(default: the model config's language_model.no_repeat_ngram_size)")
    parser.add_argument("--repetition-penalty", type=float, default=None, metavar="X",
                        help="divide the scores of tokens the reply already holds by X (> 1 discourages repeats; 1 is "
                             "off; default: the model config's language_model.repetition_penalty)")


def decoding_given(args: argparse.Namespace) -> list:
    """The decoding flags given on the command line (``["--sample", "--seed"]``)."""
    given = ["--sample"] if getattr(args, "sample", False) else []
    names = _SAMPLING_FLAGS + (("no_repeat_ngram", "--no-repeat-ngram"), ("repetition_penalty", "--repetition-penalty"))
    return given + [flag for name, flag in names if getattr(args, name, None) is not None]


def decoding_from_args(args: argparse.Namespace) -> Decoding:
    """The :class:`Decoding` of :func:`add_decoding_arguments`' flags; a sampling flag
    without ``--sample`` or a value out of range is a ``SystemExit`` naming the flag."""
    if not args.sample:
        stray = [flag for name, flag in _SAMPLING_FLAGS if getattr(args, name) is not None]
        if stray:
            raise SystemExit(f"error: {', '.join(stray)} only apply with --sample (greedy decoding draws nothing)")
    values = {
        "do_sample": bool(args.sample),
        "temperature": args.temperature,
        "top_p": args.top_p,
        "seed": args.seed,
        "no_repeat_ngram_size": args.no_repeat_ngram,
        "repetition_penalty": args.repetition_penalty,
    }
    flags = dict(_SAMPLING_FLAGS, no_repeat_ngram_size="--no-repeat-ngram", repetition_penalty="--repetition-penalty")
    for name, value in values.items():
        if name == "do_sample" or value is None:
            continue
        try:
            Decoding(**{name: value})
        except ValueError as error:
            raise SystemExit(f"error: {flags[name]}: {error}") from None
    return Decoding(**{k: v for k, v in values.items() if v is not None})
