"""Whether a checkpoint's state dict fits a module exactly, said in one line.

The generators load published checkpoints (StyleTTS2, DreamTalk) strictly: a key that is
missing, left over or of another shape means the module was built from another config
than the checkpoint was trained with, and the error has to say which keys, in the
checkpoint's own spelling, so the user can tell a wrong preset from a wrong file.
"""

from __future__ import annotations

from typing import List, Mapping

import torch
from torch import nn

SHOWN = 12
"""Keys named per kind of problem; the rest are counted."""


def _listed(keys: List[str]) -> str:
    return ", ".join(keys[:SHOWN]) + (f", ... ({len(keys) - SHOWN} more)" if len(keys) > SHOWN else "")


def state_dict_problems(module: nn.Module, state: Mapping[str, torch.Tensor], prefix: str = "") -> List[str]:
    """What keeps ``state`` from loading into ``module`` strictly, one entry per kind
    (``"2 missing keys: ..."``, ``"1 unexpected keys: ..."``, ``"1 wrong shapes: k (100, 512)
    (expected (178, 512))"``); empty when it fits. ``prefix`` is how the file spells the
    keys (prepended in the message)."""
    expected = module.state_dict()
    missing = sorted(prefix + k for k in set(expected) - set(state))
    unexpected = sorted(prefix + k for k in set(state) - set(expected))
    wrong = sorted(
        f"{prefix}{k} {tuple(state[k].shape)} (expected {tuple(expected[k].shape)})"
        for k in set(state) & set(expected)
        if tuple(state[k].shape) != tuple(expected[k].shape)
    )
    found = (("missing keys", missing), ("unexpected keys", unexpected), ("wrong shapes", wrong))
    return [f"{len(keys)} {title}: {_listed(keys)}" for title, keys in found if keys]
