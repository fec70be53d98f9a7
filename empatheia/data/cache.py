"""On-disk cache of the frozen encoders' outputs, keyed by file content.

The speech and video encoders are frozen, so an utterance's features never change during
training; decoding, face cropping and encoding it again every epoch is wasted time. The
cache stores each file's ``(num_tokens, D_enc)`` encoder output under the SHA-256 of the
file's bytes, in a folder named after a fingerprint of everything that shapes the output
(encoder weights and settings, sampling, cropping). A renamed or copied file still hits;
an edited file, or a changed encoder setting, misses.

Layout: ``{root}/{audio|video}-{fingerprint}/{hash[:2]}/{hash}.safetensors``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Optional, Protocol, Tuple, Union

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..io import atomic_path, file_digest
from ..processing import merge_features

if TYPE_CHECKING:
    from ..config import EmpatheiaConfig

MODALITIES = ("audio", "video")


class MediaEncoders(Protocol):
    """The frozen encoders :meth:`MediaFeatureCache.complete` runs (an
    :class:`~empatheia.modeling.Empatheia` has them)."""

    speech_encoder: nn.Module
    video_encoder: nn.Module
    device: torch.device


def encoder_fingerprint(config: "EmpatheiaConfig", modality: str) -> str:
    """A short hash of the settings that determine a modality's encoder output."""
    if modality == "audio":
        settings = dataclasses.asdict(config.speech_encoder)
    elif modality == "video":
        settings = dataclasses.asdict(config.video_encoder)
    else:
        raise ValueError(f"modality must be one of {MODALITIES}, got {modality!r}")
    weights = settings.get("pretrained")
    # Random weights are drawn from the config's seed; named weights are identified by name.
    settings["weights"] = weights if weights else f"random(seed={config.seed})"
    text = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class MediaFeatureCache:
    """Encoder outputs on disk, keyed by file content.

    Args:
        root: the cache folder (created when needed).
        config: the model's config, for the fingerprints.
    """

    def __init__(self, root: Union[str, Path], config: "EmpatheiaConfig"):
        self.root = Path(root)
        self.folders = {m: self.root / f"{m}-{encoder_fingerprint(config, m)}" for m in MODALITIES}
        # Hashing is cheap next to decoding but not free; a file whose size and mtime have
        # not changed keeps its digest for the life of this object.
        self._digests: Dict[Tuple[str, int, int], str] = {}

    def key(self, path: Union[str, Path]) -> str:
        stat = os.stat(path)
        memo = (str(path), stat.st_size, stat.st_mtime_ns)
        if memo not in self._digests:
            self._digests[memo] = file_digest(path)
        return self._digests[memo]

    def _file(self, modality: str, key: str) -> Path:
        return self.folders[modality] / key[:2] / f"{key}.safetensors"

    def lookup(self, modality: str, path: Union[str, Path]) -> Tuple[str, Optional[torch.Tensor]]:
        """``(key, features)``: the file's content key and its cached ``(n, D)`` features,
        or ``None`` when not cached yet."""
        key = self.key(path)
        file = self._file(modality, key)
        if file.is_file():
            return key, load_file(str(file))["features"]
        return key, None

    def store(self, modality: str, key: str, features: torch.Tensor) -> None:
        """Write one item's ``(n, D)`` features (atomically: a killed run leaves no half
        file that a later run would read)."""
        with atomic_path(self._file(modality, key)) as temporary:
            save_file({"features": features.detach().to("cpu").contiguous()}, str(temporary))

    @torch.no_grad()
    def complete(self, batch: Dict[str, object], model: MediaEncoders) -> Dict[str, object]:
        """Encode a batch's uncached media with the model's frozen encoders, store them,
        and return the batch with complete ``audio_features``/``video_features`` (and no
        raw media), ready for ``model(batch)``."""
        batch = dict(batch)
        for modality, encoder, lengths in (
            ("audio", model.speech_encoder, "audio_lengths"),
            ("video", model.video_encoder, "video_lengths"),
        ):
            keys = batch.pop(f"{modality}_cache_keys", None)
            raw = None
            if modality in batch:
                device = model.device
                raw = encoder(batch[modality].to(device), batch[lengths].to(device))
                for key, features in zip(keys or [], raw):
                    if key is not None:
                        self.store(modality, key, features)
            if raw is not None or f"{modality}_cached" in batch:
                batch[f"{modality}_features"] = merge_features(batch, modality, raw)
            for name in (modality, lengths, f"{modality}_cached", f"{modality}_order"):
                batch.pop(name, None)
        return batch

