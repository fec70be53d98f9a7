"""Output heads that turn the language model's hidden states into generator features."""

from .content_synchronizer import ContentOutput, ContentSynchronizer
from .style_disentangler import StyleDisentangler, StyleOutput
from .transformer_vae import TransformerVAE, VAEOutput

__all__ = [
    "ContentOutput",
    "ContentSynchronizer",
    "StyleDisentangler",
    "StyleOutput",
    "TransformerVAE",
    "VAEOutput",
]
