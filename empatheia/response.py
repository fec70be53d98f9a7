"""What :meth:`Empatheia.respond` returns."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Union

import torch
from safetensors.torch import save_file

from .prompts import ChainOfEmpathy


@dataclass
class LabelPrediction:
    label: str
    probabilities: Dict[str, float]

    def to_dict(self) -> dict:
        return {"label": self.label, "probabilities": self.probabilities}


@dataclass
class EmpatheticResponse:
    """One multimodal empathetic response.

    The tensors are the signals for the generators: ``speech_content`` ``(Ls, D_cs)`` and
    ``speech_style`` ``(D_ss,)`` for the speech generator, ``video_content`` ``(Lv, D_cv)``
    and ``video_style`` ``(D_sv,)`` for the talking-head generator.
    """

    text: str
    chain: ChainOfEmpathy
    emotion: LabelPrediction
    profile: Dict[str, LabelPrediction]
    speech_content: torch.Tensor
    speech_style: torch.Tensor
    video_content: torch.Tensor
    video_style: torch.Tensor
    dialogue_id: Optional[str] = None
    generated_text: str = ""
    """Everything the language model wrote, chain included."""

    def to_dict(self) -> dict:
        return {
            "dialogue_id": self.dialogue_id,
            "text": self.text,
            "chain_of_empathy": self.chain.to_dict(),
            "emotion": self.emotion.to_dict(),
            "profile": {name: p.to_dict() for name, p in self.profile.items()},
            "generated_text": self.generated_text,
            "features": {name: list(getattr(self, name).shape) for name in _FEATURES},
        }

    def save(self, directory: Union[str, Path]) -> Path:
        """Write ``response.json`` and the generator signals as ``features.safetensors``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "response.json").write_text(json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n")
        save_file(
            {name: getattr(self, name).detach().float().contiguous().cpu() for name in _FEATURES},
            str(directory / "features.safetensors"),
        )
        return directory


_FEATURES = ("speech_content", "speech_style", "video_content", "video_style")
