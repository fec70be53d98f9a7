"""torchvision's MobileNetV2 as an image embedder: 1280-d globally pooled features."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

import torch
from torch import nn


class MobileNetV2Features(nn.Module):
    """MobileNetV2 without its classifier: images ``(B, 3, S, S)`` (normalised with the
    ImageNet mean and std) -> ``(B, 1280)``, the global average of the last feature map.

    The classifier's 1000 ImageNet logits are too specific to ImageNet's classes to
    describe faces; the pooled features before it are the usual transferable embedding.

    Args:
        weights: a torchvision ``mobilenet_v2`` state-dict file; ``None`` keeps random
            weights (drawn from the caller's RNG).
        image_size: the side the frames have (224, what the ImageNet weights saw).
    """

    def __init__(self, weights: Optional[Union[str, Path]] = None, image_size: int = 224):
        super().__init__()
        from torchvision.models import mobilenet_v2

        model = mobilenet_v2()
        if weights is not None:
            state = torch.load(str(weights), map_location="cpu", weights_only=True)
            # assign: also works when the module is built on the meta device (shape checks).
            model.load_state_dict(state, assign=True)
        self.features = model.features
        self.output_dim = model.last_channel
        self.image_size = image_size

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, 3, S, S)`` -> ``(B, output_dim)``."""
        return self.features(images).mean(dim=(-2, -1))
