"""MERIA's PDR module and UGF (empatheia.variants.disentangle, empatheia.variants.fusion): each loss term of
eqs. 1-5 against hand-computed numbers, the gates and fused vector of eqs. 6-8, the module's shapes, and a
small synthetic check that training with eq. 1 really makes the shared latents shared."""

from __future__ import annotations

import math

import pytest
import torch

from empatheia.variants.disentangle import (
    LATENT_KINDS,
    MODALITIES,
    BetaVAEEncoder,
    ParallelDisentangler,
    PDRConfig,
    PDROutput,
    alignment_loss,
    emotion_classification_loss,
    identity_classification_loss,
    kl_divergence,
    orthogonality_loss,
    pdr_loss,
    reconstruction_loss,
    reparameterize,
    triplet_loss,
)
from empatheia.variants.fusion import FusionOutput, UncertaintyGatedFusion, uncertainty_gated_fusion

DIMS = {"text": 6, "audio": 5, "video": 7}
PROFILE = {"gender": ("female", "male"), "age": ("child", "adult", "elderly")}
BOTH = torch.tensor([True, True])
FIRST = torch.tensor([True, False])
NONE = torch.tensor([False, False])


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def small_model(identity_labels=PROFILE, emotion_classes=0, **config) -> ParallelDisentangler:
    torch.manual_seed(0)
    return ParallelDisentangler(DIMS, PDRConfig(latent_dim=3, hidden_dim=8, **config), identity_labels, emotion_classes)


def features(batch: int = 4):
    return {m: torch.randn(batch, d) for m, d in DIMS.items()}


def assert_empty_is_zero(loss: torch.Tensor, *leaves: torch.Tensor):
    """An all-absent mask: exactly 0, finite, and backward runs and leaves finite (zero) gradients."""
    assert loss.item() == 0.0 and torch.isfinite(loss)
    loss.backward()
    for leaf in leaves:
        assert leaf.grad is not None and torch.isfinite(leaf.grad).all() and not leaf.grad.any()


# ---------------------------------------------------------------------------------------------------------
# Loss terms by hand


def test_reconstruction_loss_is_the_squared_distance_over_present_rows():
    x, x_hat = t([[1, 2], [3, 4]]), t([[0, 0], [3, 5]])
    # row 0: 1² + 2² = 5; row 1: 0² + 1² = 1; mean over rows = 3
    assert reconstruction_loss(x, x_hat, BOTH).item() == pytest.approx(3.0)
    # row 1 absent: only row 0 counts, whatever row 1 holds
    assert reconstruction_loss(x, x_hat, FIRST).item() == pytest.approx(5.0)
    assert reconstruction_loss(t([[1, 2], [float("nan"), 9]]), x_hat, FIRST).item() == pytest.approx(5.0)
    x_hat = x_hat.requires_grad_()
    assert_empty_is_zero(reconstruction_loss(x, x_hat, NONE), x_hat)


def test_reconstruction_loss_gradient_ignores_a_nan_placeholder_in_an_absent_row():
    x_hat = t([[0, 0], [3, 5]]).requires_grad_()
    reconstruction_loss(t([[1, 2], [float("nan"), 9]]), x_hat, FIRST).backward()
    # d/dx̂ of (x̂ - x)² summed over the features on row 0 = 2 (x̂ - x); row 1 gets nothing
    assert torch.equal(x_hat.grad, t([[-2, -4], [0, 0]]))


def test_kl_divergence_against_the_closed_form():
    mu, logvar = t([[1, 0], [0, 2]]), t([[0, 0], [math.log(2), 0]])
    # row 0: ½[(1 + 1 - 0 - 1) + (0 + 1 - 0 - 1)] = 0.5
    # row 1: ½[(0 + 2 - ln2 - 1) + (4 + 1 - 0 - 1)] = 2.5 - ½ln2
    row0, row1 = 0.5, 2.5 - 0.5 * math.log(2)
    assert kl_divergence(mu, logvar, BOTH).item() == pytest.approx((row0 + row1) / 2)
    assert kl_divergence(mu, logvar, FIRST).item() == pytest.approx(row0)
    # the standard normal itself costs nothing
    assert kl_divergence(torch.zeros(2, 3), torch.zeros(2, 3), BOTH).item() == 0.0
    mu.requires_grad_()
    logvar.requires_grad_()
    assert_empty_is_zero(kl_divergence(mu, logvar, NONE), mu, logvar)


def test_alignment_loss_sums_ordered_pairs_each_over_rows_where_both_are_present():
    shared = {"text": t([[1, 0], [0, 0]]), "audio": t([[0, 0], [0, 0]]), "video": t([[1, 1], [2, 0]])}
    present = {"text": BOTH, "audio": BOTH, "video": FIRST}
    # text-audio: rows (1, 0) → 0.5; text-video: row 0 only, ‖(0, -1)‖² = 1; audio-video: row 0 only, 1 + 1 = 2
    # each unordered pair twice (M ≠ N ordered, eq. 3): 2 × (0.5 + 1 + 2) = 7
    assert alignment_loss(shared, present).item() == pytest.approx(7.0)
    # video's absent row 1 may hold anything
    shared["video"] = t([[1, 1], [100, -50]])
    assert alignment_loss(shared, present).item() == pytest.approx(7.0)
    # two modalities, one row: 2 × ‖(1, 0)‖² = 2
    assert alignment_loss({"text": shared["text"], "audio": shared["audio"]}, {"audio": FIRST}).item() == 2.0
    leaves = {m: z.clone().requires_grad_() for m, z in shared.items()}
    assert_empty_is_zero(alignment_loss(leaves, {"text": FIRST, "audio": NONE, "video": ~FIRST}), *leaves.values())


def test_orthogonality_loss_sums_squared_dot_products_of_each_pair():
    s, p, i = t([[1, 2], [1, 0]]), t([[3, 0], [0, 1]]), t([[0, 1], [2, 2]])
    # row 0: (s·p)² + (s·i)² + (p·i)² = 3² + 2² + 0² = 13; row 1: 0² + 2² + 2² = 8; mean 10.5
    assert orthogonality_loss([s, p, i], BOTH).item() == pytest.approx(10.5)
    assert orthogonality_loss([s, p, i], FIRST).item() == pytest.approx(13.0)
    # text has two latents: row 0: 3² = 9, row 1: 0 → 4.5
    assert orthogonality_loss([s, p], BOTH).item() == pytest.approx(4.5)
    s.requires_grad_()
    assert_empty_is_zero(orthogonality_loss([s, p, i], NONE), s)


def test_triplet_loss_with_one_violating_positive_pair():
    # rows 0 and 1 are the same speaker, row 2 another; row 3 is unknown (-1) and row 4 absent, both sitting
    # right on top of row 0 where, counted, they would change everything.
    z = t([[0, 0], [3, 0], [1, 0], [0, 0.1], [0.1, 0]]).requires_grad_()
    identities = torch.tensor([0, 0, 1, -1, 1])
    mask = torch.tensor([True, True, True, True, False])
    # The valid triplets are (a=0, p=1, n=2) and (a=1, p=0, n=2):
    #   d(0,1) = 3, d(0,2) = 1: relu(3 - 1 + 1) = 3;  d(1,0) = 3, d(1,2) = 2: relu(3 - 2 + 1) = 2; mean 2.5
    loss = triplet_loss(z, identities, margin=1.0, mask=mask)
    assert loss.item() == pytest.approx(2.5)
    loss.backward()
    assert torch.isfinite(z.grad).all()
    assert not z.grad[3:].any()  # neither the unknown nor the absent row is pulled
    # a larger margin adds to both: (3 + 1) and (2 + 1) → 3.5
    assert triplet_loss(z, identities, margin=2.0, mask=mask).item() == pytest.approx(3.5)


def test_triplet_loss_is_zero_when_the_margin_holds_or_no_triplet_is_valid():
    z = t([[0, 0], [0.5, 0], [5, 0]])
    # d(0,1) = 0.5 against d(0,2) = 5 and d(1,2) = 4.5: both triplets satisfy the margin of 1
    assert triplet_loss(z, torch.tensor([0, 0, 1]), 1.0, torch.ones(3, dtype=torch.bool)).item() == 0.0
    for identities in ([0, 1, 2], [4, 4, 4], [0, 0, -1]):  # no positive / no negative / negative unknown
        leaf = z.clone().requires_grad_()
        loss = triplet_loss(leaf, torch.tensor(identities), 1.0, torch.ones(3, dtype=torch.bool))
        assert_empty_is_zero(loss, leaf)
    leaf = z.clone().requires_grad_()
    assert_empty_is_zero(triplet_loss(leaf, torch.tensor([0, 0, 1]), 1.0, torch.zeros(3, dtype=torch.bool)), leaf)


def test_triplet_loss_gradient_is_finite_for_identical_rows():
    z = t([[1, 1], [1, 1], [1, 1]]).requires_grad_()
    loss = triplet_loss(z, torch.tensor([0, 0, 1]), 1.0, torch.ones(3, dtype=torch.bool))
    assert loss.item() == pytest.approx(1.0)  # every distance 0: relu(0 - 0 + 1)
    loss.backward()
    assert torch.isfinite(z.grad).all()


def test_identity_classification_loss_sums_attribute_cross_entropies():
    logits = {"gender": t([[0, 0], [math.log(3), 0]]), "age": torch.zeros(2, 3)}
    labels = {"gender": torch.tensor([0, 1]), "age": torch.tensor([-100, 2])}
    # gender: row 0 -log(½) = ln2; row 1 -log(1 / (3 + 1)) = ln4; mean 1.5 ln2
    # age: row 0 unannotated, row 1 uniform over 3 → ln3
    expected = 1.5 * math.log(2) + math.log(3)
    assert identity_classification_loss(logits, labels, BOTH).item() == pytest.approx(expected)
    # row 1 absent: gender ln2, age has no annotated present row → 0
    assert identity_classification_loss(logits, labels, FIRST).item() == pytest.approx(math.log(2))
    # an attribute without labels is skipped
    assert identity_classification_loss(logits, {"gender": labels["gender"]}, BOTH).item() == pytest.approx(
        1.5 * math.log(2)
    )
    leaves = {k: v.clone().requires_grad_() for k, v in logits.items()}
    assert_empty_is_zero(identity_classification_loss(leaves, labels, NONE), *leaves.values())


def test_pdr_loss_is_eq_1_over_its_reported_terms():
    model = small_model(
        emotion_classes=4, beta=0.3, alpha=2.0, gamma=0.7, delta=1.5, delta_triplet=0.4, delta_cls=2.5,
        triplet_margin=3.0, eta=0.6,
    ).eval()  # eval: z = mu, so recomputing the terms below is deterministic
    batch = features(6)
    present = {"text": torch.ones(6, dtype=torch.bool), "audio": torch.tensor([1, 1, 1, 1, 0, 1]).bool()}
    out = model(batch, present)
    profile = {"gender": torch.tensor([0, 1, 0, 1, -100, 1]), "age": torch.tensor([2, 0, 1, -100, 1, 0])}
    speakers = torch.tensor([0, 0, 1, 1, 2, -1])
    emotions = torch.tensor([0, 3, 1, -100, 2, 2])
    terms = pdr_loss(out, batch, model.config, profile, speakers, emotions)

    assert set(terms) == {
        "pdr_recon", "pdr_kl", "pdr_align", "pdr_ortho", "pdr_triplet", "pdr_cls", "pdr_identity", "pdr_emotion",
        "loss",
    }
    c = model.config
    assert terms["pdr_identity"].item() == pytest.approx(
        c.delta_triplet * terms["pdr_triplet"].item() + c.delta_cls * terms["pdr_cls"].item(), rel=1e-5
    )
    expected = (
        terms["pdr_recon"] + c.beta * terms["pdr_kl"] + c.alpha * terms["pdr_align"]
        + c.gamma * terms["pdr_ortho"] + c.delta * terms["pdr_identity"] + c.eta * terms["pdr_emotion"]
    )
    assert terms["loss"].item() == pytest.approx(expected.item(), rel=1e-5)
    for name, value in terms.items():
        assert torch.isfinite(value) and value.item() > 0, name

    # Each term is the sum of the pure functions over the modalities (and latents) that have it.
    recon = sum(reconstruction_loss(batch[m], out.reconstruction[m], out.present[m]) for m in MODALITIES)
    kl = sum(
        kl_divergence(out.mu[m][k], out.logvar[m][k], out.present[m]) for m in MODALITIES for k in LATENT_KINDS[m]
    )
    ortho = sum(orthogonality_loss(out.latents(m, sampled=False), out.present[m]) for m in MODALITIES)
    triplet = sum(triplet_loss(out.mu[m]["identity"], speakers, 3.0, out.present[m]) for m in ("audio", "video"))
    cls = sum(identity_classification_loss(out.identity_logits[m], profile, out.present[m]) for m in ("audio", "video"))
    emotion = sum(emotion_classification_loss(out.emotion_logits[m], emotions, out.present[m]) for m in MODALITIES)
    # The one classifier reads every modality's shared mean.
    assert torch.equal(out.emotion_logits["audio"], model.emotion_classifier(out.mu["audio"]["shared"]))
    for name, value in {"recon": recon, "kl": kl, "ortho": ortho, "triplet": triplet, "cls": cls,
                        "emotion": emotion}.items():
        assert terms[f"pdr_{name}"].item() == pytest.approx(value.item(), rel=1e-5), name
    assert terms["pdr_align"].item() == pytest.approx(alignment_loss(out.shared_means(), out.present).item())
    terms["loss"].backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_pdr_loss_ignores_absent_rows_and_missing_modalities():
    model = small_model().eval()
    batch = features(4)
    present = {"video": torch.tensor([True, True, False, True])}
    reference = pdr_loss(model(batch, present), batch, model.config)["loss"]
    changed = dict(batch, video=batch["video"].clone())
    changed["video"][2] = float("nan")
    terms = pdr_loss(model(changed, present), changed, model.config)
    assert terms["loss"].item() == pytest.approx(reference.item(), rel=1e-6)
    terms["loss"].backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)

    # no identities or profile labels: the identity terms are 0
    assert terms["pdr_triplet"].item() == 0.0 and terms["pdr_cls"].item() == 0.0
    # video left out altogether counts as absent everywhere: same as an all-False mask
    without = {m: x for m, x in batch.items() if m != "video"}
    out = model(without)
    assert not out.present["video"].any() and out.present["text"].all()
    all_false = {"video": torch.zeros(4, dtype=torch.bool)}
    assert pdr_loss(out, without, model.config)["loss"].item() == pytest.approx(
        pdr_loss(model(batch, all_false), batch, model.config)["loss"].item(), rel=1e-6
    )


# ---------------------------------------------------------------------------------------------------------
# Module shapes


def test_eight_encoders_three_decoders_and_classifiers_on_audio_and_video_only():
    model = small_model()
    assert set(model.encoders) == {
        "text_shared", "text_private",
        "audio_shared", "audio_private", "audio_identity",
        "video_shared", "video_private", "video_identity",
    }
    assert set(model.decoders) == set(MODALITIES)
    assert set(model.identity_classifiers) == {"audio", "video"}
    for heads in model.identity_classifiers.values():
        assert set(heads) == set(PROFILE)
    assert not small_model(identity_labels={}).identity_classifiers

    out = model(features(4))
    assert isinstance(out, PDROutput)
    assert set(out.mu["text"]) == {"shared", "private"}
    assert set(out.mu["audio"]) == set(out.mu["video"]) == {"shared", "private", "identity"}
    for m in MODALITIES:
        assert out.reconstruction[m].shape == (4, DIMS[m])
        assert out.present[m].dtype == torch.bool and out.present[m].all()
        for source in (out.mu, out.logvar, out.z):
            assert all(v.shape == (4, 3) for v in source[m].values())
    assert set(out.identity_logits) == {"audio", "video"}
    assert out.identity_logits["video"]["age"].shape == (4, 3)
    assert out.identity_logits["audio"]["gender"].shape == (4, 2)
    assert small_model(identity_labels={})(features(2)).identity_logits == {}


def test_encoder_clamps_logvar_and_reparameterizes_only_while_training():
    encoder = BetaVAEEncoder(4, 8, 3)
    with torch.no_grad():
        encoder.logvar.bias.fill_(1e4)
    mu, logvar = encoder(torch.randn(5, 4))
    assert mu.shape == logvar.shape == (5, 3)
    assert logvar.max().item() == 10.0 and torch.isfinite(logvar.exp()).all()
    assert reparameterize(mu, logvar, training=False) is mu
    torch.manual_seed(0)
    sample = reparameterize(torch.zeros(20000, 1), torch.full((20000, 1), math.log(4.0)), training=True)
    assert sample.std().item() == pytest.approx(2.0, rel=0.05)


# ---------------------------------------------------------------------------------------------------------
# Uncertainty-Gated Fusion


def hand_output(shared, private_logvar, present=None, batch=2):
    """A PDROutput holding only what UGF reads: shared means, private log-variances (and identity / private
    means for the pass-through)."""
    z = next(iter(shared.values())).shape[-1]
    mu, logvar = {}, {}
    for i, m in enumerate(MODALITIES):
        mu[m] = {kind: torch.full((batch, z), float(10 * i + j)) for j, kind in enumerate(LATENT_KINDS[m])}
        mu[m]["shared"] = shared[m]
        logvar[m] = {kind: torch.zeros(batch, z) for kind in LATENT_KINDS[m]}
        logvar[m]["private"] = private_logvar[m]
    present = {m: (present or {}).get(m, torch.ones(batch, dtype=torch.bool)) for m in MODALITIES}
    reconstruction = {m: torch.zeros(batch, DIMS[m]) for m in MODALITIES}
    return PDROutput(mu, logvar, mu, reconstruction, present)


def constant(value, batch=2, z=2):
    return torch.full((batch, z), float(value))


def test_ugf_gates_by_private_certainty_by_hand():
    shared = {"text": t([[1, 0], [1, 0]]), "audio": t([[0, 1], [0, 1]]), "video": t([[5, 5], [5, 5]])}
    logvar = {"text": constant(0), "audio": constant(math.log(0.5)), "video": constant(0)}
    out = uncertainty_gated_fusion(hand_output(shared, logvar, {"video": FIRST}), eps=0.0)
    # row 1 without video: T^T = 1 / 1 = 1, T^A = 1 / 0.5 = 2 → softmax: w^T = 1 / (1 + e), w^A = e / (1 + e)
    w_t, w_a = 1 / (1 + math.e), math.e / (1 + math.e)
    assert out.weights[1].tolist() == pytest.approx([w_t, w_a, 0.0])
    assert out.fused[1].tolist() == pytest.approx([w_t, w_a])
    # conflict: w^T ‖(1, 0) - (w_t, w_a)‖² + w^A ‖(0, 1) - (w_t, w_a)‖² = 2 w_t w_a (w_a + w_t) = 2 w_t w_a
    assert out.conflict[1].item() == pytest.approx(2 * w_t * w_a)
    # row 0 with video: softmax over (1, 2, 1)
    norm = 2 + math.e
    assert out.weights[0].tolist() == pytest.approx([1 / norm, math.e / norm, 1 / norm])
    assert out.weights.sum(dim=1).tolist() == pytest.approx([1.0, 1.0])


def test_ugf_favours_the_modality_with_the_most_certain_private_latent():
    model = small_model().eval()
    with torch.no_grad():
        pdr = model(features(4))
    pdr.logvar["audio"]["private"] = torch.full((4, 3), -5.0)
    pdr.logvar["text"]["private"] = torch.full((4, 3), 0.5)
    pdr.logvar["video"]["private"] = torch.full((4, 3), 1.0)
    out = uncertainty_gated_fusion(pdr)
    assert isinstance(out, FusionOutput)
    assert out.fused.shape == (4, 3) and out.weights.shape == (4, 3) and out.conflict.shape == (4,)
    assert (out.weights.argmax(dim=1) == MODALITIES.index("audio")).all()
    distances = torch.stack([(out.fused - pdr.mu[m]["shared"]).norm(dim=-1) for m in MODALITIES], dim=1)
    assert (distances.argmin(dim=1) == MODALITIES.index("audio")).all()


def test_lowering_a_private_variance_raises_its_weight_monotonically():
    shared = {m: torch.randn(2, 2) for m in MODALITIES}
    audio_weights = []
    for value in (1.0, 0.0, -0.5, -1.0, -2.0, -4.0):
        logvar = {"text": constant(0), "audio": constant(value), "video": constant(0.3)}
        out = uncertainty_gated_fusion(hand_output(shared, logvar))
        audio_weights.append(out.weights[:, MODALITIES.index("audio")])
    weights = torch.stack(audio_weights)
    assert (weights[1:] > weights[:-1]).all()


def test_an_absent_modality_gets_no_weight_and_no_say():
    shared = {m: torch.randn(2, 2) for m in MODALITIES}
    logvar = {"text": constant(0), "audio": constant(0.5), "video": constant(-3)}  # video would dominate
    present = {"video": FIRST}
    out = uncertainty_gated_fusion(hand_output(shared, logvar, present))
    assert out.weights[1, 2].item() == 0.0 and out.weights[1].sum().item() == pytest.approx(1.0)
    moved = dict(shared, video=t([[0, 0], [1e3, -1e3]]))
    again = uncertainty_gated_fusion(hand_output(moved, logvar, present))
    assert torch.equal(again.fused[1], out.fused[1]) and torch.equal(again.weights, out.weights)
    # the pass-through means are zeroed where video is absent (hand_output: audio private 11, identity 12;
    # video identity 22)
    assert out.identity.shape == out.private.shape == (2, 4)
    assert out.identity[0].tolist() == [12.0, 12.0, 22.0, 22.0]
    assert out.identity[1].tolist() == [12.0, 12.0, 0.0, 0.0]
    assert out.private[1].tolist() == [11.0, 11.0, 0.0, 0.0]


def test_a_row_with_nothing_present_fuses_to_zeros():
    shared = {m: torch.randn(2, 2) for m in MODALITIES}
    logvar = {m: constant(0).requires_grad_() for m in MODALITIES}
    out = uncertainty_gated_fusion(hand_output(shared, logvar, dict.fromkeys(MODALITIES, FIRST)))
    assert not out.weights[1].any() and not out.fused[1].any() and out.conflict[1].item() == 0.0
    assert torch.isfinite(out.weights).all()
    (out.fused.sum() + out.conflict.sum()).backward()
    assert all(torch.isfinite(v.grad).all() for v in logvar.values())


def test_ungated_fusion_is_uniform_over_present_modalities():
    shared = {m: torch.randn(2, 2) for m in MODALITIES}
    logvar = {"text": constant(0), "audio": constant(-6), "video": constant(2)}
    out = uncertainty_gated_fusion(hand_output(shared, logvar, {"audio": FIRST}), gated=False)
    assert out.weights[0].tolist() == pytest.approx([1 / 3] * 3)
    assert out.weights[1].tolist() == pytest.approx([0.5, 0.0, 0.5])
    assert torch.allclose(out.fused[1], (shared["text"][1] + shared["video"][1]) / 2)
    module = UncertaintyGatedFusion(gated=False)
    assert not list(module.parameters())
    assert torch.equal(module(hand_output(shared, logvar, {"audio": FIRST})).weights, out.weights)


def test_conflict_is_zero_when_the_modalities_agree_and_positive_otherwise():
    logvar = {"text": constant(0), "audio": constant(-1), "video": constant(1)}
    agree = {m: t([[1, 2], [3, 4]]) for m in MODALITIES}
    out = uncertainty_gated_fusion(hand_output(agree, logvar))
    assert out.conflict.tolist() == pytest.approx([0.0, 0.0], abs=1e-6)
    assert torch.allclose(out.fused, agree["text"])
    disagree = dict(agree, video=t([[1, 2], [0, 0]]))
    out = uncertainty_gated_fusion(hand_output(disagree, logvar))
    assert out.conflict[0].item() == pytest.approx(0.0, abs=1e-6) and out.conflict[1].item() > 0


# ---------------------------------------------------------------------------------------------------------
# Disentanglement sanity check


def _cross_modal_distance_ratio(model: ParallelDisentangler, batch) -> float:
    """Mean distance between two modalities' shared means of the same example, over that of different ones."""
    model.eval()
    with torch.no_grad():
        shared = model(batch).shared_means()
    same, different = [], []
    off_diagonal = ~torch.eye(next(iter(batch.values())).shape[0], dtype=torch.bool)
    for i, first in enumerate(MODALITIES):
        for second in MODALITIES[i + 1:]:
            distances = torch.cdist(shared[first], shared[second])
            same.append(distances.diagonal().mean())
            different.append(distances[off_diagonal].mean())
    return (torch.stack(same).mean() / torch.stack(different).mean()).item()


@pytest.fixture
def one_thread():
    """Tiny matrices gain nothing from intra-op threads, and on a busy machine spinning threads can make
    this short training run a hundred times slower; restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_training_with_eq_1_makes_the_shared_latents_shared(one_thread):
    """Each example's emotion code e_i reaches the three modalities through three different fixed linear maps,
    next to modality-private content and noise; after a short training the three shared means of one example
    sit much closer to each other than to other examples'."""
    torch.manual_seed(0)
    emotion_dim, private_dim, examples = 4, 4, 256
    emotions = torch.randn(examples, emotion_dim)
    data = {
        m: emotions @ torch.randn(emotion_dim, d) + torch.randn(examples, private_dim) @ torch.randn(private_dim, d)
        + 0.1 * torch.randn(examples, d)
        for m, d in {"text": 24, "audio": 32, "video": 40}.items()
    }
    # The latent is as wide as each source: private alone cannot carry everything, so the decoders need shared.
    config = PDRConfig(latent_dim=4, hidden_dim=64, beta=0.5)
    model = ParallelDisentangler({m: x.shape[1] for m, x in data.items()}, config, {})
    held_out = {m: x[:64] for m, x in data.items()}
    before = _cross_modal_distance_ratio(model, held_out)

    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(200):
        rows = torch.randint(0, examples, (32,))
        batch = {m: x[rows] for m, x in data.items()}
        loss = pdr_loss(model(batch), batch, config)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    after = _cross_modal_distance_ratio(model, held_out)
    assert before > 0.8, before  # untrained, one example's modalities are no closer than strangers
    assert after < 0.5, after
