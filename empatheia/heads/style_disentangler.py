"""Style Disentangler (§4.3, eqs. 3-7) with the emotion and profile classifiers of eq. 11."""

from __future__ import annotations

from typing import Dict, NamedTuple

import torch
from torch import nn

from ..config import StyleDisentanglerConfig
from .signal_norm import SignalStandardizer
from .transformer_vae import TransformerVAE, feed_forward


class StyleOutput(NamedTuple):
    speech_style: torch.Tensor
    """``(B, speech_style_dim)`` S^s = style layer of E^s ⊕ P^s, for the speech generator."""
    video_style: torch.Tensor
    """``(B, video_style_dim)`` S^v, for the talking-head generator."""
    emotion: torch.Tensor
    """``(B, d_model)`` fused emotion feature E (from E^s and E^v)."""
    profile: torch.Tensor
    """``(B, d_model)`` fused profile feature P (from P^s and P^v)."""
    emotion_logits: torch.Tensor
    """``(B, num_emotions)``."""
    profile_logits: Dict[str, torch.Tensor]
    """attribute -> ``(B, num_values)``."""
    kl: torch.Tensor
    """``(B,)`` KL of the four latents (emotion/profile x speech/video)."""


class StyleDisentangler(nn.Module):
    """Reads the hidden states of the ``<AUDi>`` (r^s) and ``<VIDi>`` (r^v) signal tokens.

    One shared Transformer VAE (Enc^SD, Dec^SD) is read with four sets of learned queries,
    q_e^s, q_p^s, q_e^v, q_p^v, giving emotion and profile features per modality; the four
    passes run as one batched call. Each modality's style layer maps E ⊕ P to its
    generator's style width. The signal states are first standardised per position
    (:class:`SignalStandardizer`): the dialogue moves them little against what the
    position alone fixes.

    Args:
        config: the head's sizes and labels.
        input_dim: width of the language model's hidden states.
        num_signals: signal tokens per modality (``language_model.num_signal_tokens``).
    """

    def __init__(self, config: StyleDisentanglerConfig, input_dim: int, num_signals: int):
        super().__init__()
        self.config = config
        d, q = config.d_model, config.num_queries
        self.speech_norm = SignalStandardizer(num_signals, input_dim)
        self.video_norm = SignalStandardizer(num_signals, input_dim)
        self.speech_ffn = feed_forward(input_dim, d)
        self.video_ffn = feed_forward(input_dim, d)
        self.vae = TransformerVAE(d, config.num_heads, config.num_layers, config.ffn_dim, config.latent_dim, config.dropout)
        # Rows: emotion/speech, profile/speech, emotion/video, profile/video.
        self.queries = nn.Parameter(torch.randn(4, q, d) * 0.02)
        self.speech_style_layer = nn.Linear(2 * d, config.speech_style_dim)
        self.video_style_layer = nn.Linear(2 * d, config.video_style_dim)
        self.emotion_fusion = nn.Linear(2 * d, d)
        self.profile_fusion = nn.Linear(2 * d, d)
        self.emotion_classifier = nn.Linear(d, len(config.emotion_labels))
        self.profile_classifiers = nn.ModuleDict(
            {name: nn.Linear(d, len(values)) for name, values in config.profile_labels.items()}
        )

    def forward(self, speech_signal: torch.Tensor, video_signal: torch.Tensor) -> StyleOutput:
        """
        Args:
            speech_signal: ``(B, n, input_dim)`` hidden states at ``<AUD1>..<AUDn>``.
            video_signal: ``(B, n, input_dim)`` hidden states at ``<VID1>..<VIDn>``.
        """
        b = speech_signal.shape[0]
        dtype = self.queries.dtype
        speech = self.speech_ffn(self.speech_norm(speech_signal).to(dtype))
        video = self.video_ffn(self.video_norm(video_signal).to(dtype))
        source = torch.cat([speech, speech, video, video], dim=0)  # (4B, n, d)
        queries = self.queries.repeat_interleave(b, dim=0)  # (4B, q, d)
        out = self.vae(source, queries)
        pooled = out.features.mean(1).view(4, b, -1)
        emotion_s, profile_s, emotion_v, profile_v = pooled.unbind(0)
        emotion = self.emotion_fusion(torch.cat([emotion_s, emotion_v], -1))
        profile = self.profile_fusion(torch.cat([profile_s, profile_v], -1))
        return StyleOutput(
            speech_style=self.speech_style_layer(torch.cat([emotion_s, profile_s], -1)),
            video_style=self.video_style_layer(torch.cat([emotion_v, profile_v], -1)),
            emotion=emotion,
            profile=profile,
            emotion_logits=self.emotion_classifier(emotion),
            profile_logits={name: head(profile) for name, head in self.profile_classifiers.items()},
            kl=out.kl.view(4, b).sum(0),
        )
