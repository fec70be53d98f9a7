"""Configs, presets and YAML, and the paper preset's full-size shapes (no download)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from empatheia import Empatheia, EmpatheiaConfig

from .conftest import full_batch, make_dialogue

PAPER_RANDOM = {
    "language_model.pretrained": None,
    "speech_encoder.pretrained": None,
    "video_encoder.pretrained": None,
    "language_model.tokenizer": "builtin",
}


def test_yaml_round_trip(tmp_path):
    for name in ("tiny", "paper"):
        config = EmpatheiaConfig.from_preset(name)
        config.save_yaml(tmp_path / f"{name}.yaml")
        assert EmpatheiaConfig.load_yaml(tmp_path / f"{name}.yaml") == config


def test_unknown_keys_are_errors_that_name_them(tmp_path):
    config = EmpatheiaConfig.from_preset("tiny")
    with pytest.raises(KeyError, match="loss.gamma"):
        config.update({"loss.gamma": 1.0})
    with pytest.raises(KeyError, match="decoder"):
        config.update({"decoder.layers": 2})
    config.update({"loss.alpha": 0.5, "language_model.lora.r": 8})
    assert config.loss.alpha == 0.5 and config.language_model.lora.r == 8
    path = tmp_path / "bad.yaml"
    path.write_text("loss:\n  alpha: 0.2\n  gama: 1\n")
    with pytest.raises(KeyError, match=r"bad.yaml:loss: unknown key\(s\) \['gama'\]"):
        EmpatheiaConfig.load_yaml(path)
    path.write_text("- a list\n")
    with pytest.raises(ValueError, match="bad.yaml: expected a mapping"):
        EmpatheiaConfig.load_yaml(path)
    with pytest.raises(ValueError, match="unknown preset"):
        EmpatheiaConfig.from_preset("huge")


def test_paper_preset_matches_the_paper():
    c = EmpatheiaConfig.from_preset("paper")
    assert c.language_model.pretrained == "lmsys/vicuna-7b-v1.5"
    assert c.language_model.hidden_size == 4096
    assert (c.language_model.lora.r, c.language_model.lora.alpha) == (16, 32)
    assert c.language_model.num_signal_tokens == 16
    assert c.speech_encoder.pretrained == "facebook/hubert-large-ll60k" and c.speech_encoder.hidden_size == 1024
    assert (c.video_encoder.model_name, c.video_encoder.pretrained) == ("ViT-L-14-336", "openai")
    assert (c.video_encoder.embed_dim, c.video_encoder.image_size) == (768, 336)
    assert c.content_synchronizer.num_layers == c.style_disentangler.num_layers == 4
    # StyleTTS2: text encoder 512 + PL-BERT projection 512 per phoneme; style 128 + 128.
    assert c.content_synchronizer.speech_content_dim == 1024 and c.style_disentangler.speech_style_dim == 256
    # DreamTalk: 11-frame window x 256 per video frame; style code 256.
    assert c.content_synchronizer.video_content_dim == 11 * 256 and c.style_disentangler.video_style_dim == 256
    assert len(c.style_disentangler.emotion_labels) == 7
    assert {k: len(v) for k, v in c.style_disentangler.profile_labels.items()} == {"age": 4, "gender": 2, "timbre": 3}
    assert (c.loss.alpha, c.loss.beta) == (0.2, 0.3)


def test_paper_preset_builds_at_full_size_on_the_meta_device():
    config = EmpatheiaConfig.from_preset("paper", PAPER_RANDOM)
    with torch.device("meta"):
        model = Empatheia(config)
    groups = {k: sum(p.numel() for _, p in v) for k, v in model.parameter_groups().items()}
    # LoRA r=16 on q, k, v, o of 32 layers of width 4096.
    assert groups["lora"] == 32 * 4 * 2 * 16 * 4096
    # 32 signal tokens' rows in the input embeddings and in the LM head.
    assert groups["signal_rows"] == 2 * 32 * 4096
    assert 7.2e9 < groups["frozen"] < 7.5e9  # Vicuna-7B + HuBERT-large + CLIP ViT-L/14 vision tower
    hf = model._hf_model()
    assert hf.config.num_hidden_layers == 32 and hf.get_input_embeddings().weight.shape == (32000, 4096)
    assert model.speech_encoder.model.config.num_hidden_layers == 24
    assert model.video_encoder.visual.output_dim == 768
    assert model.speech_projector[0].weight.shape == (4096, 1024)
    assert model.video_projector[0].weight.shape == (4096, 768)
    assert model.content_synchronizer.speech_out.weight.shape == (1024, 1024)
    assert model.content_synchronizer.video_out.weight.shape == (2816, 1024)
    assert model.style_disentangler.speech_style_layer.weight.shape == (256, 2048)
    assert len(model.content_synchronizer.vae.encoder.layers) == 4


def test_paper_heads_run_at_full_size():
    """Shapes through both heads at the paper's sizes (real weights on the CPU, ~2 s)."""
    config = EmpatheiaConfig.from_preset("paper", PAPER_RANDOM)
    from empatheia.heads import ContentSynchronizer, StyleDisentangler

    cs = ContentSynchronizer(config.content_synchronizer, 4096).eval()
    sd = StyleDisentangler(config.style_disentangler, 4096, config.language_model.num_signal_tokens).eval()
    with torch.no_grad():
        hidden = torch.randn(2, 24, 4096)
        mask = torch.ones(2, 24, dtype=torch.bool)
        # StyleTTS2's token ids feed the queries; C^v has a row per unit, like C^s.
        units = torch.randint(0, config.content_synchronizer.unit_vocab_size, (2, 80))
        out = cs(hidden, mask, torch.tensor([80, 60]), units)
        style = sd(torch.randn(2, 16, 4096), torch.randn(2, 16, 4096))
    assert out.speech.shape == (2, 80, 1024) and out.video.shape == (2, 80, 2816)
    assert out.speech_mask.sum(1).tolist() == [80, 60] and out.video_mask.sum(1).tolist() == [80, 60]
    assert style.speech_style.shape == (2, 256) and style.video_style.shape == (2, 256)
    assert style.emotion_logits.shape == (2, 7)
    assert {k: v.shape[1] for k, v in style.profile_logits.items()} == {"age": 4, "gender": 2, "timbre": 3}


def test_shipped_model_configs_are_the_presets():
    root = Path(__file__).resolve().parents[1] / "configs" / "model"
    for name in ("tiny", "paper"):
        assert EmpatheiaConfig.load_yaml(root / f"{name}.yaml") == EmpatheiaConfig.from_preset(name)


def test_bfloat16_language_model():
    model = Empatheia.from_preset("tiny", dtype=torch.bfloat16)
    assert model._hf_model().get_input_embeddings().weight.dtype == torch.bfloat16
    assert model.style_disentangler.queries.dtype == torch.float32
    out = model(full_batch(model), stage=4)
    out["loss"].backward()
    assert torch.isfinite(out["loss"])
    response = model.respond(make_dialogue(2), max_new_tokens=4)
    assert response.speech_style.dtype == torch.float32


def test_presets_load_the_trained_weights_they_ship(tmp_path, monkeypatch):
    import empatheia.modeling as modeling

    trained = Empatheia.from_preset("tiny")
    with torch.no_grad():
        trained.style_disentangler.emotion_classifier.weight.add_(1.0)
    trained.save_pretrained(tmp_path / "tiny")
    monkeypatch.setattr(modeling, "SHIPPED_WEIGHTS", tmp_path)
    assert modeling.shipped_weights("tiny") == tmp_path / "tiny" / "empatheia.safetensors"
    assert modeling.shipped_weights("small") is None
    loaded = Empatheia.from_preset("tiny")
    assert torch.equal(loaded.style_disentangler.emotion_classifier.weight, trained.style_disentangler.emotion_classifier.weight)
    untrained = Empatheia.from_preset("tiny", trained=False)
    assert not torch.equal(untrained.style_disentangler.emotion_classifier.weight, trained.style_disentangler.emotion_classifier.weight)
