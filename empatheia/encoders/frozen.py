"""Base of the frozen encoders."""

from __future__ import annotations

import functools

import torch
from torch import nn


class FrozenEncoder(nn.Module):
    """A module whose weights never train and which stays in eval mode even when its parent
    trains, so layer drop and dropout never change the features of a frozen encoder."""

    def freeze(self) -> None:
        self.requires_grad_(False)
        super().train(False)

    def train(self, mode: bool = True) -> "FrozenEncoder":
        return super().train(False)


def outside_cpu_autocast(forward):
    """Run ``forward`` with CPU autocast off. A frozen encoder then gives the float32
    features that inference and the media cache hold whatever precision its caller trains
    in (bf16 autocast on a CPU that computes it natively), and one that cannot run in
    bfloat16 at all (Whisper's log-mel front end hands its tensors to NumPy) still runs."""

    @functools.wraps(forward)
    def run(*args, **kwargs):
        with torch.autocast("cpu", enabled=False):
            return forward(*args, **kwargs)

    return run
