"""Prompt texts of the four stages (Appendix D.1) and the Chain-of-Empathy format.

The wording of the instruction is this project's own; the structure follows the paper:
a dialogue context in which each turn may carry ``<Aud>``/``<Vid>`` placeholders, and a
target that walks through the four reasoning steps before the response. Step labels are
kept fixed so a generated chain can be parsed back into its fields.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any, Dict, List, Optional, Protocol, Sequence, Tuple

AUDIO_PLACEHOLDER = "<Aud>"
VIDEO_PLACEHOLDER = "<Vid>"
"""Where a turn's projected speech / video features enter the prompt (one token per
feature row)."""


def audio_signal_tokens(n: int) -> List[str]:
    """The ``<AUD1..n>`` signal tokens that the language model writes for the speech."""
    return [f"<AUD{i}>" for i in range(1, n + 1)]


def video_signal_tokens(n: int) -> List[str]:
    """The ``<VID1..n>`` signal tokens that the language model writes for the video."""
    return [f"<VID{i}>" for i in range(1, n + 1)]


ROLE_NAMES = {"speaker": "Speaker", "listener": "Listener"}

SYSTEM_PROMPT = (
    "You are an empathetic conversational partner. Before you answer, work out what the "
    "user is going through and how they feel, then reply in a way that makes them feel "
    "heard and supported. Think in order: (1) the event scenario behind the dialogue; "
    "(2) the speaker's emotion, both stated and implied; (3) the cause of that emotion; "
    "(4) the goal of your reply, such as easing worry, reassuring or showing understanding; "
    "(5) the reply itself, which should follow from the first four steps."
)

TEXT_TASK = "Give an empathetic reply to the dialogue below. Reason through the steps one at a time before replying."
STYLE_TASK = "Give a multimodal empathetic reply to the dialogue below."
FULL_TASK = (
    "Give a multimodal empathetic reply to the dialogue below. "
    "Reason through the steps one at a time before replying."
)

# The pipeline baseline (Appendix E.2) has no Chain of Empathy: its instruction asks for
# the explicit meta-response that drives the generators, then the reply.
PIPELINE_SYSTEM_PROMPT = (
    "You are an empathetic conversational partner. Reply in a way that makes the user feel heard and supported."
)
PIPELINE_TASK = (
    "Give an empathetic reply to the dialogue below. First write the speaker's emotion and, "
    "when you know it, your own profile; then the reply."
)


# MERIA's M-CoE LLM (shared/papers/000, §3.3) reads the dialogue after soft prompts of the
# user's face, voice and words, and writes what it observes in each before the chain.
MCOE_TASK = (
    "Describe what the speaker's face and voice show, with the emotion each suggests and how sure you are; "
    "then reason through the steps of the chain of empathy for the dialogue below."
)


class PromptMode(str, Enum):
    """Which input layout of Appendix D.1 a prompt uses."""

    TEXT = "text"
    """Stages 1-2: turn texts only, Chain-of-Empathy + response + signal-token target."""
    STYLE = "style"
    """Stage 3: each turn is only its ``<Aud> <Vid>`` placeholders, signal-token target."""
    FULL = "full"
    """Stage 4 and inference: texts with placeholders, chain + response + signal tokens."""
    PIPELINE = "pipeline"
    """The pipeline baseline (Appendix E.2): turn texts only, a meta-response target (the
    emotion and profile written out, then the response), no chain, no signal tokens. Early
    fusion and MERIA's Response LLM write the same target."""
    MCOE = "mcoe"
    """MERIA's M-CoE LLM: turn texts only (the media come as soft prompts), the multimodal
    chain as target (:mod:`empatheia.variants.mcoe`)."""

    @property
    def reads_text(self) -> bool:
        return self is not PromptMode.STYLE

    @property
    def reads_media(self) -> bool:
        return self in (PromptMode.STYLE, PromptMode.FULL)


@dataclass
class ChainOfEmpathy:
    """The four reasoning steps that precede a response. A field is ``None`` when the data
    (or the generated text) does not have it."""

    event_scenario: Optional[str] = None
    speaker_emotion: Optional[str] = None
    emotion_cause: Optional[str] = None
    goal_to_response: Optional[str] = None
    raw: Optional[str] = None
    """The generated text this chain was parsed from (``None`` for gold chains)."""
    parsed: bool = True
    """False when generated text did not follow the chain format; ``raw`` keeps it."""

    def to_dict(self) -> dict:
        return asdict(self)


# (field, label) in the order the steps are written.
CHAIN_STEPS: Tuple[Tuple[str, str], ...] = (
    ("event_scenario", "the event scenario of this conversation is"),
    ("speaker_emotion", "the emotion of the speaker is"),
    ("emotion_cause", "the emotion cause is"),
    ("goal_to_response", "the goal to response is"),
)
RESPONSE_LABEL = "the response is"
_ORDINALS = ("Firstly", "Secondly", "Thirdly", "Fourthly")


def chain_text(chain: Optional[ChainOfEmpathy]) -> str:
    """The target text up to the response: one line per present step, then the lead-in of
    the response line (``"Finally, the response is: "``)."""
    lines = []
    for field_name, label in CHAIN_STEPS:
        value = getattr(chain, field_name) if chain is not None else None
        if value is not None and str(value).strip():
            lines.append(f"{_ORDINALS[len(lines)]}, {label}: {str(value).strip()}")
    lead = f"Finally, {RESPONSE_LABEL}: " if lines else "The response is: "
    return "\n".join(lines + [lead])


def chain_is_complete(chain: Optional[ChainOfEmpathy]) -> bool:
    """Whether ``chain`` names all four steps of the paper's chain, each non-empty (what
    ``chain_complete_share`` counts: a model trained on two-step targets writes only the
    event and the emotion)."""
    return chain is not None and all(str(getattr(chain, name) or "").strip() for name, _ in CHAIN_STEPS)


# A step label at the start of a line, after an ordinal or not ("Thirdly, "). Its colon may
# be missing: a core trained on few steps writes it so ("the emotion of the speaker is
# surprised"), and it would otherwise end up inside the event step.
_LABEL_PATTERN = re.compile(
    r"(?:^|\n)\s*(?:\w+,\s*)?(" + "|".join(re.escape(label) for _, label in CHAIN_STEPS) + "|" + re.escape(RESPONSE_LABEL) + r")\b\s*:?",
    re.IGNORECASE,
)


def parse_chain(text: str) -> Tuple[ChainOfEmpathy, str]:
    """Split generated text into its chain fields and the response.

    Returns ``(chain, response)``. The response is the rest of the response line: a reply
    is one line, as every training target writes it, and a line break after it starts
    something else (a small core that loses its way writes the template's steps again
    there); ``chain.raw`` keeps the whole text. When there is no response line the chain
    is flagged ``parsed=False`` and the whole text, stripped, is taken as the response so
    nothing is lost.
    """
    label_to_field = {label: name for name, label in CHAIN_STEPS}
    matches = list(_LABEL_PATTERN.finditer(text))
    fields = {}
    response = None
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        value = text[match.end() : end].strip()
        label = match.group(1).lower()
        if label == RESPONSE_LABEL:
            response = value.split("\n", 1)[0].strip()
        else:
            fields[label_to_field[label]] = value or None
    if response is None or not response:
        return ChainOfEmpathy(**fields, raw=text, parsed=False), text.strip()
    return ChainOfEmpathy(**fields, raw=text, parsed=True), response


def turn_line(role: str, text: str, audio: bool, video: bool) -> str:
    media = " ".join(p for p, present in ((AUDIO_PLACEHOLDER, audio), (VIDEO_PLACEHOLDER, video)) if present)
    body = " ".join(part for part in (text.strip(), media) if part)
    return f"{ROLE_NAMES[role]}: {body}"


class TurnLike(Protocol):
    """What :func:`context_lines` reads of a turn (an :class:`empatheia.dialogue.Turn`,
    whose module imports this one)."""

    role: str
    text: str
    audio: Any
    video: Any


def context_lines(turns: Sequence[TurnLike], mode: PromptMode) -> List[str]:
    """One line per turn. In TEXT mode media are left out; in STYLE mode the text is."""
    lines = []
    for turn in turns:
        use_text, use_media = mode.reads_text, mode.reads_media
        lines.append(
            turn_line(
                turn.role,
                turn.text if use_text else "",
                audio=use_media and turn.audio is not None,
                video=use_media and turn.video is not None,
            )
        )
    return lines


def user_message(lines: List[str], mode: PromptMode, notes: Optional[str] = None) -> str:
    """The task, the dialogue's lines and, where given, ``notes`` after them (MERIA's
    Response LLM reads the multimodal chain there)."""
    task = {PromptMode.TEXT: TEXT_TASK, PromptMode.STYLE: STYLE_TASK, PromptMode.FULL: FULL_TASK,
            PromptMode.PIPELINE: PIPELINE_TASK, PromptMode.MCOE: MCOE_TASK}[mode]
    message = f"{task}\n\nDialogue context:\n" + "\n".join(lines)
    return f"{message}\n\n{notes.strip()}" if notes and notes.strip() else message


def system_prompt(mode: PromptMode) -> str:
    return PIPELINE_SYSTEM_PROMPT if mode is PromptMode.PIPELINE else SYSTEM_PROMPT


# ---------------------------------------------------------------- meta-response (E.2)
META_EMOTION, META_PROFILE, META_RESPONSE = "Emotion", "Profile", "Response"


@dataclass
class MetaResponse:
    """What the pipeline baseline writes: the speaker's emotion and the listener's profile
    explicitly, then the response. ``parsed`` is False when the text had no response line
    (then ``response`` is the whole text)."""

    emotion: Optional[str]
    profile: Dict[str, str]
    response: str
    parsed: bool = True


def meta_text(emotion: Optional[str], profile: Optional[Dict[str, str]]) -> str:
    """The target text up to the response: ``Emotion: sad``, ``Profile: age=adult,
    gender=female`` (only the attributes given; no line without any), ``Response: ``."""
    lines = []
    if emotion:
        lines.append(f"{META_EMOTION}: {emotion.strip()}")
    if profile:
        lines.append(f"{META_PROFILE}: " + ", ".join(f"{k}={v}" for k, v in sorted(profile.items())))
    return "\n".join(lines + [f"{META_RESPONSE}: "])


_META_PATTERN = re.compile(
    r"(?:^|\n)\s*(" + "|".join((META_EMOTION, META_PROFILE, META_RESPONSE)) + r")\s*:", re.IGNORECASE
)


def parse_meta(text: str) -> MetaResponse:
    """Split a generated meta-response into its emotion, profile and response. A profile
    item without ``=`` is ignored; nothing else is."""
    matches = list(_META_PATTERN.finditer(text))
    values: Dict[str, str] = {}
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        values.setdefault(match.group(1).lower(), text[match.end() : end].strip())
    profile = {}
    for item in values.get(META_PROFILE.lower(), "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip() and value.strip():
            profile[key.strip()] = value.strip()
    emotion = values.get(META_EMOTION.lower()) or None
    if emotion:
        emotion = emotion.splitlines()[0].strip().rstrip(".").lower() or None
    response = values.get(META_RESPONSE.lower())
    if not response:
        return MetaResponse(emotion, profile, text.strip(), parsed=False)
    return MetaResponse(emotion, profile, response)
