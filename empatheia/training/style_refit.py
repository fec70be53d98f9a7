"""Fit the Style Disentangler alone on a trained model's signal states.

Why: stage 4 trains the Style Disentangler beside the language core, and on the ``small``
preset's CPU budget that is a few hundred examples; the Transformer VAE of eqs. 3-7 needs
far more updates than that before its classifiers leave the label prior (measured in
docs/small_preset.md). The signal states of the frozen core are collected once and the
head trains on them alone (:mod:`~empatheia.training.head_refit`). The losses are stage
3's (eqs. 10-12 and the VAE's KL); the running statistics of the signal standardisers
stay as stage 4 left them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from ..data import StageCollator, StageDataset
from ..modeling import Empatheia
from .head_refit import load_states, refit_head, save_states, states_key_of


@dataclass
class SignalStates:
    """The frozen model's signal states, emotion-slot states and the style targets of
    ``N`` examples."""

    speech: torch.Tensor
    """``(N, n, H)`` hidden states at ``<AUD1>..<AUDn>``."""
    video: torch.Tensor
    """``(N, n, H)`` hidden states at ``<VID1>..<VIDn>``."""
    chain: torch.Tensor
    """``(N, H)`` hidden state at each example's Chain-of-Empathy emotion slot (zeros
    where it has none)."""
    has_chain: torch.Tensor
    """``(N,)`` bool, which examples have the slot."""
    targets: Dict[str, torch.Tensor]
    """``speech_style_target`` ``(N, D_ss)``, ``video_style_target`` ``(N, D_sv)``,
    ``style_target_mask`` ``(N,)`` and each ``*_label`` ``(N,)``."""

    def __len__(self) -> int:
        return self.speech.shape[0]

    @classmethod
    def concatenate(cls, parts: Sequence["SignalStates"]) -> "SignalStates":
        """The examples of ``parts``, one after the other (their target keys must agree)."""
        return cls(
            torch.cat([p.speech for p in parts]),
            torch.cat([p.video for p in parts]),
            torch.cat([p.chain for p in parts]),
            torch.cat([p.has_chain for p in parts]),
            {key: torch.cat([p.targets[key] for p in parts]) for key in parts[0].targets},
        )

    def batch(self, index: torch.Tensor) -> Dict[str, torch.Tensor]:
        return {key: value[index] for key, value in self.targets.items()}

    def inputs(self, index: torch.Tensor) -> tuple:
        """The Style Disentangler's inputs for the examples at ``index``."""
        return self.speech[index], self.video[index], self.chain[index], self.has_chain[index]

    def save(self, path, key: str = "") -> None:
        """Write the states and targets to a safetensors file (collecting them is the slow
        part of a refit; a second refit with other settings can start from the file).
        ``key`` names what they were collected from (:meth:`key_of` reads it back), so that
        a caller can tell a file of other examples or another model from its own."""
        save_states(path, {"speech": self.speech, "video": self.video, "chain": self.chain,
                           "has_chain": self.has_chain}, self.targets, key)

    key_of = staticmethod(states_key_of)

    @classmethod
    def load(cls, path) -> "SignalStates":
        """Read what :meth:`save` wrote."""
        tensors, targets = load_states(path, ("speech", "video", "chain", "has_chain"), "signal states")
        return cls(tensors["speech"], tensors["video"], tensors["chain"], tensors["has_chain"], targets)


def add_chain_reading(model: Empatheia) -> bool:
    """Let the Style Disentangler of ``model``, trained without the emotion-slot token
    (``style_disentangler.reads_chain_emotion`` false), read it: a head with that input,
    fresh weights for it and the trained head's weights for everything else. Returns
    whether it changed anything. The refit then trains the new input with the rest."""
    from ..heads import StyleDisentangler

    config = model.config.style_disentangler
    if config.reads_chain_emotion:
        return False
    old = model.style_disentangler
    config.reads_chain_emotion = True
    head = StyleDisentangler(config, old.speech_ffn[0].in_features, old.speech_norm.running_mean.shape[0])
    missing, unexpected = head.load_state_dict(old.state_dict(), strict=False)
    if unexpected or any(not k.startswith(("chain_", "no_chain")) for k in missing):
        raise ValueError(f"unexpected Style Disentangler layout: missing {missing}, unexpected {unexpected}")
    param = next(old.parameters())
    model.style_disentangler = head.to(device=param.device, dtype=param.dtype).train(old.training)
    return True


def add_class_styles(model: Empatheia) -> bool:
    """Give the Style Disentangler of ``model``, trained without per-class style offsets
    (``style_disentangler.styles_follow_classes`` false), zero tables of them, which leave
    its styles as they were until a refit trains them. Returns whether it changed
    anything."""
    config = model.config.style_disentangler
    if config.styles_follow_classes:
        return False
    head = model.style_disentangler
    config.styles_follow_classes = True
    param = head.emotion_classifier.weight
    classes = {"emotion": config.emotion_labels, **config.profile_labels}
    head.class_styles = torch.nn.ModuleDict(
        {name: head.class_style_table(len(values)) for name, values in classes.items()}
    ).to(device=param.device, dtype=param.dtype)
    return True


STYLE_PARTS = ("class_styles.", "speech_style_layer.", "video_style_layer.")
"""The Style Disentangler's parameters that make S^s and S^v from its features and class
probabilities: a refit of these alone leaves every classification as it was."""


@torch.no_grad()
def collect_signal_states(model: Empatheia, dataset: StageDataset, batch_size: int = 8, progress: bool = True) -> SignalStates:
    """Run ``model`` (in evaluation mode) over a stage-4 ``dataset`` once and keep the
    signal states with each example's style targets and labels."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    loader = DataLoader(dataset, batch_size=batch_size, collate_fn=StageCollator(dataset.processor))
    speech, video, chain, has_chain, targets = [], [], [], [], {}
    try:
        for batch in tqdm(loader, desc="signal states", disable=not progress, unit="batch"):
            if "skipped" in batch:
                raise ValueError(f"an example could not be encoded: {batch['skipped'][0]}")
            rows = len(batch["ids"])
            inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            s, v, c, has = model.style_inputs(model.hidden_states(inputs), inputs)
            speech.append(s.float().cpu())
            video.append(v.float().cpu())
            chain.append(c.float().cpu())
            has_chain.append(has.cpu())
            batch.setdefault("style_target_mask", torch.ones(rows, dtype=torch.bool))
            for key, value in batch.items():
                if key.endswith("_label") or key in ("speech_style_target", "video_style_target", "style_target_mask"):
                    targets.setdefault(key, []).append(value)
    finally:
        model.train(was_training)
    targets = {k: torch.cat(v) for k, v in targets.items()}
    return SignalStates(torch.cat(speech), torch.cat(video), torch.cat(chain), torch.cat(has_chain), targets)


def refit_style_disentangler(
    model: Empatheia,
    states: SignalStates,
    steps: int,
    learning_rate: float = 3e-4,
    batch_size: int = 64,
    weight_decay: float = 1e-3,
    warmup_steps: int = 50,
    seed: int = 0,
    progress: bool = True,
    only: Optional[Sequence[str]] = None,
) -> List[Dict[str, float]]:
    """Train ``model.style_disentangler`` on ``states`` for ``steps`` AdamW steps (linear
    warm-up over ``warmup_steps``, then a cosine decay to zero; gradients clipped at norm
    1) with stage 3's loss. Returns one row of loss terms per 50 steps and the last.
    ``only``: train just the parameters whose names (in the head) start with one of these
    prefixes, e.g. :data:`STYLE_PARTS`; the others keep their values.

    Batches of 64 rather than a few examples matter: the classifiers see most emotions in
    each step. docs/small_preset.md (step 6) gives what these settings and the earlier ones
    reached on the ``small`` preset's states."""
    head = model.style_disentangler
    device = next(head.parameters()).device

    def step_terms(generator: torch.Generator) -> Dict[str, torch.Tensor]:
        index = torch.randint(len(states), (batch_size,), generator=generator)
        batch = {k: v.to(device) for k, v in states.batch(index).items()}
        style = head(*(x.to(device) for x in states.inputs(index)))
        terms = model.style_losses(style, batch)
        loss = sum(model.weighted_terms(terms, 3).values())
        return {"loss": loss, **terms}

    frozen = []
    if only is not None:
        frozen = [p for name, p in head.named_parameters() if p.requires_grad and not name.startswith(tuple(only))]
        if len(frozen) == sum(1 for _ in head.parameters()):
            raise ValueError(f"no Style Disentangler parameter starts with any of {list(only)}")
    was_training = head.training
    head.train()
    # The standardisers keep stage 4's statistics: they were gathered over the prompts the
    # model was trained on, and the states here come from a subset of those.
    head.speech_norm.eval()
    head.video_norm.eval()
    if only is not None:
        # Dropout off as well: the frozen parts give the features inference gives.
        head.eval()
    for p in frozen:
        p.requires_grad_(False)
    try:
        return refit_head(head, step_terms, steps, learning_rate, weight_decay, warmup_steps, seed, progress,
                          description="style refit")
    finally:
        for p in frozen:
            p.requires_grad_(True)
        head.train(was_training)
