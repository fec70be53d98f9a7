"""Fit the Content Synchronizer alone on a trained model's response states.

Why: the mouth of a talking head follows C^v's per-unit loudness, and stages 2 and 4 give
the Content Synchronizer only a few hundred steps on the ``small`` preset's CPU budget,
in which it learns how loud each phoneme is only loosely (docs/small_preset.md measures
it). The head reads the hidden states of the response's tokens (r^t, eq. 1), which for a
frozen core are a fixed function of the dialogue and its reply: they are collected once
(:func:`collect_response_states`) and the head trains on them alone
(:mod:`~empatheia.training.head_refit`) with stage 2's loss (eq. 9 and the VAE's KL).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

import torch
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from ..data import StageCollator, StageDataset
from ..modeling import Empatheia
from .head_refit import load_states, refit_head, save_states, states_key_of

TARGETS = ("speech_content_target", "speech_content_mask", "video_content_target", "video_content_mask")


@dataclass
class ResponseStates:
    """The frozen model's response-token states and the content targets of ``N`` examples.
    Rows are right-padded to the longest example."""

    hidden: torch.Tensor
    """``(N, R, H)`` hidden states of the response's tokens, in order."""
    mask: torch.Tensor
    """``(N, R)`` bool, True on each example's response tokens."""
    targets: Dict[str, torch.Tensor]
    """``speech_content_target`` ``(N, Ls, D_cs)``, ``video_content_target`` ``(N, Ls, D_cv)``,
    their masks ``(N, Ls)`` and, when the Content Synchronizer reads unit ids,
    ``speech_units`` ``(N, Ls)``."""

    def __len__(self) -> int:
        return self.hidden.shape[0]

    @classmethod
    def concatenate(cls, parts: List["ResponseStates"]) -> "ResponseStates":
        """The examples of ``parts``, one after the other, padded to the longest."""
        width = max(p.hidden.shape[1] for p in parts)
        units = max(p.targets["speech_content_mask"].shape[1] for p in parts)

        def pad(x: torch.Tensor, length: int) -> torch.Tensor:
            extra = [0, 0] * (x.dim() - 2) + [0, length - x.shape[1]]
            return torch.nn.functional.pad(x, extra)

        return cls(
            torch.cat([pad(p.hidden, width) for p in parts]),
            torch.cat([pad(p.mask, width) for p in parts]),
            {key: torch.cat([pad(p.targets[key], units) for p in parts]) for key in parts[0].targets},
        )

    def batch(self, index: torch.Tensor) -> Dict[str, torch.Tensor]:
        """The examples at ``index``, their rows cut to the longest among them."""
        mask = self.mask[index]
        width = int(mask.sum(1).max())
        units = int(self.targets["speech_content_mask"][index].sum(1).max())
        out = {key: value[index][:, :units] for key, value in self.targets.items()}
        out.update(hidden=self.hidden[index][:, :width], response_mask=mask[:, :width])
        return out

    def save(self, path, key: str = "") -> None:
        """Write the states and targets to a safetensors file; ``key`` names what they were
        collected from (:meth:`key_of` reads it back)."""
        save_states(path, {"hidden": self.hidden, "mask": self.mask}, self.targets, key)

    key_of = staticmethod(states_key_of)

    @classmethod
    def load(cls, path) -> "ResponseStates":
        """Read what :meth:`save` wrote."""
        tensors, targets = load_states(path, ("hidden", "mask"), "response states")
        return cls(tensors["hidden"], tensors["mask"], targets)


def add_unit_context(model: Empatheia) -> bool:
    """Give the Content Synchronizer of ``model``, trained without a unit context
    (``content_synchronizer.unit_context`` 0) but reading unit ids, the zero context
    convolution of the config's default width
    (:attr:`~empatheia.config.ContentSynchronizerConfig.unit_context`, every preset's),
    which leaves its content as it was until a refit trains it. Returns whether it changed
    anything."""
    head = model.content_synchronizer
    config = head.config
    if head.unit_embedding is None or head.unit_context is not None:
        return False
    config.unit_context = type(config)().unit_context
    param = head.unit_embedding.weight
    head.unit_context = head.unit_context_layer().to(device=param.device, dtype=param.dtype)
    return True


def response_rows(hidden: torch.Tensor, response_mask: torch.Tensor) -> tuple:
    """The response tokens' states of each row, moved to the front in their order:
    ``hidden`` ``(B, L, H)`` and ``response_mask`` ``(B, L)`` -> ``(B, R, H)`` and
    ``(B, R)`` with ``R`` the most response tokens of a row (zeros past a row's own). The Content Synchronizer
    reads only those positions and adds no position of its own to them, so it reads the
    packed rows exactly as the full ones."""
    width = int(response_mask.sum(1).max())
    # A stable sort of "not response" puts each row's response positions first, in order.
    order = torch.sort((~response_mask).to(torch.int8), dim=1, stable=True).indices[:, :width]  # (B, R)
    mask = response_mask.gather(1, order)
    packed = hidden.gather(1, order.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
    return packed * mask.unsqueeze(-1).to(packed.dtype), mask


@torch.no_grad()
def collect_response_states(model: Empatheia, dataset: StageDataset, batch_size: int = 8,
                            progress: bool = True) -> ResponseStates:
    """Run ``model`` (in evaluation mode) over a stage-2 or stage-4 ``dataset`` once and
    keep the response tokens' states with each example's content targets. Examples
    without gold content (mask all False) are left out: they train nothing here."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    loader = DataLoader(dataset, batch_size=batch_size, collate_fn=StageCollator(dataset.processor))
    parts: List[ResponseStates] = []
    names = TARGETS + (("speech_units",) if model.config.content_synchronizer.unit_vocab_size > 0 else ())
    try:
        for batch in tqdm(loader, desc="response states", disable=not progress, unit="batch"):
            if "skipped" in batch:
                raise ValueError(f"an example could not be encoded: {batch['skipped'][0]}")
            missing = [name for name in names if name not in batch]
            if missing:
                raise ValueError(f"the dataset gives no {missing}: a content refit needs gold content features")
            inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            hidden, mask = response_rows(model.hidden_states(inputs), inputs["response_mask"])
            keep = batch["speech_content_mask"].any(1)
            if keep.any():
                parts.append(ResponseStates(
                    hidden[keep.to(device)].float().cpu(), mask[keep.to(device)].cpu(),
                    {name: batch[name][keep] for name in names},
                ))
    finally:
        model.train(was_training)
    if not parts:
        raise ValueError("no example of the dataset has gold content features")
    return ResponseStates.concatenate(parts)


def refit_content_synchronizer(
    model: Empatheia,
    states: ResponseStates,
    steps: int,
    learning_rate: float = 3e-4,
    batch_size: int = 32,
    weight_decay: float = 1e-3,
    warmup_steps: int = 50,
    seed: int = 0,
    progress: bool = True,
) -> List[Dict[str, float]]:
    """Train ``model.content_synchronizer`` on ``states`` for ``steps`` AdamW steps
    (:func:`~empatheia.training.head_refit.refit_head`) with stage 2's loss. Returns one
    row of loss terms per 50 steps and the last.

    Each batch is ``batch_size`` examples of neighbouring lengths (a window at a random
    place in the examples sorted by their unit count): the head's cost grows with the
    longest row of a batch, and answers run from a few units to a few hundred."""
    head = model.content_synchronizer
    device = next(head.parameters()).device
    by_length = torch.argsort(states.targets["speech_content_mask"].sum(1), stable=True)  # (N,)
    batch_size = min(batch_size, len(states))

    def step_terms(generator: torch.Generator) -> Dict[str, torch.Tensor]:
        start = int(torch.randint(len(states) - batch_size + 1, (1,), generator=generator))
        index = by_length[start : start + batch_size]
        batch = {k: v.to(device) for k, v in states.batch(index).items()}
        lengths = batch["speech_content_mask"].sum(1)
        content = head(batch["hidden"], batch["response_mask"], lengths, batch.get("speech_units"))
        terms = model.content_losses(content, batch)
        loss = sum(model.weighted_terms(terms, 2).values())
        return {"loss": loss, **terms}

    was_training = head.training
    head.train()
    try:
        return refit_head(head, step_terms, steps, learning_rate, weight_decay, warmup_steps, seed, progress,
                          description="content refit")
    finally:
        head.train(was_training)
