"""E3RG's empathy memory: who the avatar is, and what the user said before.

Two stores under one folder, both kept across turns and sessions:

* ``avatars/``: each avatar's identity (portrait, voice, profile), an
  :class:`~empatheia.generators.avatars.AvatarRegistry` rooted here, so an avatar met once
  looks and sounds the same in every later session;
* ``users/``: each user's earlier turns (one JSON line each), from which the turns most
  like the current one are retrieved into the prompt (TF-IDF cosine over words).

No user-supplied string becomes a path: a user's file is named by the SHA-256 of their key.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Union

from ..dialogue import Dialogue, Turn

USER_TURNS_KEPT = 500
"""Earlier turns a user's file keeps (the oldest go first)."""


def user_key(dialogue: Dialogue) -> str:
    """Who the user is: the speaker profile's ``ID`` when given, else the conversation
    (the dialogue id up to its last ``/``, which the readers end with the turn number)."""
    profile = dialogue.speaker_profile or {}
    if profile.get("ID"):
        return f"id:{profile['ID']}"
    return f"conversation:{(dialogue.id or 'user').rsplit('/', 1)[0]}"


def _words(text: str) -> List[str]:
    from ..evaluation.text import tokenize

    return [t for t in tokenize(text) if any(ch.isalnum() for ch in t)]


class EmpathyMemory:
    """The memory under ``root`` (``None``: kept in this object only)."""

    def __init__(self, root: Optional[Union[str, Path]] = None):
        from empatheia.generators.avatars import AvatarRegistry

        self.root = Path(root) if root is not None else None
        self.avatars = AvatarRegistry(self.root / "avatars" if self.root is not None else None)
        self._turns: Dict[str, List[dict]] = {}

    # ---------------------------------------------------------------- user turns
    def _file(self, key: str) -> Optional[Path]:
        if self.root is None:
            return None
        return self.root / "users" / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".jsonl")

    def turns(self, key: str) -> List[dict]:
        """The user's remembered turns, oldest first: ``{"text", "dialogue"}`` each."""
        if key not in self._turns:
            path = self._file(key)
            rows = []
            if path is not None and path.is_file():
                for line in path.read_text(encoding="utf-8").splitlines():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError:
                        continue  # a line cut by a crash; the others stand
            self._turns[key] = rows
        return self._turns[key]

    def remember(self, dialogue: Dialogue) -> int:
        """Keep the dialogue's user turns that are not remembered yet; returns how many."""
        key = user_key(dialogue)
        known = {row["text"] for row in self.turns(key)}
        fresh = [{"text": t.text.strip(), "dialogue": dialogue.id} for t in dialogue.turns
                 if t.role == "speaker" and t.text.strip() and t.text.strip() not in known]
        if not fresh:
            return 0
        rows = (self.turns(key) + fresh)[-USER_TURNS_KEPT:]
        self._turns[key] = rows
        path = self._file(key)
        if path is not None:
            from ..io import write_text_atomic

            path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        return len(fresh)

    def recall(self, dialogue: Dialogue, k: int = 2, min_similarity: float = 0.1) -> List[str]:
        """Up to ``k`` of the user's earlier turns most like the dialogue's last user turn
        (TF-IDF cosine at least ``min_similarity``), leaving out turns the dialogue
        already holds; most similar first."""
        present = {t.text.strip() for t in dialogue.turns}
        candidates = [row["text"] for row in self.turns(user_key(dialogue)) if row["text"] not in present]
        query = next((t.text for t in reversed(dialogue.turns) if t.role == "speaker" and t.text.strip()), "")
        if not candidates or not query or k < 1:
            return []
        documents = [Counter(_words(text)) for text in candidates]
        frequency = Counter(word for document in documents for word in document)
        n = len(documents) + 1  # the query counts as a document

        def vector(counts: Counter) -> Dict[str, float]:
            return {w: (1 + math.log(c)) * (math.log((1 + n) / (1 + frequency.get(w, 0))) + 1) for w, c in counts.items()}

        def cosine(a: Dict[str, float], b: Dict[str, float]) -> float:
            dot = sum(v * b.get(w, 0.0) for w, v in a.items())
            norm = math.sqrt(sum(v * v for v in a.values()) * sum(v * v for v in b.values()))
            return dot / norm if norm else 0.0

        q = vector(Counter(_words(query)))
        scored = sorted(((cosine(q, vector(d)), i) for i, d in enumerate(documents)), key=lambda x: (-x[0], x[1]))
        return [candidates[i] for score, i in scored[:k] if score >= min_similarity]

    def with_recalled(self, dialogue: Dialogue, k: int = 2) -> Dialogue:
        """The dialogue with the recalled turns put before its first turn, as the user's
        earlier words (their text only); the dialogue itself when nothing is recalled."""
        recalled = self.recall(dialogue, k)
        if not recalled:
            return dialogue
        from dataclasses import replace

        earlier = [Turn(role="speaker", text=text) for text in recalled]
        return replace(dialogue, turns=earlier + list(dialogue.turns))
