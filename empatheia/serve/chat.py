"""``empatheia chat``: a conversation with the avatar in the terminal, the model loaded once.

Each line typed is a turn; the Chain of Empathy and the answer are printed as soon as the
text is ready, and with ``--speak`` (``--animate``) the voice (talking head) is written to
``OUT/turn-<n>/`` and the voice played where the machine has a player. Lines starting
with ``/`` are commands: ``/audio FILE`` and ``/video FILE`` attach a recording of the
user's voice or face to the next turn, ``/reset`` starts over, ``/quit`` ends.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Callable, Dict, List, Optional, TextIO

from ..decoding import Decoding
from ..dialogue import Turn
from ..loading import WritingProgress
from .conversation import Conversation, TurnUpdate, answer_turn
from .uploads import UploadError, UploadLimits, check_size, decode_audio, decode_video

PLAYERS = (["aplay", "-q"], ["paplay"], ["afplay"], ["ffplay", "-nodisp", "-autoexit", "-loglevel", "quiet"])
"""Command lines that play a WAV file, tried in order."""
HELP = "Type to talk. /audio FILE, /video FILE: attach your voice or face to the next turn; /reset: start over; /quit."
_CHAIN = (("event_scenario", "event"), ("speaker_emotion", "your emotion"), ("emotion_cause", "cause"),
          ("goal_to_response", "goal"))


def find_player() -> Optional[List[str]]:
    for command in PLAYERS:
        if shutil.which(command[0]):
            return command
    return None


class Chat:
    """The terminal conversation (separate from the argument parsing, so it can be driven
    with any input and output).

    Args:
        model: an :class:`~empatheia.Empatheia`.
        out: folder of the turns' files.
        speak, animate: answer with a voice, and a talking head.
        player: a command line that plays a WAV file given after it, or ``None``.
        user: who is talking (a system with a memory, E3RG, keeps their turns under it
            across sessions).
        decoding: how the answers are written (:class:`~empatheia.decoding.Decoding`;
            default: greedy with the config's repetition control).
    """

    def __init__(self, model, out: Path, speak: bool = False, animate: bool = False,
                 player: Optional[List[str]] = None, max_new_tokens: Optional[int] = None,
                 limits: UploadLimits = UploadLimits(), write: Callable[[str], None] = print,
                 user: Optional[str] = None, decoding: Optional[Decoding] = None):
        self.model, self.speak, self.animate = model, speak or animate, animate
        self.decoding = decoding
        self.player, self.max_new_tokens, self.limits, self.write = player, max_new_tokens, limits, write
        self.conversation = Conversation(Path(out), user=user)
        self.conversation.folder.mkdir(parents=True, exist_ok=True)
        self.attached: Dict[str, object] = {}

    def run(self, lines: TextIO) -> int:
        self.write(HELP)
        for line in lines:
            line = line.strip()
            if line in ("/quit", "/exit"):
                break
            if line.startswith("/"):
                self.command(line)
            elif line or self.attached:
                self.turn(line)
        return 0

    def command(self, line: str) -> None:
        name, _, argument = line.partition(" ")
        if name == "/reset":
            self.conversation.reset()
            self.attached.clear()
            self.write("(a new conversation)")
        elif name in ("/audio", "/video") and argument.strip():
            self.attach(name[1:], Path(argument.strip()).expanduser())
        else:
            self.write(HELP)

    def attach(self, kind: str, path: Path) -> None:
        try:
            with open(path, "rb") as source:
                check_size(kind, path.stat().st_size, self.limits)
                if kind == "audio":
                    clip = decode_audio(kind, source, self.model.config.speech_encoder.sample_rate, self.limits)
                else:
                    clip = decode_video(kind, source, self.model.config.video_encoder.frame_rate, self.limits)
        except OSError as error:
            self.write(f"error: {path}: {error.strerror}")
            return
        except UploadError as error:
            self.write(f"error: {path}: {error}")
            return
        self.attached[kind] = clip
        self.write(f"({kind} attached to the next turn: {clip.seconds:.1f} s)")

    def turn(self, text: str) -> None:
        audio, video = self.attached.pop("audio", None), self.attached.pop("video", None)
        turn = Turn("speaker", text, audio=None if audio is None else audio.samples,
                    sample_rate=None if audio is None else audio.sample_rate,
                    video=None if video is None else video.frames)
        writing = WritingProgress("the avatar is writing")
        try:
            for update in answer_turn(self.model, self.conversation, turn, self.speak, self.animate,
                                      self.max_new_tokens, progress=writing, decoding=self.decoding):
                if update.stage == "text":
                    writing.done()
                self.show(update)
        except ValueError as error:  # bad media the model refuses (no face, ...): say so and go on
            self.write(f"error: {error}")
        finally:
            writing.done()

    def show(self, update: TurnUpdate) -> None:
        response = update.response
        if update.stage == "text":
            for key, title in _CHAIN:
                value = getattr(response.chain, key, None)
                if value:
                    self.write(f"  {title}: {value}")
            self.write(f"avatar> {response.text or '(no words)'}")
            self.write(f"  (voice and face: {response.emotion.label})")
        elif update.stage == "speech":
            path = update.folder / "response.wav"
            self.write(f"  voice: {path}")
            if self.player:
                subprocess.Popen([*self.player, str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        elif update.stage == "video":
            self.write(f"  face: {update.folder / 'response.mp4'}")
        elif update.stage == "done":
            self.write(f"  ({update.seconds['done']:.1f} s; files in {update.folder})")
