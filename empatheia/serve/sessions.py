"""Sessions and the one thread that runs the model.

Each session has a random id (192 bits, from :mod:`secrets`) and a folder the server names
after it; a request names a session only by that id, which is looked up, never joined to
a path, so one session reaches no other's files without its id. Idle sessions expire and
their folders go with them.

The model answers one turn at a time on its own thread (:class:`ModelWorker`): requests
queue for it up to a bound, and past the bound are told at once that the server is
busy. A request whose client goes away does not stop its turn, which still becomes part
of its conversation; a turn that fails is reported to its request and the thread goes on.
"""

from __future__ import annotations

import queue
import secrets
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional

from ..dialogue import Turn
from .conversation import Conversation, TurnUpdate, answer_turn
from .uploads import UploadError


class Busy(RuntimeError):
    """The queue of turns is full."""


@dataclass
class Session:
    id: str
    conversation: Conversation
    last_used: float
    pending: int = 0
    """Turns of this session submitted and not yet finished: the session is not expired
    while it has any."""


class SessionStore:
    """The live sessions, each with a folder under ``root``.

    Args:
        root: folder for the sessions' files (made if missing).
        ttl: seconds a session may sit idle before it and its files are removed.
        max_sessions: most sessions kept; a new one past it pushes out the longest idle.
        max_turns: turns of each conversation that go to the model.
        clock: seconds, monotonic (tests pass their own).
    """

    def __init__(self, root: Path, ttl: float = 3600.0, max_sessions: int = 100, max_turns: int = 7,
                 clock: Callable[[], float] = time.monotonic):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.ttl, self.max_sessions, self.max_turns, self.clock = ttl, max_sessions, max_turns, clock
        self._sessions: Dict[str, Session] = {}
        self._lock = threading.Lock()

    def create(self) -> Session:
        self.sweep()
        session_id = secrets.token_urlsafe(24)
        # The session is the user: a system with a memory keeps their turns under its id.
        session = Session(session_id, Conversation(self.root / session_id, self.max_turns, user=session_id), self.clock())
        session.conversation.folder.mkdir()
        with self._lock:
            idle = sorted((s for s in self._sessions.values() if s.pending == 0), key=lambda s: s.last_used)
            for old in idle[: max(0, len(self._sessions) + 1 - self.max_sessions)]:
                self._drop(old)
            self._sessions[session_id] = session
        return session

    def get(self, session_id: str) -> Session:
        """The session with this id; an unknown or expired id is a 404 :class:`UploadError`."""
        self.sweep()
        with self._lock:
            session = self._sessions.get(str(session_id))
            if session is None:
                raise UploadError("session_id", "no such session (unknown, ended or expired)", 404)
            session.last_used = self.clock()
            return session

    def delete(self, session_id: str) -> None:
        with self._lock:
            session = self._sessions.get(str(session_id))
            if session is None:
                raise UploadError("session_id", "no such session (unknown, ended or expired)", 404)
            self._drop(session)

    def sweep(self) -> int:
        """Remove the sessions idle for longer than ``ttl``; how many went."""
        now = self.clock()
        with self._lock:
            expired = [s for s in self._sessions.values() if s.pending == 0 and now - s.last_used > self.ttl]
            for session in expired:
                self._drop(session)
        return len(expired)

    def __len__(self) -> int:
        return len(self._sessions)

    def mark(self, session: Session, change: int) -> None:
        with self._lock:
            session.pending += change
            session.last_used = self.clock()

    def close(self) -> None:
        """Remove every session and the root folder."""
        with self._lock:
            self._sessions.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    def _drop(self, session: Session) -> None:
        # Called with the lock held. A turn still running for the session keeps its
        # pending count above zero, so a folder in use is never removed.
        del self._sessions[session.id]
        shutil.rmtree(session.conversation.folder, ignore_errors=True)


@dataclass
class Job:
    """A submitted turn; its updates arrive on :meth:`updates` as the model makes them."""

    session: Session
    turn: Turn
    speak: bool
    animate: bool
    _updates: "queue.Queue" = field(default_factory=queue.Queue)

    def updates(self, timeout: Optional[float] = None) -> Iterator[TurnUpdate]:
        """Each :class:`TurnUpdate` up to ``"done"``; a turn that failed raises its error
        here (in the requesting thread)."""
        while True:
            item = self._updates.get(timeout=timeout)
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.stage == "done":
                return


class ModelWorker:
    """Runs the turns of every session on one thread that owns the model.

    Args:
        model: an :class:`~empatheia.Empatheia`.
        store: the sessions (their pending counts keep busy sessions from expiring).
        max_pending: turns that may wait for the model; one more is :class:`Busy`.
        max_new_tokens: the language model's limit per answer (``None``: the config's).
    """

    def __init__(self, model, store: SessionStore, max_pending: int = 16, max_new_tokens: Optional[int] = None):
        self.model, self.store, self.max_new_tokens = model, store, max_new_tokens
        self._jobs: "queue.Queue[Optional[Job]]" = queue.Queue(maxsize=max_pending)
        self._thread = threading.Thread(target=self._run, name="empatheia-model", daemon=True)
        self._thread.start()

    def submit(self, session: Session, turn: Turn, speak: bool = True, animate: bool = True) -> Job:
        """Queue a turn; :class:`Busy` when ``max_pending`` turns already wait."""
        job = Job(session, turn, speak, animate)
        self.store.mark(session, +1)
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            self.store.mark(session, -1)
            raise self._busy() from None
        return job

    def ensure_room(self) -> None:
        """:class:`Busy` now if a turn would not be queued (checked before the upload is
        decoded, so a full queue costs a refused request no decoding)."""
        if self._jobs.full():
            raise self._busy()

    def _busy(self) -> Busy:
        return Busy(f"busy: {self._jobs.maxsize} turns are already waiting for the model; try again shortly")

    @property
    def waiting(self) -> int:
        return self._jobs.qsize()

    def close(self, timeout: float = 60.0) -> None:
        """Finish the turn in progress and stop; turns still waiting are dropped."""
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job._updates.put(Busy("the server is stopping"))
        self._jobs.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                for update in answer_turn(self.model, job.session.conversation, job.turn, job.speak, job.animate,
                                          self.max_new_tokens):
                    job._updates.put(update)
            except Exception as error:  # reported to the request; the thread serves on
                job._updates.put(error)
            finally:
                self.store.mark(job.session, -1)
