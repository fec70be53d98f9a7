"""Style Disentangler (§4.3, eqs. 3-7) with the emotion and profile classifiers of eq. 11."""

from __future__ import annotations

from typing import Dict, NamedTuple, Optional

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

    With ``config.reads_chain_emotion`` the source of each pass also holds one more token:
    the hidden state at the Chain of Empathy's emotion slot, where the language model
    commits to the emotion it then writes. Why: the signal tokens come after the chain and
    the response, so in training they follow the reference text and in inference the text
    the model wrote, and a head fitted to the first reads the second worse (docs/model.md
    has the ``small`` preset's numbers). The slot comes before the chain's
    emotion and response, so it is nearly the same state in both, and through it the
    style follows the chain's reading of text, voice and face. A dialogue without a chain
    (stage 3's media-only prompts) gets a learned stand-in token instead.

    With ``config.styles_follow_classes`` each style also gets, per classifier (emotion,
    and each profile attribute), the classifier's probabilities times a learned table of
    per-class style offsets (``class_styles``). Why: a style regressed from the latent
    alone is a conditional mean, which can blend the styles of several classes where the
    classifier is sure of one, and the face and voice then show another emotion than the
    one the model decided. With the offsets a confident class brings its own style, and
    an unsure one a mix of its candidates'. The probabilities are held fixed there: the
    classifiers learn from eq. 11 alone.

    An ``emotion_prior`` (at inference, the chain's emotion folded onto the classes,
    :meth:`~empatheia.Empatheia.style_emotion_prior`) is added to the emotion
    classifier's log-probabilities before they pick the offsets and are returned. Why:
    the signal tokens come after the reply, so the classifier also reads the reply's
    wording, and a consoling "Don't worry." can read as another emotion than the one the
    chain named and the reply answers; the prior keeps the voice and the face on the
    chain's emotion.

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
        if config.reads_chain_emotion:
            # LayerNorm rather than running statistics: the slot state is not dominated by
            # a fixed vector as the signal positions are, and only some rows of a batch
            # have it, which running statistics synchronised across ranks cannot mix in.
            self.chain_norm = nn.LayerNorm(input_dim)
            self.chain_ffn = feed_forward(input_dim, d)
            self.no_chain = nn.Parameter(torch.zeros(d))
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
        if config.styles_follow_classes:
            classes = {"emotion": config.emotion_labels, **config.profile_labels}
            self.class_styles = nn.ModuleDict({name: self.class_style_table(len(values)) for name, values in classes.items()})

    def class_style_table(self, num_classes: int) -> nn.Linear:
        """A fresh table of per-class offsets of S^s ⊕ S^v: ``(num_classes,)``
        probabilities -> ``(speech_style_dim + video_style_dim,)``, zeros (a new table
        leaves the styles as they were)."""
        table = nn.Linear(num_classes, self.config.speech_style_dim + self.config.video_style_dim, bias=False)
        nn.init.zeros_(table.weight)
        return table

    def forward(
        self,
        speech_signal: torch.Tensor,
        video_signal: torch.Tensor,
        chain_state: Optional[torch.Tensor] = None,
        has_chain: Optional[torch.Tensor] = None,
        emotion_prior: Optional[torch.Tensor] = None,
    ) -> StyleOutput:
        """
        Args:
            speech_signal: ``(B, n, input_dim)`` hidden states at ``<AUD1>..<AUDn>``.
            video_signal: ``(B, n, input_dim)`` hidden states at ``<VID1>..<VIDn>``.
            chain_state: ``(B, input_dim)`` hidden state at each row's emotion slot; read
                only with ``config.reads_chain_emotion``. ``None`` means no row has one.
            has_chain: ``(B,)`` bool, which rows of ``chain_state`` hold a slot's state
                (default: all of them when ``chain_state`` is given).
            emotion_prior: ``(B, num_emotions)`` log-probabilities added to the emotion
                classifier's; the returned ``emotion_logits`` are then the fused
                log-probabilities. A row of zeros leaves its row as the classifier read it.
        """
        b = speech_signal.shape[0]
        dtype = self.queries.dtype
        speech = self.speech_ffn(self.speech_norm(speech_signal).to(dtype))
        video = self.video_ffn(self.video_norm(video_signal).to(dtype))
        if self.config.reads_chain_emotion:
            chain = self.no_chain.expand(b, -1)  # (B, d)
            if chain_state is not None:
                if has_chain is None:
                    has_chain = torch.ones(b, dtype=torch.bool, device=chain_state.device)
                read = self.chain_ffn(self.chain_norm(chain_state.to(dtype)))
                chain = torch.where(has_chain[:, None], read, chain)
            speech = torch.cat([speech, chain[:, None]], dim=1)  # (B, n + 1, d)
            video = torch.cat([video, chain[:, None]], dim=1)
        source = torch.cat([speech, speech, video, video], dim=0)  # (4B, n [+ 1], d)
        queries = self.queries.repeat_interleave(b, dim=0)  # (4B, q, d)
        out = self.vae(source, queries)
        pooled = out.features.mean(1).view(4, b, -1)
        emotion_s, profile_s, emotion_v, profile_v = pooled.unbind(0)
        emotion = self.emotion_fusion(torch.cat([emotion_s, emotion_v], -1))
        profile = self.profile_fusion(torch.cat([profile_s, profile_v], -1))
        emotion_logits = self.emotion_classifier(emotion)
        if emotion_prior is not None:
            emotion_logits = emotion_logits.float().log_softmax(-1) + emotion_prior.float()
        profile_logits = {name: head(profile) for name, head in self.profile_classifiers.items()}
        speech_style = self.speech_style_layer(torch.cat([emotion_s, profile_s], -1))
        video_style = self.video_style_layer(torch.cat([emotion_v, profile_v], -1))
        if self.config.styles_follow_classes:
            logits = {"emotion": emotion_logits, **profile_logits}
            offset = sum(table(torch.softmax(logits[name].detach().float(), -1).to(dtype))
                         for name, table in self.class_styles.items())  # (B, D_ss + D_sv)
            speech_offset, video_offset = offset.split([self.config.speech_style_dim, self.config.video_style_dim], -1)
            speech_style, video_style = speech_style + speech_offset, video_style + video_offset
        return StyleOutput(
            speech_style=speech_style,
            video_style=video_style,
            emotion=emotion,
            profile=profile,
            emotion_logits=emotion_logits,
            profile_logits=profile_logits,
            kl=out.kl.view(4, b).sum(0),
        )
