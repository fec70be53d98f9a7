"""Output heads that turn the language model's hidden states into generator features."""

from .content_synchronizer import ContentOutput, ContentSynchronizer
from .signal_norm import SignalStandardizer
from .style_disentangler import StyleDisentangler, StyleOutput
from .transformer_vae import TransformerVAE, VAEOutput

__all__ = [
    "ContentOutput",
    "ContentSynchronizer",
    "SignalStandardizer",
    "StyleDisentangler",
    "StyleOutput",
    "TransformerVAE",
    "VAEOutput",
]
