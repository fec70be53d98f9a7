"""MERIA's Uncertainty-Gated Fusion (UGF; ``shared/papers/000``, §3.2, eqs. 6-8).

UGF fuses the three modalities' shared-emotion means of the PDR module (:mod:`.disentangle`) into one vector
Z_S^F, weighting each modality by how *certain its private latent* is. The paper's intuition: a modality that
confidently captures its own private cue is a reliable witness, so its view of the shared emotion should
count more.

* Eq. 6: certainty T^M = 1 / (E[σ_P^2(M)] + ε), the expectation taken over the private latent's dimensions.
* Eq. 7: gates [w^T, w^A, w^V] = softmax(T^T, T^A, T^V), here taken over the modalities present in each row
  (an absent modality gets weight 0, so a missing video neither votes nor dilutes the others).
* Eq. 8: Z_S^F = Σ_M w^M μ_S^M, with the shared *means* (no sampling noise at fusion time).

The softmax acts on raw certainties, as the paper writes it: since T is an inverse variance it can span a
wide range, and the gate then comes close to picking the single most certain modality.

UGF has no parameters; it also passes on what the paper hands to the next stage (the concatenated audio and
video identity means Z_I^F and private means Z_P^A, Z_P^V) and a *conflict signal*. Figure 2 of the paper
names that signal but never defines it. Ours is the gate-weighted spread of the modalities' shared emotions
around the fused one, Σ_M w^M ‖μ_S^M - Z_S^F‖²: zero when the modalities agree, large when the ones that
count disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch
from torch import Tensor, nn

from .disentangle import IDENTITY_MODALITIES, MODALITIES, PDROutput


@dataclass
class FusionOutput:
    """UGF's result for a batch of B turns, with latents of width Z."""

    fused: Tensor
    """Z_S^F (B, Z): the gate-weighted shared emotion (eq. 8); zeros for a row with no modality."""
    weights: Tensor
    """(B, M) gates w^M in :data:`~.disentangle.MODALITIES` order (eq. 7); 0 for absent modalities."""
    conflict: Tensor
    """(B,) Σ_M w^M ‖μ_S^M - Z_S^F‖² (our definition of the paper's conflict signal)."""
    identity: Tensor
    """Z_I^F (B, 2Z): audio then video identity means, zeros where that modality is absent."""
    private: Tensor
    """(B, 2Z): audio then video private means Z_P^A, Z_P^V, zeros where that modality is absent."""


def _stacked(output: PDROutput) -> Tuple[Tensor, Tensor, Tensor]:
    """Shared means (B, M, Z), private log-variances (B, M, Z) and presence (B, M) for all of MODALITIES.

    A modality the output does not hold at all counts as absent; its placeholders are zeros.
    """
    reference = next(iter(output.shared_means().values()))
    shared, logvar, present = [], [], []
    for m in MODALITIES:
        if m in output.mu:
            mask = output.present[m].to(device=reference.device, dtype=torch.bool)
            shared.append(output.mu[m]["shared"])
            logvar.append(output.logvar[m]["private"])
        else:
            mask = torch.zeros(reference.shape[0], dtype=torch.bool, device=reference.device)
            shared.append(torch.zeros_like(reference))
            logvar.append(torch.zeros_like(reference))
        present.append(mask)
    present_t = torch.stack(present, dim=1)
    # Absent rows carry whatever the encoders made of zeros; clearing them keeps them out of sums and gradients.
    shared_t = torch.where(present_t[..., None], torch.stack(shared, dim=1), torch.zeros_like(reference)[:, None])
    logvar_t = torch.where(present_t[..., None], torch.stack(logvar, dim=1), torch.zeros_like(reference)[:, None])
    return shared_t, logvar_t, present_t


def _passed_on(output: PDROutput, kind: str, like: Tensor) -> Tensor:
    """Audio and video ``kind`` means concatenated, (B, 2Z), zeros for absent rows or modalities."""
    parts = []
    for m in IDENTITY_MODALITIES:
        if m in output.mu and kind in output.mu[m]:
            mask = output.present[m].to(device=like.device, dtype=torch.bool)[:, None]
            parts.append(torch.where(mask, output.mu[m][kind], torch.zeros_like(like)))
        else:
            parts.append(torch.zeros_like(like))
    return torch.cat(parts, dim=-1)


def certainty(private_logvar: Tensor, eps: float = 1e-6) -> Tensor:
    """Eq. 6: T = 1 / (mean over dims of σ_P² + ε).

    ``private_logvar``: (..., Z) log-variances of the private latent. Returns (...).
    """
    return 1.0 / (private_logvar.exp().mean(dim=-1) + eps)


def uncertainty_gated_fusion(output: PDROutput, eps: float = 1e-6, gated: bool = True) -> FusionOutput:
    """Fuse a :class:`~.disentangle.PDROutput`'s shared emotions (eqs. 6-8).

    Args:
        output: the PDR module's output for B turns.
        eps: ε of eq. 6.
        gated: ``False`` is the paper's "w/o UGF" ablation: uniform weights over the present modalities.

    Returns:
        :class:`FusionOutput`. A row with no modality present gets zero weights and zero vectors.
    """
    shared, logvar, present = _stacked(output)  # (B, M, Z), (B, M, Z), (B, M)
    any_present = present.any(dim=1, keepdim=True)
    if gated:
        scores = certainty(logvar, eps)
        scores = torch.where(present, scores, torch.full_like(scores, float("-inf")))
        # A row with nothing present would softmax to NaN; give it finite scores and zero it below.
        scores = torch.where(any_present, scores, torch.zeros_like(scores))
        weights = torch.softmax(scores, dim=1) * present.to(scores.dtype)
    else:
        counts = present.sum(dim=1, keepdim=True).clamp(min=1).to(shared.dtype)
        weights = present.to(shared.dtype) / counts
    fused = (weights[..., None] * shared).sum(dim=1)
    conflict = (weights * (shared - fused[:, None, :]).pow(2).sum(dim=-1)).sum(dim=1)
    like = shared[:, 0]
    return FusionOutput(
        fused=fused,
        weights=weights,
        conflict=conflict,
        identity=_passed_on(output, "identity", like),
        private=_passed_on(output, "private", like),
    )


class UncertaintyGatedFusion(nn.Module):
    """:func:`uncertainty_gated_fusion` as a module (it has no parameters), to sit in a model's module tree.

    Args:
        eps: ε of eq. 6.
        gated: ``False`` for the "w/o UGF" ablation (uniform weights over present modalities).
    """

    def __init__(self, eps: float = 1e-6, gated: bool = True):
        super().__init__()
        self.eps = eps
        self.gated = gated

    def forward(self, output: PDROutput) -> FusionOutput:
        return uncertainty_gated_fusion(output, eps=self.eps, gated=self.gated)

    def extra_repr(self) -> str:
        return f"eps={self.eps}, gated={self.gated}"
