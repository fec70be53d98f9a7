"""HuBERT speech encoder (§4.1), frozen."""

from __future__ import annotations

import torch
from transformers import HubertConfig, HubertModel

from ..config import SpeechEncoderConfig
from .frozen import FrozenEncoder
from .pooling import pool_to_tokens


class SpeechEncoder(FrozenEncoder):
    """Waveforms at 16 kHz in, ``num_tokens`` HuBERT feature tokens per utterance out."""

    def __init__(self, config: SpeechEncoderConfig):
        super().__init__()
        self.config = config
        if config.pretrained:
            self.model = HubertModel.from_pretrained(config.pretrained)
        else:
            self.model = HubertModel(HubertConfig(**config.architecture))
        if self.model.config.hidden_size != config.hidden_size:
            raise ValueError(
                f"speech_encoder.hidden_size is {config.hidden_size} but the HuBERT model has "
                f"hidden size {self.model.config.hidden_size}"
            )
        self.freeze()

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @torch.no_grad()
    def forward(self, waveforms: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """
        Args:
            waveforms: ``(N, T)`` mono audio at ``sample_rate``, zero-padded after ``lengths``.
            lengths: ``(N,)`` valid samples per utterance.

        Returns:
            ``(N, num_tokens, hidden_size)`` features.
        """
        lengths = lengths.to(waveforms.device)
        valid = torch.arange(waveforms.shape[1], device=waveforms.device)[None, :] < lengths[:, None]
        # HuBERT expects each utterance normalised to zero mean and unit variance over its
        # own samples; padding must not shift the statistics.
        count = lengths.clamp(min=1)[:, None].to(waveforms.dtype)
        mean = (waveforms * valid).sum(1, keepdim=True) / count
        var = (((waveforms - mean) * valid) ** 2).sum(1, keepdim=True) / count
        normalised = (waveforms - mean) / torch.sqrt(var + 1e-7) * valid
        dtype = next(self.model.parameters()).dtype
        hidden = self.model(normalised.to(dtype), attention_mask=valid.long()).last_hidden_state
        frames = self.model._get_feat_extract_output_lengths(lengths)
        return pool_to_tokens(hidden, frames, self.config.num_tokens)
