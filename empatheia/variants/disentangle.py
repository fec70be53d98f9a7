"""MERIA's Parallel Disentangled Representation (PDR) module (``shared/papers/000``, §3.1, eqs. 1-5).

Each modality's utterance-level feature vector (text from a sentence encoder, audio from a speech-emotion
encoder, video from a face encoder) is split by parallel β-VAE encoders into independent latent subspaces:

==========  ==========================================  ==================================================
modality    latents                                     why
==========  ==========================================  ==================================================
``text``    ``shared``, ``private``                     a sentence says little about the speaker's gender
                                                        or age, so the paper gives text no identity latent
``audio``   ``shared``, ``private``, ``identity``       voices and faces carry who is speaking
``video``   ``shared``, ``private``, ``identity``
==========  ==========================================  ==================================================

That is eight encoders (:class:`BetaVAEEncoder`), one decoder per modality that rebuilds the modality's
input from the concatenation of its latents, and, on each identity latent, one small classifier per
annotated profile attribute (gender, age, ...).

Training (eq. 1) weighs five terms, each a pure module-level function here so it can be checked by hand:

* :func:`reconstruction_loss` (eq. 2) keeps the latents informative,
* :func:`kl_divergence` is the β-VAE prior term on all eight latents,
* :func:`alignment_loss` (eq. 3) pulls the three shared latents of one turn together, which is what makes them
  "shared",
* :func:`orthogonality_loss` (eq. 4) decorrelates the latents within a modality,
* :func:`triplet_loss` and :func:`identity_classification_loss` (eq. 5) shape the identity latents.

:func:`pdr_loss` combines them. Missing modalities are first-class: a modality may be absent from the inputs
altogether or for some rows only. Absent rows are still pushed through the networks (fed zeros, which keeps
the batch rectangular and the code free of per-row branching) but every loss and the fusion
(:mod:`empatheia.variants.fusion`) ignore them through the ``present`` masks.

All losses average over present rows; a mask with no present row yields an exact zero that still carries a
gradient path, so a batch without, say, any video never produces NaN.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations, permutations
from typing import Dict, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..processing import IGNORE_INDEX
from . import MODALITIES

LATENT_KINDS: Dict[str, Tuple[str, ...]] = {
    "text": ("shared", "private"),
    "audio": ("shared", "private", "identity"),
    "video": ("shared", "private", "identity"),
}
"""Each modality's latents, in the order its decoder concatenates them."""

IDENTITY_MODALITIES: Tuple[str, ...] = tuple(m for m in MODALITIES if "identity" in LATENT_KINDS[m])
"""The modalities with an identity latent (audio and video)."""

LOGVAR_RANGE: Tuple[float, float] = (-10.0, 10.0)
"""Bounds on predicted log-variances: keeps ``exp`` finite and the UGF certainty (1 / σ²) bounded."""


@dataclass
class PDRConfig:
    """Sizes of the PDR networks and the weights of its loss (eq. 1 and eq. 5)."""

    latent_dim: int = 32
    """Z, the width of every latent (shared, private and identity alike)."""
    hidden_dim: int = 256
    """Width of the hidden layer of encoders, decoders and identity classifiers."""
    beta: float = 4.0
    """β of eq. 1: weight of the KL term (β-VAE; > 1 favours disentangled latents)."""
    alpha: float = 1.0
    """α of eq. 1: weight of the cross-modal alignment loss (eq. 3)."""
    gamma: float = 0.1
    """γ of eq. 1: weight of the orthogonality loss (eq. 4)."""
    delta: float = 1.0
    """δ of eq. 1: weight of the hybrid identity loss (eq. 5)."""
    delta_triplet: float = 1.0
    """δ1 of eq. 5: weight of the speaker triplet loss inside the identity loss."""
    delta_cls: float = 1.0
    """δ2 of eq. 5: weight of the attribute cross-entropy inside the identity loss."""
    triplet_margin: float = 1.0
    """Margin of the triplet loss (eq. 5), in Euclidean distance of identity latents."""
    eta: float = 1.0
    """η: weight of the shared emotions' classification against the dialogue's emotion class
    (:func:`emotion_classification_loss`). Ours, not eq. 1's (``0`` gives eq. 1 exactly): eq. 1 is
    minimised by shared latents that are one constant for every utterance (alignment is then 0 and
    the private latents carry what reconstruction needs), while the paper calls the module
    semi-supervised and shows its shared latents clustered by emotion (its Figure 4b)."""


def latent_names() -> Tuple[str, ...]:
    """The eight encoder names, ``"<modality>_<kind>"``, in :data:`MODALITIES` order."""
    return tuple(f"{m}_{kind}" for m in MODALITIES for kind in LATENT_KINDS[m])


class BetaVAEEncoder(nn.Module):
    """One β-VAE encoder E: feature vector → parameters of a diagonal Gaussian posterior q(Z | X).

    The input is layer-normalised first because the three modalities' features come from unrelated encoders
    with very different scales; without it one modality's gradients would dominate the shared objectives.
    """

    def __init__(self, in_dim: int, hidden_dim: int, latent_dim: int):
        super().__init__()
        self.body = nn.Sequential(nn.LayerNorm(in_dim), nn.Linear(in_dim, hidden_dim), nn.GELU())
        self.mu = nn.Linear(hidden_dim, latent_dim)
        self.logvar = nn.Linear(hidden_dim, latent_dim)

    def forward(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        """``x`` (B, D) → ``(mu, logvar)``, each (B, Z); ``logvar`` is clamped to :data:`LOGVAR_RANGE`."""
        hidden = self.body(x)
        return self.mu(hidden), self.logvar(hidden).clamp(*LOGVAR_RANGE)


def reparameterize(mu: Tensor, logvar: Tensor, training: bool) -> Tensor:
    """Z = μ + σ·ε with ε ~ N(0, I) while training (the reparameterisation trick), else the mean μ.

    ``mu``, ``logvar``: (B, Z). Returns (B, Z).
    """
    if not training:
        return mu
    return mu + torch.exp(0.5 * logvar) * torch.randn_like(mu)


def _mlp(in_dim: int, hidden_dim: int, out_dim: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(in_dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, out_dim))


@dataclass
class PDROutput:
    """What :class:`ParallelDisentangler` yields for a batch of B turns.

    Every modality of :data:`MODALITIES` is present in each mapping (absent rows are computed from zeros and
    flagged by ``present``); ``kind`` is one of that modality's :data:`LATENT_KINDS`.
    """

    mu: Dict[str, Dict[str, Tensor]]
    """``mu[m][kind]``: posterior means, (B, Z)."""
    logvar: Dict[str, Dict[str, Tensor]]
    """``logvar[m][kind]``: posterior log-variances, (B, Z)."""
    z: Dict[str, Dict[str, Tensor]]
    """``z[m][kind]``: sampled latents (the means in eval mode), (B, Z)."""
    reconstruction: Dict[str, Tensor]
    """``reconstruction[m]``: the decoder's rebuilt input X̂^m, (B, D_m)."""
    present: Dict[str, Tensor]
    """``present[m]``: bool (B,), whether row b really has modality m."""
    identity_logits: Dict[str, Dict[str, Tensor]] = field(default_factory=dict)
    """``identity_logits[m][attribute]``: (B, C_attribute) for m in :data:`IDENTITY_MODALITIES`."""
    emotion_logits: Dict[str, Tensor] = field(default_factory=dict)
    """``emotion_logits[m]``: (B, C_emotion) from the shared latent, where the module has an emotion classifier."""

    @property
    def modalities(self) -> Tuple[str, ...]:
        """The modalities this output holds, in :data:`MODALITIES` order."""
        return tuple(m for m in MODALITIES if m in self.mu)

    @property
    def batch_size(self) -> int:
        """B, the number of rows."""
        return next(iter(self.present.values())).shape[0]

    def shared_means(self) -> Dict[str, Tensor]:
        """``{m: mu[m]["shared"]}``, each (B, Z): the mean shared emotions UGF fuses (eq. 8)."""
        return {m: self.mu[m]["shared"] for m in self.modalities}


    def latents(self, modality: str, sampled: bool = True) -> Tuple[Tensor, ...]:
        """The latents of one modality in :data:`LATENT_KINDS` order, each (B, Z): sampled z or means."""
        source = self.z if sampled else self.mu
        return tuple(source[modality][kind] for kind in LATENT_KINDS[modality])


class ParallelDisentangler(nn.Module):
    """The PDR module: eight parallel β-VAE encoders, three decoders and the identity classifiers.

    Args:
        input_dims: ``{"text": D_T, "audio": D_A, "video": D_V}``, the feature widths.
        config: network sizes (the loss weights are read by :func:`pdr_loss`).
        identity_labels: ``{attribute: class names}`` of the annotated speaker profile (e.g.
            ``{"gender": ("female", "male")}``); one classifier per attribute sits on each identity latent.
            Empty: no classifiers, the identity latents are shaped by the triplet loss alone.
        emotion_classes: the emotion classes one linear classifier reads from every modality's shared
            latent (:attr:`PDRConfig.eta`); 0: none.
    """

    def __init__(
        self,
        input_dims: Mapping[str, int],
        config: Optional[PDRConfig] = None,
        identity_labels: Optional[Mapping[str, Sequence[str]]] = None,
        emotion_classes: int = 0,
    ):
        super().__init__()
        missing = [m for m in MODALITIES if m not in input_dims]
        if missing:
            raise ValueError(f"input_dims lacks {missing}; it needs a width for each of {MODALITIES}")
        self.config = config if config is not None else PDRConfig()
        self.input_dims = {m: int(input_dims[m]) for m in MODALITIES}
        self.identity_labels = {name: tuple(classes) for name, classes in (identity_labels or {}).items()}
        z_dim, hidden = self.config.latent_dim, self.config.hidden_dim

        self.encoders = nn.ModuleDict(
            {name: BetaVAEEncoder(self.input_dims[name.split("_")[0]], hidden, z_dim) for name in latent_names()}
        )
        self.decoders = nn.ModuleDict(
            {m: _mlp(len(LATENT_KINDS[m]) * z_dim, hidden, self.input_dims[m]) for m in MODALITIES}
        )
        # One classifier for all three modalities: it only reads a shared space they have in common.
        self.emotion_classifier = nn.Linear(z_dim, emotion_classes) if emotion_classes else None
        self.identity_classifiers = nn.ModuleDict()
        if self.identity_labels:
            for m in IDENTITY_MODALITIES:
                self.identity_classifiers[m] = nn.ModuleDict(
                    {name: _mlp(z_dim, hidden, len(classes)) for name, classes in self.identity_labels.items()}
                )

    def _inputs(
        self, features: Mapping[str, Tensor], present: Optional[Mapping[str, Tensor]]
    ) -> Tuple[Dict[str, Tensor], Dict[str, Tensor]]:
        """Complete the inputs: every modality gets a (B, D_m) tensor, zeros where not present."""
        given = [features[m] for m in MODALITIES if m in features]
        if not given:
            raise ValueError(f"features holds none of {MODALITIES}")
        reference = given[0]
        batch = reference.shape[0]
        present = present or {}
        inputs, masks = {}, {}
        for m in MODALITIES:
            if m in features:
                x = features[m]
                mask = present.get(m)
                mask = torch.ones(batch, dtype=torch.bool, device=x.device) if mask is None else mask.bool()
                # Zeroing keeps absent rows finite whatever placeholder the caller put there.
                inputs[m] = torch.where(mask[:, None], x, torch.zeros_like(x))
            else:
                inputs[m] = reference.new_zeros(batch, self.input_dims[m])
                mask = torch.zeros(batch, dtype=torch.bool, device=reference.device)
            masks[m] = mask.to(reference.device)
        return inputs, masks

    def forward(self, features: Mapping[str, Tensor], present: Optional[Mapping[str, Tensor]] = None) -> PDROutput:
        """Disentangle one batch.

        Args:
            features: ``{m: (B, D_m)}``; a modality left out counts as absent for every row.
            present: ``{m: bool (B,)}``; a modality given in ``features`` but not here counts as present
                for every row.

        Returns:
            :class:`PDROutput` with all three modalities.
        """
        inputs, masks = self._inputs(features, present)
        mu, logvar, z, reconstruction, identity_logits, emotion_logits = {}, {}, {}, {}, {}, {}
        for m in MODALITIES:
            mu[m], logvar[m], z[m] = {}, {}, {}
            for kind in LATENT_KINDS[m]:
                mu[m][kind], logvar[m][kind] = self.encoders[f"{m}_{kind}"](inputs[m])
                z[m][kind] = reparameterize(mu[m][kind], logvar[m][kind], self.training)
            reconstruction[m] = self.decoders[m](torch.cat([z[m][kind] for kind in LATENT_KINDS[m]], dim=-1))
            if self.emotion_classifier is not None:
                emotion_logits[m] = self.emotion_classifier(mu[m]["shared"])
            if m in self.identity_classifiers:
                identity_logits[m] = {
                    name: head(mu[m]["identity"]) for name, head in self.identity_classifiers[m].items()
                }
        return PDROutput(mu, logvar, z, reconstruction, masks, identity_logits, emotion_logits)


# --------------------------------------------------------------------------------------------------------------
# Losses. Each takes a bool mask (B,) of the rows that count and returns a scalar.


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values`` (B,) over rows where ``mask`` (B,) holds; 0 (with a gradient path) when none does.

    ``torch.where`` rather than multiplication, so a non-finite value in an ignored row cannot reach the result
    (0 · NaN is NaN).
    """
    mask = mask.to(device=values.device, dtype=torch.bool)
    kept = torch.where(mask, values, torch.zeros_like(values))
    return kept.sum() / mask.sum().clamp(min=1).to(values.dtype)


def _zero(*tensors: Tensor) -> Tensor:
    """A scalar 0 tied to ``tensors``' graph, so ``backward`` works on a loss with no term to add."""
    return sum((t.sum() * 0.0 for t in tensors), tensors[0].new_zeros(()))


def reconstruction_loss(x: Tensor, x_hat: Tensor, mask: Tensor) -> Tensor:
    """Eq. 2 for one modality: the squared distance ‖x − x̂‖² between ``x`` and ``x_hat`` (both (B, D)), summed
    over the D features as eq. 2 writes it and averaged over the rows where ``mask`` (B,) holds.

    Summed, not averaged over the features: the KL term is a sum over the latents' dimensions, and against a
    per-feature mean β = 4 makes every latent cheaper left empty than used (on ``small``'s real features the
    posteriors collapsed onto the prior within 25 steps: KL 0.05, the classifiers at chance).
    """
    keep = mask.to(device=x_hat.device, dtype=torch.bool)[:, None]
    # Masking the difference before squaring keeps a NaN placeholder in an absent row out of the gradient too.
    difference = torch.where(keep, x - x_hat, torch.zeros_like(x_hat))
    return _masked_mean(difference.pow(2).sum(dim=-1), mask)


def kl_divergence(mu: Tensor, logvar: Tensor, mask: Tensor) -> Tensor:
    """KL(N(μ, σ²) ‖ N(0, I)) = ½ Σ_dims (μ² + σ² - log σ² - 1), averaged over present rows.

    ``mu``, ``logvar``: (B, Z); ``mask``: (B,).
    """
    per_row = 0.5 * (mu.pow(2) + logvar.exp() - logvar - 1.0).sum(dim=-1)
    return _masked_mean(per_row, mask)


def alignment_loss(shared: Mapping[str, Tensor], present: Mapping[str, Tensor]) -> Tensor:
    """Eq. 3: Σ over ordered pairs M ≠ N of ‖Z_S^M - Z_S^N‖².

    As written in the paper, each unordered pair counts twice. Each pair's squared distance is averaged over
    the rows where both modalities are present.

    Args:
        shared: ``{m: (B, Z)}`` shared latents.
        present: ``{m: bool (B,)}``; a modality missing here counts as present on every row.
    """
    names = list(shared)
    if not names:
        raise ValueError("alignment_loss needs at least one shared latent")
    total = _zero(*shared.values())
    for first, second in permutations(names, 2):
        a, b = shared[first], shared[second]
        both = _mask_of(present, first, a) & _mask_of(present, second, b)
        total = total + _masked_mean((a - b).pow(2).sum(dim=-1), both)
    return total


def _mask_of(present: Mapping[str, Tensor], name: str, like: Tensor) -> Tensor:
    mask = present.get(name)
    if mask is None:
        return torch.ones(like.shape[0], dtype=torch.bool, device=like.device)
    return mask.to(device=like.device, dtype=torch.bool)


def orthogonality_loss(latents: Sequence[Tensor], mask: Tensor) -> Tensor:
    """Eq. 4: Σ over unordered pairs (i, j) of one modality's latents of (z_i · z_j)², averaged over present rows.

    ``latents``: two or three (B, Z) tensors (shared, private[, identity]); ``mask``: (B,).
    """
    latents = list(latents)
    if len(latents) < 2:
        return _zero(*latents) if latents else mask.new_zeros((), dtype=torch.float32)
    per_row = sum((a * b).sum(dim=-1).pow(2) for a, b in combinations(latents, 2))
    return _masked_mean(per_row, mask)


def _pairwise_distances(z: Tensor) -> Tensor:
    """Euclidean distances (B, B) between the rows of ``z`` (B, Z), with a finite gradient at distance 0."""
    squared = (z[:, None, :] - z[None, :, :]).pow(2).sum(dim=-1)
    tiny = torch.finfo(z.dtype).tiny
    positive = squared > tiny
    # sqrt's derivative is infinite at 0 (e.g. the diagonal): route those entries through a constant instead.
    return torch.where(positive, squared.clamp(min=tiny).sqrt(), torch.zeros_like(squared))


def triplet_loss(z: Tensor, identities: Tensor, margin: float, mask: Tensor) -> Tensor:
    """Batch-all triplet loss (eq. 5's L_triplet): mean of relu(d(a, p) - d(a, n) + margin) over valid triplets.

    A triplet (a, p, n) is valid when a ≠ p share an identity, n has another one, and all three rows are
    present and of known identity. Every triplet of the batch is formed at once as a (B, B, B) tensor, which is
    cheap for the batch sizes used here (≤ 64).

    Args:
        z: (B, Z) identity latents.
        identities: (B,) long speaker ids; negative means unknown and excludes the row.
        margin: the triplet margin.
        mask: (B,) bool, rows that count.

    Returns:
        Scalar; 0 (with a gradient path) when the batch holds no valid triplet.
    """
    identities = identities.to(z.device)
    usable = mask.to(device=z.device, dtype=torch.bool) & (identities >= 0)
    pair_usable = usable[:, None] & usable[None, :]
    same = identities[:, None] == identities[None, :]
    not_self = ~torch.eye(z.shape[0], dtype=torch.bool, device=z.device)
    positive = same & not_self & pair_usable
    negative = ~same & pair_usable
    valid = positive[:, :, None] & negative[:, None, :]  # (anchor, positive, negative)

    distances = _pairwise_distances(z)
    violations = F.relu(distances[:, :, None] - distances[:, None, :] + margin)
    kept = torch.where(valid, violations, torch.zeros_like(violations))
    return kept.sum() / valid.sum().clamp(min=1).to(z.dtype)


def identity_classification_loss(
    logits: Mapping[str, Tensor], labels: Mapping[str, Tensor], mask: Tensor
) -> Tensor:
    """Eq. 5's L_cls: cross-entropy of each attribute's classifier, summed over attributes.

    Each attribute's cross-entropy is averaged over the rows that are present and annotated (label ≠ -100).
    Attributes without labels are skipped.

    Args:
        logits: ``{attribute: (B, C)}``.
        labels: ``{attribute: (B,) long}``, -100 for unknown.
        mask: (B,) bool.
    """
    total: Optional[Tensor] = None
    for name, attribute_logits in logits.items():
        target = labels.get(name)
        if target is None:
            continue
        keep = mask.to(device=attribute_logits.device, dtype=torch.bool)
        target = target.to(attribute_logits.device).long()
        target = torch.where(keep, target, torch.full_like(target, IGNORE_INDEX))
        # Summed then divided by hand: reduction="mean" is NaN when every label is ignored.
        summed = F.cross_entropy(attribute_logits, target, ignore_index=IGNORE_INDEX, reduction="sum")
        term = summed / (target != IGNORE_INDEX).sum().clamp(min=1).to(attribute_logits.dtype)
        total = term if total is None else total + term
    if total is None:
        total = _zero(*logits.values()) if logits else mask.new_zeros((), dtype=torch.float32)
    return total


def emotion_classification_loss(logits: Tensor, labels: Tensor, mask: Tensor) -> Tensor:
    """Cross-entropy of one modality's emotion logits (B, C) against ``labels`` (B,) (-100 unknown), over the
    rows where ``mask`` (B,) holds; 0 (with a gradient path) when none has a label."""
    return identity_classification_loss({"emotion": logits}, {"emotion": labels}, mask)


def pdr_loss(
    output: PDROutput,
    features: Mapping[str, Tensor],
    config: PDRConfig,
    identity_labels: Optional[Mapping[str, Tensor]] = None,
    identities: Optional[Tensor] = None,
    emotion_labels: Optional[Tensor] = None,
) -> Dict[str, Tensor]:
    """Eq. 1: L_PDR = L_recon + β L_KL + α L_align + γ L_ortho + δ L_identity, with every term reported,
    plus η L_emotion (:attr:`PDRConfig.eta`) where the module classifies emotions and ``emotion_labels``
    (B,) long (-100 unknown) are given.

    Sums over modalities: reconstruction over the three, KL over all eight latents, orthogonality within each
    modality, the identity loss (eq. 5: δ1 L_triplet + δ2 L_cls) over audio and video. Alignment, orthogonality
    and the triplet loss read the posterior means; only reconstruction reads the samples (as a VAE's decoder
    does). On a sample, E‖Z^M − Z^N‖² = ‖μ^M − μ^N‖² + Σσ²^M + Σσ²^N: the means' distance plus the variances,
    which the KL term already prices. Read on samples, the variances' noise (β pulls σ towards 1) drowned the
    means' differences: on ``tiny``, after 150 steps the shared means were one point for every utterance.

    Args:
        output: the module's output for ``features``.
        features: ``{m: (B, D_m)}``, the inputs (reconstruction targets); a modality left out adds nothing.
        config: the loss weights.
        identity_labels: ``{attribute: (B,) long}`` profile labels (-100 unknown), shared by the audio and
            video classifiers; ``None``: no classification term.
        identities: (B,) long speaker ids for the triplet loss (negative unknown); ``None``: no triplet term.

    Returns:
        ``{"pdr_recon", "pdr_kl", "pdr_align", "pdr_ortho", "pdr_triplet", "pdr_cls", "pdr_identity",
        "pdr_emotion", "loss"}``, each a scalar.
    """
    modalities = output.modalities
    anchor = _zero(*(output.mu[m]["shared"] for m in modalities))
    recon = kl = ortho = triplet = cls = anchor
    for m in modalities:
        mask = output.present[m]
        if m in features:
            x_hat = output.reconstruction[m]
            recon = recon + reconstruction_loss(features[m].to(x_hat), x_hat, mask)
        for kind in LATENT_KINDS[m]:
            kl = kl + kl_divergence(output.mu[m][kind], output.logvar[m][kind], mask)
        ortho = ortho + orthogonality_loss(output.latents(m, sampled=False), mask)
        if "identity" in output.mu[m]:
            if identities is not None:
                triplet = triplet + triplet_loss(output.mu[m]["identity"], identities, config.triplet_margin, mask)
            if identity_labels and output.identity_logits.get(m):
                cls = cls + identity_classification_loss(output.identity_logits[m], identity_labels, mask)
    align = alignment_loss(output.shared_means(), output.present)
    identity = config.delta_triplet * triplet + config.delta_cls * cls
    emotion = anchor
    if emotion_labels is not None and output.emotion_logits:
        for m in modalities:
            emotion = emotion + emotion_classification_loss(output.emotion_logits[m], emotion_labels, output.present[m])
    loss = recon + config.beta * kl + config.alpha * align + config.gamma * ortho + config.delta * identity
    loss = loss + config.eta * emotion
    return {
        "pdr_recon": recon,
        "pdr_kl": kl,
        "pdr_align": align,
        "pdr_ortho": ortho,
        "pdr_triplet": triplet,
        "pdr_cls": cls,
        "pdr_identity": identity,
        "pdr_emotion": emotion,
        "loss": loss,
    }
