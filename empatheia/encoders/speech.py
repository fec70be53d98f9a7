"""The frozen speech encoder (§4.1): HuBERT (the paper's) or a Whisper encoder run by
CTranslate2 (the ``small`` preset's), both pooled to a fixed number of tokens."""

from __future__ import annotations

from typing import Tuple

import torch
from transformers import HubertConfig, HubertModel

from ..config import SPEECH_BACKENDS, SpeechEncoderConfig
from ..pretrained import resolve_pretrained
from .frozen import FrozenEncoder, outside_cpu_autocast
from .pooling import pool_to_tokens


class SpeechEncoder(FrozenEncoder):
    """Waveforms at 16 kHz in, ``num_tokens`` feature tokens per utterance out.

    ``config.backend`` picks the encoder that turns audio into frames: ``"hubert"`` (a
    transformers ``HubertModel``, 50 frames per second) or ``"whisper_ct2"`` (the encoder of
    a CTranslate2 Whisper model, 50 frames per second, see
    :class:`~empatheia.encoders.whisper.WhisperCT2Encoder`). Either way only the frames of
    an utterance's real samples are average-pooled into its ``num_tokens`` tokens. The
    encoder is held in ``self.model``.
    """

    def __init__(self, config: SpeechEncoderConfig):
        super().__init__()
        self.config = config
        if config.backend == "hubert":
            if config.pretrained:
                self.model = HubertModel.from_pretrained(resolve_pretrained(config.pretrained))
            else:
                self.model = HubertModel(HubertConfig(**config.architecture))
            width = self.model.config.hidden_size
        elif config.backend == "whisper_ct2":
            from .whisper import WhisperCT2Encoder

            if not config.pretrained:
                raise ValueError(
                    "speech_encoder.backend whisper_ct2 needs speech_encoder.pretrained: the folder of a "
                    "CTranslate2 Whisper model (CTranslate2 builds no random models)"
                )
            self.model = WhisperCT2Encoder(resolve_pretrained(config.pretrained), sample_rate=config.sample_rate)
            width = self.model.hidden_size
        else:
            raise ValueError(
                f"speech_encoder.backend: unknown backend {config.backend!r}; choose one of {list(SPEECH_BACKENDS)}"
            )
        if width != config.hidden_size:
            raise ValueError(
                f"speech_encoder.hidden_size is {config.hidden_size} but the {config.backend} encoder has "
                f"hidden size {width}"
            )
        self.freeze()

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @torch.no_grad()
    @outside_cpu_autocast
    def forward(self, waveforms: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """
        Args:
            waveforms: ``(N, T)`` mono audio at ``sample_rate``, zero-padded after ``lengths``.
            lengths: ``(N,)`` valid samples per utterance.

        Returns:
            ``(N, num_tokens, hidden_size)`` features.
        """
        lengths = lengths.to(waveforms.device)
        if self.config.backend == "hubert":
            hidden, frames = self._hubert_frames(waveforms, lengths)
        else:
            hidden, frames = self.model(waveforms, lengths)
        return pool_to_tokens(hidden, frames, self.config.num_tokens)

    def _hubert_frames(self, waveforms: torch.Tensor, lengths: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(N, L, hidden_size)`` HuBERT frames and ``(N,)`` valid frames per utterance."""
        valid = torch.arange(waveforms.shape[1], device=waveforms.device)[None, :] < lengths[:, None]
        # HuBERT expects each utterance normalised to zero mean and unit variance over its
        # own samples; padding must not shift the statistics.
        count = lengths.clamp(min=1)[:, None].to(waveforms.dtype)
        mean = (waveforms * valid).sum(1, keepdim=True) / count
        var = (((waveforms - mean) * valid) ** 2).sum(1, keepdim=True) / count
        normalised = (waveforms - mean) / torch.sqrt(var + 1e-7) * valid
        dtype = next(self.model.parameters()).dtype
        hidden = self.model(normalised.to(dtype), attention_mask=valid.long()).last_hidden_state
        return hidden, self.model._get_feat_extract_output_lengths(lengths)
