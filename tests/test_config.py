"""Configs, presets, YAML and overrides, and the paper preset's full-size shapes (no download)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from empatheia import Empatheia, EmpatheiaConfig
from empatheia.labels import ED_EMOTIONS, EMOTION_LABELS

from .conftest import full_batch, make_dialogue

PAPER_RANDOM = {
    "language_model.pretrained": None,
    "speech_encoder.pretrained": None,
    "video_encoder.pretrained": None,
    "language_model.tokenizer": "builtin",
}


def test_yaml_round_trip(tmp_path):
    for name in ("tiny", "small", "paper"):
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
    with pytest.raises(KeyError, match=r"bad.yaml: unknown config key 'loss.gama'"):
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


# What README.md and docs/model.md say each preset is: encoders, language core, head widths.
PRESET_SIZES = {
    "tiny": dict(backends=("hubert", "open_clip"), lm=64, speech=32, video=24, heads=32, content=(24, 20), style=(12, 10), lora=(4, 8), units=256),
    "small": dict(backends=("whisper_ct2", "mobilenet_v2"), lm=576, speech=384, video=1280, heads=256, content=(64, 32), style=(16, 16), lora=(16, 32), units=256),
    "paper": dict(backends=("hubert", "open_clip"), lm=4096, speech=1024, video=768, heads=1024, content=(1024, 2816), style=(256, 256), lora=(16, 32), units=178),
}


@pytest.mark.parametrize("name", sorted(PRESET_SIZES))
def test_presets_load_from_the_shipped_yaml_with_the_documented_sizes(name, tmp_path):
    from empatheia.config_loader import preset_file, preset_names

    assert preset_names() == sorted(PRESET_SIZES)
    # The package's presets are the repository's configs/model/, mapped in by setup.py.
    repository = Path(__file__).resolve().parents[1] / "configs" / "model" / f"{name}.yaml"
    assert preset_file(name).read_text(encoding="utf-8") == repository.read_text(encoding="utf-8")
    c = EmpatheiaConfig.from_preset(name)
    assert EmpatheiaConfig.load_yaml(repository) == c
    sizes = PRESET_SIZES[name]
    assert c.preset == name and c.seed == 0
    assert (c.speech_encoder.backend, c.video_encoder.backend) == sizes["backends"]
    assert c.language_model.hidden_size == sizes["lm"] and c.language_model.num_signal_tokens == 16
    assert (c.speech_encoder.hidden_size, c.video_encoder.embed_dim) == (sizes["speech"], sizes["video"])
    assert c.content_synchronizer.d_model == c.style_disentangler.d_model == sizes["heads"]
    assert (c.content_synchronizer.speech_content_dim, c.content_synchronizer.video_content_dim) == sizes["content"]
    assert (c.style_disentangler.speech_style_dim, c.style_disentangler.video_style_dim) == sizes["style"]
    assert (c.language_model.lora.r, c.language_model.lora.alpha) == sizes["lora"]
    assert c.content_synchronizer.unit_vocab_size == sizes["units"]
    assert c.style_disentangler.emotion_labels == list(EMOTION_LABELS)
    assert {k: len(v) for k, v in c.style_disentangler.profile_labels.items()} == {"age": 4, "gender": 2, "timbre": 3}
    if name == "small":
        assert (c.loss.alpha, c.loss.beta, c.loss.chain_emotion_weight) == (0.5, 0.3, 1.0)
        assert c.language_model.chain_emotions == list(ED_EMOTIONS)
        assert c.language_model.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf"
    else:
        assert (c.loss.alpha, c.loss.beta, c.loss.chain_emotion_weight) == (0.2, 0.3, 0.0)
        assert c.language_model.chain_emotions is None
    if name == "tiny":
        assert (c.language_model.pretrained, c.speech_encoder.pretrained, c.video_encoder.pretrained) == (None, None, None)
        assert c.language_model.tokenizer == "builtin" and c.video_encoder.face_crop is False
    c.save_yaml(tmp_path / f"{name}.yaml")
    assert EmpatheiaConfig.load_yaml(tmp_path / f"{name}.yaml") == c


def test_one_override_syntax_for_model_and_training_configs():
    from empatheia.config_loader import ConfigError, parse_sets

    dotted = EmpatheiaConfig.from_preset("tiny", {"loss.alpha": 0.5, "language_model.lora.r": 8})
    nested = EmpatheiaConfig.from_preset("tiny", {"loss": {"alpha": 0.5}, "language_model": {"lora.r": 8}})
    parsed = EmpatheiaConfig.from_preset("tiny", parse_sets(["loss.alpha=0.5", "language_model.lora={r: 8}"]))
    assert dotted == nested == parsed and dotted.loss.alpha == 0.5 and dotted.language_model.lora.r == 8
    # A section's mapping is merged into it; a free mapping's value replaces it, and a dotted
    # key inside a free mapping sets that key alone.
    assert nested.loss.beta == 0.3 and parsed.language_model.lora.alpha == 8
    labels = EmpatheiaConfig.from_preset("tiny", {"style_disentangler.profile_labels": {"mood": ["calm", "tense"]}})
    assert labels.style_disentangler.profile_labels == {"mood": ["calm", "tense"]}
    wide = EmpatheiaConfig.from_preset("tiny", {"language_model.architecture.hidden_size": 96})
    assert wide.language_model.architecture["hidden_size"] == 96 and wide.language_model.architecture["num_hidden_layers"] == 2
    assert parse_sets(["a.b=1e-4", "c=null", "d=[0.9, 0.95]", "a.b=2"]) == {"c": None, "d": [0.9, 0.95], "a.b": 2}
    with pytest.raises(ConfigError, match=r"--set 'loss.alpha': expected key=value"):
        parse_sets(["loss.alpha"])
    with pytest.raises(ValueError, match=r"overrides: loss.alpha must be a number, got 'high'"):
        EmpatheiaConfig.from_preset("tiny", {"loss.alpha": "high"})
    with pytest.raises(KeyError, match=r"unknown config key 'loss.alpha.x' \(loss.alpha is not a mapping\)"):
        EmpatheiaConfig.from_preset("tiny", {"loss.alpha.x": 1})
    with pytest.raises(KeyError, match=r"unknown config key 'language_model.pretrainde'; did you mean 'language_model.pretrained'"):
        EmpatheiaConfig.from_preset("tiny", {"language_model.pretrainde": None})
    with pytest.raises(ValueError, match=r"overrides: loss is a section"):
        EmpatheiaConfig.from_preset("tiny", {"loss": 0.5})
    assert EmpatheiaConfig.from_preset("tiny", {"content_synchronizer.phonemes_per_char": "1e0"}).content_synchronizer.phonemes_per_char == 1.0


def test_set_takes_several_keys_after_one_flag_on_every_command():
    from empatheia.cli import build_parser

    parser = build_parser()
    for command in (["respond", "c.json", "--out", "o"], ["train", "c.yaml"], ["eval", "--preset", "tiny", "--data", "d", "--out", "o"],
                    ["data", "render", "f", "--out", "o"], ["data", "extract-features", "f", "--out", "o", "--generators-of", "tiny"]):
        args = parser.parse_args([*command, "--set", "a.b=1", "c=2", "--set", "d=3"])
        assert args.set == ["a.b=1", "c=2", "d=3"], command
        assert parser.parse_args(command).set == []


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
    import empatheia.pretrained as pretrained

    trained = Empatheia.from_preset("tiny")
    with torch.no_grad():
        trained.style_disentangler.emotion_classifier.weight.add_(1.0)
    trained.save_pretrained(tmp_path / "tiny")
    monkeypatch.setattr(pretrained, "SHIPPED_WEIGHTS", tmp_path)
    assert pretrained.shipped_weights("tiny") == tmp_path / "tiny" / "empatheia.safetensors"
    assert pretrained.shipped_weights("small") is None
    loaded = Empatheia.from_preset("tiny")
    assert torch.equal(loaded.style_disentangler.emotion_classifier.weight, trained.style_disentangler.emotion_classifier.weight)
    untrained = Empatheia.from_preset("tiny", trained=False)
    assert not torch.equal(untrained.style_disentangler.emotion_classifier.weight, trained.style_disentangler.emotion_classifier.weight)


def test_the_config_layer_imports_only_what_lies_below_it():
    """labels, feature sizes and the loader import nothing of the package; config.py only
    them (not the generators, which read the feature sizes from below instead)."""
    import ast

    package = Path(__file__).resolve().parents[1] / "empatheia"

    def imported(name):
        tree = ast.parse((package / name).read_text())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                found.add("." * node.level + (node.module or ""))
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        return {m for m in found if m.startswith((".", "empatheia", "generators", "training"))}

    for bottom in ("labels.py", "feature_sizes.py", "config_loader.py"):
        assert imported(bottom) == set(), bottom
    assert imported("config.py") == {".config_loader", ".feature_sizes", ".labels"}
    # config for its type hints only; io writes the converted GGUF folder whole or not at all
    assert imported("pretrained.py") == {".config", ".io"}
