"""One person's conversation with the avatar, and answering one of its turns.

Shared by ``empatheia serve`` (one :class:`Conversation` per browser session) and
``empatheia chat`` (one for the terminal): the dialogue so far, the avatar that answers,
and the folder that each answered turn's files go to (``turn-<n>/``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

from ..decoding import Decoding
from ..dialogue import Dialogue, Turn
from ..response import EmpatheticResponse

BUILTIN_PROFILES = (
    {"age": "young", "gender": "female", "timbre": "mid"},
    {"age": "middle-aged", "gender": "male", "timbre": "low"},
    {"age": "elderly", "gender": "female", "timbre": "mid"},
    {"age": "young", "gender": "male", "timbre": "high"},
)
"""The avatars offered to pick from: drawn from these listener profiles by the model's
avatar registry (the same face and voice for the same profile everywhere)."""

TURN_FILES = ("response.json", "response.wav", "response.mp4", "index.html", "features.safetensors")
"""What an answered turn's folder may hold (:meth:`EmpatheticResponse.save`)."""

EMPTY_ANSWER = "..."
"""What the dialogue keeps for an answer whose text is empty (a random-weight model can
write nothing), so that turns keep alternating speaker and listener."""


@dataclass
class Conversation:
    """The dialogue so far, speaker (the user) and listener (the avatar) alternating.

    Only the last ``max_turns`` turns (an odd number, so the window starts with the
    user) go to the model, media included: a long conversation costs no more per turn
    than a short one. ``avatar`` (an :class:`empatheia.generators.base.Avatar`) is one
    the user registered; without it the model's registry gives the avatar of
    ``listener_profile``. ``user`` names the user (the dialogue's speaker ``ID``), so a
    system with a memory (E3RG) knows whose earlier turns are whose.
    """

    folder: Path
    max_turns: int = 7
    listener_profile: Dict[str, str] = field(default_factory=lambda: dict(BUILTIN_PROFILES[0]))
    avatar: Optional[object] = None
    turns: List[Turn] = field(default_factory=list)
    answered: int = 0
    """Turns answered so far; the next answer is ``turn-<answered + 1>``."""
    user: Optional[str] = None

    def __post_init__(self):
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {self.max_turns}")
        self.max_turns -= 1 - self.max_turns % 2

    def dialogue(self, user_turn: Turn) -> Dialogue:
        """The window of the dialogue that ends with ``user_turn``."""
        turns = (self.turns + [user_turn])[-self.max_turns :]
        return Dialogue(turns, id=f"turn-{self.answered + 1}", listener_profile=dict(self.listener_profile),
                        speaker_profile={"ID": self.user} if self.user else None)

    def record(self, user_turn: Turn, response: EmpatheticResponse) -> None:
        self.turns += [user_turn, Turn("listener", response.text.strip() or EMPTY_ANSWER)]
        # Older turns leave the window for good; dropping them frees their media.
        keep = self.max_turns - 1
        self.turns = self.turns[-keep:] if keep else []
        self.answered += 1

    def reset(self) -> None:
        """Start over: the next turn opens a new dialogue (files already written stay)."""
        self.turns = []

    def turn_folder(self, number: int) -> Path:
        return self.folder / f"turn-{int(number)}"


@dataclass
class TurnUpdate:
    """One step of an answer: ``stage`` is ``"text"`` (text, chain and emotions),
    ``"speech"`` (``response.wav`` written), ``"video"`` (``response.mp4`` written) or
    ``"done"`` (``response.json``, ``index.html`` and the features written; the turn is
    part of the conversation)."""

    stage: str
    number: int
    response: EmpatheticResponse
    folder: Path
    seconds: Dict[str, float]
    """Seconds from the start of the turn to the end of each stage so far."""
    record: dict
    """``response.to_dict()`` as it was at this stage (the response object itself is
    filled in further by the next stages)."""


def answer_turn(
    model,
    conversation: Conversation,
    user_turn: Turn,
    speak: bool = True,
    animate: bool = True,
    max_new_tokens: Optional[int] = None,
    progress: Optional[Callable[[int], None]] = None,
    decoding: Optional[Decoding] = None,
) -> Iterator[TurnUpdate]:
    """Answer ``user_turn`` with ``model`` (an :class:`~empatheia.Empatheia`), writing the
    files into ``conversation.turn_folder(n)`` as each part is ready and handing over an
    update after each. The conversation takes the turn only once it is done, so a turn
    that fails leaves it as it was. ``progress`` is called with the number of tokens
    written so far while the text is being written; ``decoding`` says how the text is
    written (default: greedy with the config's repetition control)."""
    number = conversation.answered + 1
    folder = conversation.turn_folder(number)
    folder.mkdir(parents=True, exist_ok=True)
    dialogue = conversation.dialogue(user_turn)
    start, seconds = time.perf_counter(), {}
    stages = model.respond_in_stages(
        dialogue, max_new_tokens=max_new_tokens, speak=speak, animate=animate, avatar=conversation.avatar,
        progress=progress, **(decoding or Decoding()).kwargs(),
    )
    response = None
    for stage, response in stages:
        if stage == "speech":
            response.save_audio(folder)
        elif stage == "video":
            response.save_video(folder)
        seconds[stage] = round(time.perf_counter() - start, 3)
        yield TurnUpdate(stage, number, response, folder, dict(seconds), response.to_dict())
    response.save_record(folder, dialogue)
    conversation.record(user_turn, response)
    seconds["done"] = round(time.perf_counter() - start, 3)
    yield TurnUpdate("done", number, response, folder, dict(seconds), response.to_dict())


def warm_up(model) -> float:
    """Answer one throwaway turn with voice and face, so that everything built on first
    use (generators, runtime sessions, caches) is built before a user waits for it;
    the seconds it took."""
    start = time.perf_counter()
    for _ in model.respond_in_stages(Dialogue([Turn("speaker", "Hello.")]), max_new_tokens=8, speak=True, animate=True):
        pass
    return time.perf_counter() - start
