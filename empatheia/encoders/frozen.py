"""Base of the frozen encoders."""

from __future__ import annotations

from torch import nn


class FrozenEncoder(nn.Module):
    """A module whose weights never train and which stays in eval mode even when its parent
    trains, so layer drop and dropout never change the features of a frozen encoder."""

    def freeze(self) -> None:
        self.requires_grad_(False)
        super().train(False)

    def train(self, mode: bool = True) -> "FrozenEncoder":
        return super().train(False)
