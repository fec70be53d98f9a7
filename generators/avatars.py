"""Who answers: a memory of avatars, so the same listener keeps one voice and one face.

An avatar is found by the listener's ``ID`` (AvaMERG profiles carry one) or, without an
ID, by its profile (age, gender, timbre). Users register their own avatars (a portrait
and a voice) under a key; avatars met without registration get a default portrait drawn
from their profile and a seed derived from the key, and are remembered (on disk when the
registry has a folder) so later turns and later sessions see the same face and voice.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable, Dict, Optional, Union

import numpy as np

from empatheia.errors import DataError
from empatheia.io import read_json

from .base import Avatar

PortraitFactory = Callable[[dict, int], np.ndarray]
_PROFILE_KEYS = ("age", "gender", "timbre")


def avatar_key(profile: Optional[dict]) -> str:
    """``id-<ID>`` when the profile has an avatar ID, else ``profile-<age>-<gender>-<timbre>``."""
    profile = profile or {}
    if profile.get("ID") not in (None, ""):
        return _safe(f"id-{profile['ID']}")
    parts = [str(profile.get(k, "any")).lower() for k in _PROFILE_KEYS]
    return _safe("profile-" + "-".join(parts))


def _safe(key: str) -> str:
    # Keys name folders on disk.
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", key)


class AvatarRegistry:
    """Registered and remembered avatars.

    Args:
        root: folder that keeps avatars across sessions (``<root>/<key>/avatar.json`` and
            ``portrait.png``); ``None`` keeps them for this object's life only.
        portrait_factory: draws a default portrait from ``(profile, seed)``; by default
            the offline avatar renderer's.
    """

    def __init__(self, root: Optional[Union[str, Path]] = None, portrait_factory: Optional[PortraitFactory] = None):
        self.root = Path(root) if root is not None else None
        self._portrait_factory = portrait_factory
        self._avatars: Dict[str, Avatar] = {}

    def register(
        self,
        key: str,
        portrait: Union[str, Path, np.ndarray],
        voice: str = "default",
        profile: Optional[dict] = None,
    ) -> Avatar:
        """Register (or replace) an avatar. ``portrait`` is an RGB ``(H, W, 3)`` uint8
        array or an image file; ``voice`` is the speech generator's voice (a reference
        clip for StyleTTS2)."""
        image = _read_portrait(portrait) if not isinstance(portrait, np.ndarray) else portrait
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] != 3:
            raise ValueError(f"avatar {key!r}: the portrait must be (H, W, 3) uint8 RGB, got {image.shape} {image.dtype}")
        avatar = Avatar(key=_safe(key), portrait=image, voice=str(voice), profile=dict(profile or {}))
        self._avatars[avatar.key] = avatar
        self._persist(avatar)
        return avatar

    def get(self, key: str) -> Optional[Avatar]:
        key = _safe(key)
        if key not in self._avatars and self.root is not None and (self.root / key / "avatar.json").is_file():
            self._avatars[key] = self._load(self.root / key)
        return self._avatars.get(key)

    def for_profile(self, profile: Optional[dict]) -> Avatar:
        """The avatar of a listener profile: registered, remembered, or made now (and
        remembered)."""
        key = avatar_key(profile)
        found = self.get(key)
        if found is not None:
            return found
        profile = {k: v for k, v in (profile or {}).items() if v is not None}
        avatar = Avatar(key=key, portrait=np.zeros((1, 1, 3), np.uint8), voice="default", profile=profile)
        avatar.portrait = self._default_portrait(profile, avatar.seed())
        self._avatars[key] = avatar
        self._persist(avatar)
        return avatar

    def _default_portrait(self, profile: dict, seed: int) -> np.ndarray:
        if self._portrait_factory is None:
            from .avatar_face import default_portrait

            self._portrait_factory = default_portrait
        return self._portrait_factory(profile, seed)

    def _persist(self, avatar: Avatar) -> None:
        if self.root is None:
            return
        import cv2

        folder = self.root / avatar.key
        folder.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(folder / "portrait.png"), avatar.portrait[..., ::-1])
        (folder / "avatar.json").write_text(json.dumps({"voice": avatar.voice, "profile": avatar.profile}, indent=2))

    @staticmethod
    def _load(folder: Path) -> Avatar:
        """A remembered avatar; a damaged ``avatar.json`` or portrait is a :class:`DataError`
        naming the file and the field, not a crash halfway through an answer."""
        path = folder / "avatar.json"
        meta = read_json(path)
        if not isinstance(meta, dict):
            raise DataError(f"should be an object, got {type(meta).__name__}", file=path, record=folder.name)
        for key, kind in (("voice", str), ("profile", dict)):
            if not isinstance(meta.get(key), kind):
                found = "missing" if key not in meta else f"should be {kind.__name__}, got {type(meta[key]).__name__}"
                raise DataError(found, file=path, record=folder.name, field=key)
        try:
            portrait = _read_portrait(folder / "portrait.png")
        except FileNotFoundError:
            raise DataError("not a readable image (missing or damaged)", file=folder / "portrait.png", record=folder.name) from None
        return Avatar(key=folder.name, portrait=portrait, voice=meta["voice"], profile=meta["profile"])


def _read_portrait(path: Union[str, Path]) -> np.ndarray:
    import cv2

    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if image is None:
        raise FileNotFoundError(f"{path}: not a readable image")
    return np.ascontiguousarray(image[..., ::-1])
