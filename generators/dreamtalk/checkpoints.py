"""Strict loading of the two official DreamTalk checkpoints.

* ``denoising_network.pth``: ``{"model_state_dict": {...}}``; the diffusion network's
  tensors are the keys starting with ``diff_net.`` (anything else in that dict, e.g. from
  the training wrapper, is not part of the generator and is ignored, as the official
  inference script does).
* ``renderer.pt``: ``{"net_G_ema": {...}}``, the EMA weights of the image generator.

Every key the module expects must be there with the expected shape, and no other key may
be: a mismatch raises :class:`CheckpointError` naming the file and the keys.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Dict, Mapping, Union

import torch
from torch import nn

from ..checkpoint_fit import state_dict_problems

PathLike = Union[str, Path]

DENOISER_KEY = "model_state_dict"
DENOISER_PREFIX = "diff_net."
RENDERER_KEY = "net_G_ema"
_SHOWN = 12
"""Keys listed per kind of mismatch before the message says how many more there are."""


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable or does not fit the architecture."""


def read_checkpoint(path: PathLike, trust: bool = False) -> dict:
    """``torch.load`` onto the CPU, with only tensors and plain containers unless ``trust``."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint file not found")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=not trust)
    except pickle.UnpicklingError as error:
        raise CheckpointError(
            f"{path}: holds Python objects besides tensors ({error}); if you trust this file, "
            "set DreamTalkConfig.trust_checkpoints=True to unpickle it"
        ) from None
    except Exception as error:  # torch raises a variety of errors for a corrupt archive
        raise CheckpointError(f"{path}: cannot read checkpoint: {error}") from None
    if not isinstance(checkpoint, Mapping):
        raise CheckpointError(f"{path}: expected a dict, got {type(checkpoint).__name__}")
    return checkpoint


def denoiser_state_dict(checkpoint: Mapping, path: PathLike) -> Dict[str, torch.Tensor]:
    """The ``diff_net.`` tensors of ``denoising_network.pth``, prefix removed."""
    state = _entry(checkpoint, DENOISER_KEY, path)
    out = {k[len(DENOISER_PREFIX):]: v for k, v in state.items() if k.startswith(DENOISER_PREFIX)}
    if not out:
        raise CheckpointError(f"{path}: no '{DENOISER_PREFIX}*' keys under '{DENOISER_KEY}'")
    return out


def renderer_state_dict(checkpoint: Mapping, path: PathLike) -> Dict[str, torch.Tensor]:
    return dict(_entry(checkpoint, RENDERER_KEY, path))


def load_strict(module: nn.Module, state: Mapping[str, torch.Tensor], path: PathLike, prefix: str = "") -> None:
    """Load ``state`` into ``module`` only if keys and shapes match exactly.

    ``prefix`` is how the keys are spelled in the file (for the error message).
    """
    problems = state_dict_problems(module, state, prefix)
    if problems:
        raise CheckpointError(
            f"{path}: does not match the {type(module).__name__} of this config; " + "; ".join(problems)
        )
    module.load_state_dict(state, strict=True)


def _entry(checkpoint: Mapping, key: str, path: PathLike) -> Mapping[str, torch.Tensor]:
    if key not in checkpoint:
        raise CheckpointError(f"{path}: no '{key}' entry (top-level keys: {sorted(map(str, checkpoint))[:_SHOWN]})")
    state = checkpoint[key]
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{path}: '{key}' is a {type(state).__name__}, not a state dict")
    return state
