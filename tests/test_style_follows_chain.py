"""The emotion that styles the voice and the face is fused with the chain's
(``style_disentangler.chain_emotion_prior_weight``): the head's arithmetic, the fold of the
chain's labels onto the classes, the config's check and what an eval run records.
``tests/test_small_preset.py`` checks it on the shipped weights."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from empatheia import Empatheia, EmpatheiaConfig
from empatheia.config import StyleDisentanglerConfig
from empatheia.heads import StyleDisentangler

CHAIN_LABELS = ["sad", "joyful", "afraid", "terrified", "content"]
"""Fold onto tiny's classes: sad, happy, fear, fear and (the built-in fold) happy."""


def _head() -> StyleDisentangler:
    config = StyleDisentanglerConfig(d_model=32, num_heads=4, num_layers=1, ffn_dim=64, latent_dim=16,
                                     dropout=0.0, num_queries=2, speech_style_dim=6, video_style_dim=6)
    torch.manual_seed(0)
    head = StyleDisentangler(config, 24, 4).eval()
    with torch.no_grad():  # a distinct style offset per emotion class
        head.class_styles["emotion"].weight.copy_(torch.randn(12, len(config.emotion_labels)))
    return head


@torch.no_grad()
def test_the_prior_is_added_to_the_classifiers_log_probabilities_and_picks_the_offsets():
    head = _head()
    speech, video = torch.randn(3, 4, 24), torch.randn(3, 4, 24)
    alone = head(speech, video)
    zeros = head(speech, video, emotion_prior=torch.zeros(3, 7))
    assert torch.allclose(zeros.emotion_logits, alone.emotion_logits.log_softmax(-1), atol=1e-6)
    assert torch.allclose(zeros.speech_style, alone.speech_style, atol=1e-6)
    prior = torch.randn(3, 7)
    fused = head(speech, video, emotion_prior=prior)
    assert torch.allclose(fused.emotion_logits, alone.emotion_logits.log_softmax(-1) + prior, atol=1e-5)
    # Only the offsets move: by the table times the change of the class probabilities.
    table = head.class_styles["emotion"].weight  # (12, 7)
    moved = (fused.emotion_logits.softmax(-1) - alone.emotion_logits.softmax(-1)) @ table.T
    assert torch.allclose(torch.cat([fused.speech_style, fused.video_style], -1)
                          - torch.cat([alone.speech_style, alone.video_style], -1), moved, atol=1e-5)
    # A sure prior decides the class and brings that class's offset.
    sure = head(speech, video, emotion_prior=torch.full((3, 7), -30.0).index_fill(1, torch.tensor([4]), 0.0))
    assert sure.emotion_logits.argmax(-1).tolist() == [4, 4, 4]
    assert torch.allclose(sure.speech_style - alone.speech_style,
                          (torch.eye(7)[4] - alone.emotion_logits.softmax(-1)) @ table[:6].T, atol=1e-4)
    assert torch.equal(fused.profile_logits["age"], alone.profile_logits["age"])


def _tiny(weight: float) -> Empatheia:
    config = EmpatheiaConfig.from_preset("tiny", {
        "language_model.chain_emotions": CHAIN_LABELS,
        "style_disentangler.chain_emotion_prior_weight": weight,
    })
    return Empatheia(config).eval()


def test_the_chains_labels_fold_onto_the_classes_and_weigh_as_set():
    model = _tiny(2.0)
    classes = model.config.style_disentangler.emotion_labels
    chain = torch.tensor([[0.1, 0.2, 0.3, 0.3, 0.1], [0.5, 0.1, 0.1, 0.1, 0.2]]).log()
    chain = torch.cat([chain, torch.full((1, 5), float("nan"))])  # a row whose chain has no emotion step
    prior = model.style_emotion_prior(chain)
    assert prior.shape == (3, len(classes))
    expected = {"sad": 0.1, "happy": 0.3, "fear": 0.6}
    for name, mass in expected.items():
        assert float(prior[0, classes.index(name)]) == pytest.approx(2.0 * math.log(mass), abs=1e-5)
    assert float(prior[1, classes.index("sad")]) == pytest.approx(2.0 * math.log(0.5), abs=1e-5)
    others = [classes.index(c) for c in classes if c not in expected]
    assert bool((prior[:2, others] < -50).all())  # no mass: as good as ruled out, yet finite
    assert torch.isfinite(prior).all()
    assert torch.equal(prior[2], torch.zeros(len(classes)))  # no say where the chain named none
    assert _tiny(0.0).style_emotion_prior(chain) is None
    assert model.style_emotion_prior(None) is None  # no chain labels configured


def test_a_fine_tuned_label_set_reads_only_the_chain_labels_it_knows():
    """A dataset's own classes (downstream fine-tuning): the mass of chain labels its fold
    does not reach says nothing, so it is spread evenly over the classes."""
    from empatheia.labels import LabelSets

    model = _tiny(1.0).set_label_sets(LabelSets(emotions=["calm", "happy"], emotion_fold={"joyful": "happy"},
                                                emotion_fold_replace=True))
    chain = torch.tensor([[0.1, 0.6, 0.1, 0.1, 0.1], [0.5, 0.0, 0.2, 0.2, 0.1]]).clamp_min(1e-30).log()
    prior = model.style_emotion_prior(chain)
    assert prior[0].exp().tolist() == pytest.approx([0.2, 0.8], abs=1e-5)  # "joyful" 0.6 to happy, 0.4 unread
    assert prior[1].exp().tolist() == pytest.approx([0.5, 0.5], abs=1e-5)  # nothing it can read: no preference


@pytest.mark.parametrize("weight", [-1.0, float("inf"), float("nan")])
def test_the_weight_must_be_finite_and_not_negative(weight):
    with pytest.raises(ValueError, match="style_disentangler.chain_emotion_prior_weight must be a finite number"):
        EmpatheiaConfig.from_preset("tiny", {"style_disentangler.chain_emotion_prior_weight": weight})


def test_an_eval_run_records_the_weight_and_does_not_resume_under_another(tmp_path):
    from empatheia.evaluation.model_runs import RunMismatchError, RunOptions, check_run_info

    model = _tiny(1.0)
    options = RunOptions(info={"model": "small"})
    recorded = options.run_info(model.config.language_model, model.config.style_disentangler)
    assert recorded["chain_emotion_prior_weight"] == 1.0
    check_run_info(tmp_path, recorded)
    (tmp_path / "predictions.jsonl").write_text('{"id": "a", "text": "Oh."}\n')
    check_run_info(tmp_path, recorded)
    with pytest.raises(RunMismatchError, match="chain_emotion_prior_weight: was 1.0, now 0.0"):
        check_run_info(tmp_path, options.run_info(model.config.language_model, _tiny(0.0).config.style_disentangler))
    # A run written before the weight existed styled by the head alone.
    older = {k: v for k, v in options.run_info(model.config.language_model, model.config.style_disentangler).items()
             if k != "chain_emotion_prior_weight"}
    (tmp_path / "run.json").write_text(json.dumps(older))
    check_run_info(tmp_path, dict(older, chain_emotion_prior_weight=0.0))
    with pytest.raises(RunMismatchError, match="chain_emotion_prior_weight"):
        check_run_info(tmp_path, recorded)



def test_the_paired_style_bench_scores_both_runs_against_the_reference_and_their_chains(tmp_path, capsys, monkeypatch):
    """bench/paired_style_emotion.py on three examples: run A styles by its chain (right on
    two), run B styles one answer against its chain (right on one)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "bench"))
    from paired_style_emotion import main

    def write(folder, rows, name="predictions.jsonl"):
        folder.mkdir(exist_ok=True)
        (folder / name).write_text("".join(json.dumps(row) + "\n" for row in rows))

    gold = ["sad", "happy", "fear"]
    write(tmp_path / "a", [{"id": f"c{i}", "response": "Oh.", "emotion": g} for i, g in enumerate(gold)], "references.jsonl")
    chains = ["devastated", "joyful", "angry"]
    write(tmp_path / "a", [{"id": f"c{i}", "text": "Oh.", "emotion": e, "chain_emotion": c}
                           for i, (e, c) in enumerate(zip(["sad", "happy", "angry"], chains))])
    write(tmp_path / "b", [{"id": f"c{i}", "text": "Oh.", "emotion": e, "chain_emotion": c}
                           for i, (e, c) in enumerate(zip(["angry", "happy", "angry"], chains))])
    main([str(tmp_path / "a"), str(tmp_path / "b")])
    out = capsys.readouterr().out.splitlines()
    assert "on 2 of 3 (66.7%), as its own chain's on 3 (100.0%)" in out[0]
    assert "on 1 of 3 (33.3%), as its own chain's on 2 (66.7%)" in out[1]
    assert "A - B: +0.3333" in out[2] and "only A right on 1, only B on 0" in out[2] and "styled differently on 1" in out[2]
    write(tmp_path / "b", [{"id": "c0", "text": "Oh.", "emotion": "sad"}])
    with pytest.raises(SystemExit, match=r"run B: 2 reference id\(s\) .* without a prediction: \['c1', 'c2'\]"):
        main([str(tmp_path / "a"), str(tmp_path / "b")])
