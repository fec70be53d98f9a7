"""ImageBind's vision, text and audio encoders (empatheia.encoders.imagebind): embeddings
of a tiny random model, the key names and shapes of imagebind_huge.pth, and checkpoint
loading."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from empatheia.encoders.imagebind import (
    ImageBind,
    ImageBindCheckpointError,
    ImageBindConfig,
)

# ---------------------------------------------------------------------------- imagebind_huge.pth
# The layout of the public checkpoint, read off facebookresearch/ImageBind
# (imagebind/models/imagebind_model.py: imagebind_huge() and ImageBindModel's
# _create_modality_{preprocessors,trunks,heads,postprocessors};
# multimodal_preprocessors.py: PatchEmbedGeneric, RGBDTPreprocessor, TextPreprocessor,
# SpatioTemporalPosEmbeddingHelper; transformer.py: SimpleTransformer, BlockWithMasking,
# Mlp; helpers.py: LearnableLogitScaling). imagebind_huge: vision 1280 wide, 32 blocks;
# text 1024 wide, 24 blocks; audio 768 wide, 12 blocks; out_embed_dim 1024.

HUGE_SHAPES = {
    # vision: Sequential(PadIm2Video, Conv3d(3, 1280, kernel=stride=(2, 14, 14), bias=False));
    # (3, 2, 224, 224) -> 1×16×16 = 256 patches + 1 class token
    "modality_preprocessors.vision.rgbt_stem.proj.1.weight": (1280, 3, 2, 14, 14),
    "modality_preprocessors.vision.cls_token": (1, 1, 1280),
    "modality_preprocessors.vision.pos_embedding_helper.pos_embed": (1, 257, 1280),
    "modality_trunks.vision.pre_transformer_layer.0.weight": (1280,),
    "modality_trunks.vision.blocks.0.attn.in_proj_weight": (3840, 1280),
    "modality_trunks.vision.blocks.31.mlp.fc1.weight": (5120, 1280),
    "modality_heads.vision.0.weight": (1280,),
    "modality_heads.vision.2.weight": (1024, 1280),
    # text: Embedding(49408, 1024), pos_embed (1, 77, 1024), causal mask buffer (77, 77)
    "modality_preprocessors.text.token_embedding.weight": (49408, 1024),
    "modality_preprocessors.text.pos_embed": (1, 77, 1024),
    "modality_preprocessors.text.mask": (77, 77),
    "modality_trunks.text.blocks.23.attn.out_proj.weight": (1024, 1024),
    "modality_heads.text.proj.0.weight": (1024,),
    "modality_heads.text.proj.1.weight": (1024, 1024),
    "modality_postprocessors.text.1.log_logit_scale": (),
    # audio: Conv2d(1, 768, kernel 16, stride 10, bias=False) + LayerNorm(768);
    # (1, 128, 204) -> 12×19 = 228 patches + 1 class token
    "modality_preprocessors.audio.rgbt_stem.proj.weight": (768, 1, 16, 16),
    "modality_preprocessors.audio.rgbt_stem.norm_layer.weight": (768,),
    "modality_preprocessors.audio.cls_token": (1, 1, 768),
    "modality_preprocessors.audio.pos_embedding_helper.pos_embed": (1, 229, 768),
    "modality_trunks.audio.blocks.0.attn.bias_k": (1, 1, 768),
    "modality_trunks.audio.blocks.11.attn.bias_v": (1, 1, 768),
    "modality_trunks.audio.blocks.0.mlp.fc2.weight": (768, 3072),
    "modality_heads.audio.0.weight": (768,),
    "modality_heads.audio.2.weight": (1024, 768),
    "modality_postprocessors.audio.1.log_logit_scale": (),
}
HUGE_BLOCKS = {"vision": 32, "text": 24, "audio": 12}
# 3 + (2 + 32 × 12) + 3 = 392; 3 + 24 × 12 + 3 + 1 = 295; 5 + 12 × 14 + 3 + 1 = 177
HUGE_KEYS = {"vision": 392, "text": 295, "audio": 177}
HUGE_TOTAL_KEYS = 864

_BLOCK = [
    "attn.in_proj_weight",
    "attn.in_proj_bias",
    "attn.out_proj.weight",
    "attn.out_proj.bias",
    "norm_1.weight",
    "norm_1.bias",
    "mlp.fc1.weight",
    "mlp.fc1.bias",
    "mlp.fc2.weight",
    "mlp.fc2.bias",
    "norm_2.weight",
    "norm_2.bias",
]


def _expected_huge_keys() -> set:
    keys = {
        "modality_preprocessors.vision.cls_token",
        "modality_preprocessors.vision.rgbt_stem.proj.1.weight",
        "modality_preprocessors.vision.pos_embedding_helper.pos_embed",
        "modality_trunks.vision.pre_transformer_layer.0.weight",
        "modality_trunks.vision.pre_transformer_layer.0.bias",
        "modality_heads.vision.0.weight",
        "modality_heads.vision.0.bias",
        "modality_heads.vision.2.weight",
        "modality_preprocessors.text.token_embedding.weight",
        "modality_preprocessors.text.pos_embed",
        "modality_preprocessors.text.mask",
        "modality_heads.text.proj.0.weight",
        "modality_heads.text.proj.0.bias",
        "modality_heads.text.proj.1.weight",
        "modality_postprocessors.text.1.log_logit_scale",
        "modality_preprocessors.audio.cls_token",
        "modality_preprocessors.audio.rgbt_stem.proj.weight",
        "modality_preprocessors.audio.rgbt_stem.norm_layer.weight",
        "modality_preprocessors.audio.rgbt_stem.norm_layer.bias",
        "modality_preprocessors.audio.pos_embedding_helper.pos_embed",
        "modality_heads.audio.0.weight",
        "modality_heads.audio.0.bias",
        "modality_heads.audio.2.weight",
        "modality_postprocessors.audio.1.log_logit_scale",
    }
    for modality, blocks in HUGE_BLOCKS.items():
        suffixes = _BLOCK + (["attn.bias_k", "attn.bias_v"] if modality == "audio" else [])
        keys |= {f"modality_trunks.{modality}.blocks.{i}.{s}" for i in range(blocks) for s in suffixes}
    return keys


@pytest.fixture(scope="module")
def huge_state():
    with torch.device("meta"):
        model = ImageBind(ImageBindConfig.huge())
    return model.state_dict()


def test_huge_state_dict_has_the_checkpoint_keys_and_shapes(huge_state):
    assert all(t.is_meta for t in huge_state.values())
    assert set(huge_state) == _expected_huge_keys()
    assert len(huge_state) == HUGE_TOTAL_KEYS
    for modality, count in HUGE_KEYS.items():
        assert sum(k.split(".")[1] == modality for k in huge_state) == count, modality
    for modality, blocks in HUGE_BLOCKS.items():
        indices = {int(k.split(".")[3]) for k in huge_state if k.startswith(f"modality_trunks.{modality}.blocks.")}
        assert indices == set(range(blocks)), modality
    for key, shape in HUGE_SHAPES.items():
        assert tuple(huge_state[key].shape) == shape, key


def test_huge_block_shapes(huge_state):
    for modality, width in (("vision", 1280), ("text", 1024), ("audio", 768)):
        block = f"modality_trunks.{modality}.blocks.0."
        assert tuple(huge_state[block + "attn.in_proj_weight"].shape) == (3 * width, width)
        assert tuple(huge_state[block + "attn.in_proj_bias"].shape) == (3 * width,)
        assert tuple(huge_state[block + "mlp.fc1.weight"].shape) == (4 * width, width)
        assert tuple(huge_state[block + "mlp.fc2.weight"].shape) == (width, 4 * width)
        assert tuple(huge_state[block + "norm_2.bias"].shape) == (width,)


def test_huge_logit_scales_and_mask_start_as_imagebind_builds_them():
    # The scalars are cheap to build for real: text log(1/0.07), audio log(20); both saved
    # buffers of the frozen model, under the checkpoint's keys.
    model = ImageBind(ImageBindConfig.tiny())
    text = model.modality_postprocessors.text[1]
    audio = model.modality_postprocessors.audio[1]
    for key in ("modality_postprocessors.text.1.log_logit_scale", "modality_postprocessors.audio.1.log_logit_scale"):
        assert key in model.state_dict() and key not in dict(model.named_parameters())
    assert text.scale.item() == pytest.approx(1 / 0.07, rel=1e-5)
    assert audio.scale.item() == pytest.approx(20.0, rel=1e-5)
    mask = model.modality_preprocessors.text.mask
    assert torch.isinf(mask.triu(1)[mask.triu(1) != 0]).all() and (mask.tril() == 0).all()


# ---------------------------------------------------------------------------- tiny model


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return ImageBind(ImageBindConfig.tiny())


def _frames(b: int, f: int, size: int = 28, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, f, 3, size, size, generator=torch.Generator().manual_seed(seed))


def test_tiny_is_frozen_and_stays_in_eval(tiny):
    tiny.train()
    assert not tiny.training
    assert not any(p.requires_grad for p in tiny.parameters())


def test_embed_vision_shapes_norms_and_determinism(tiny):
    frames = _frames(3, 2)
    out = tiny.embed_vision(frames)
    assert out.shape == (3, 16)
    assert torch.allclose(out.norm(dim=-1), torch.ones(3), atol=1e-5)  # one clip: unit norm
    assert torch.equal(out, tiny.embed_vision(frames))
    images = tiny.embed_vision(frames[:, 0])  # (B, 3, S, S) images are repeated to two frames
    assert torch.allclose(images, tiny.embed_vision(frames[:, [0, 0]]), atol=1e-6)
    longer = tiny.embed_vision(_frames(2, 6, seed=1))
    assert longer.shape == (2, 16) and (longer.norm(dim=-1) <= 1 + 1e-5).all()


def test_embed_vision_pairs_frames_and_averages_the_clips(tiny):
    frames = _frames(1, 5)
    clips = [tiny.embed_vision(frames[:, [a, b]]) for a, b in ((0, 1), (2, 3), (4, 4))]
    assert torch.allclose(tiny.embed_vision(frames), torch.stack(clips).mean(0), atol=1e-6)
    # the same as forward on ImageBind's (N, K, 3, 2, S, S) video input
    video = torch.stack([frames[0, [a, b]].transpose(0, 1) for a, b in ((0, 1), (2, 3), (4, 4))])[None]
    assert torch.allclose(tiny({"vision": video})["vision"], tiny.embed_vision(frames), atol=1e-6)


def test_embed_vision_rows_are_independent_and_padding_is_ignored(tiny):
    frames = _frames(3, 4)
    lengths = torch.tensor([4, 1, 3])
    padded = frames.clone()
    padded[1, 1:] = 100.0
    padded[2, 3:] = -7.0
    batch = tiny.embed_vision(padded, lengths)
    for row, n in enumerate(lengths.tolist()):
        alone = tiny.embed_vision(frames[row : row + 1, :n])
        assert torch.allclose(batch[row], alone[0], atol=1e-5), row
    with pytest.raises(ValueError, match="224|28"):
        tiny.embed_vision(torch.zeros(1, 2, 3, 32, 32))
    with pytest.raises(ValueError, match="row 0"):
        tiny.embed_vision(frames[:1], torch.tensor([0]))


def test_audio_clip_bounds_follow_imagebinds_sampler(tiny):
    # 3 clips of 2 s starting at i * (duration - 2) / 2: first at 0, last ending at the end
    assert tiny.audio_clip_bounds(80000) == [(0, 32000), (24000, 56000), (48000, 80000)]
    assert tiny.audio_clip_bounds(16000) == [(0, 16000)] * 3  # short audio: three copies
    assert tiny.audio_clip_bounds(32000) == [(0, 32000)] * 3


def test_spectrograms_shape_and_padding(tiny):
    audio = torch.randn(16000, generator=torch.Generator().manual_seed(0)) * 0.1
    spec = tiny.spectrograms(audio)
    assert spec.shape == (3, 1, 128, 204)
    # 1 s gives 98 frames of 25 ms every 10 ms; the rest is zero log-mel, normalised
    padding = (0 - (-4.268)) / 9.138
    assert torch.allclose(spec[:, :, :, 98:], torch.full_like(spec[:, :, :, 98:], padding))
    assert not torch.allclose(spec[:, :, :, 97], torch.full_like(spec[:, :, :, 97], padding))
    offset = audio + 0.5
    kept = offset.clone()
    tiny.spectrograms(offset)
    assert torch.equal(offset, kept)  # the clips' means are removed in a copy


def test_embed_audio_shapes_norms_and_determinism(tiny):
    waves = torch.randn(2, 24000, generator=torch.Generator().manual_seed(0)) * 0.1
    out = tiny.embed_audio(waves, sample_rate=16000)
    assert out.shape == (2, 16)
    # at most 2 s: three identical clips, each normalised and scaled by 20
    assert torch.allclose(out.norm(dim=-1), torch.full((2,), 20.0), atol=1e-4)
    assert torch.equal(out, tiny.embed_audio(waves))
    long = tiny.embed_audio(torch.randn(1, 64000) * 0.1)
    assert long.norm() <= 20 + 1e-4
    resampled = tiny.embed_audio(torch.randn(1, 8000) * 0.1, sample_rate=8000)
    assert resampled.shape == (1, 16) and torch.isfinite(resampled).all()


def test_embed_audio_rows_are_independent_and_padding_is_ignored(tiny):
    waves = torch.randn(2, 40000, generator=torch.Generator().manual_seed(1)) * 0.1
    lengths = torch.tensor([33000, 12000])
    padded = waves.clone()
    padded[0, 33000:] = -0.5
    padded[1, 12000:] = 0.9
    batch = tiny.embed_audio(padded, lengths)
    for row, n in enumerate(lengths.tolist()):
        alone = tiny.embed_audio(waves[row : row + 1, :n])
        assert torch.allclose(batch[row], alone[0], atol=1e-4), row
    with pytest.raises(ValueError, match="row 1.*25 ms"):
        tiny.embed_audio(waves[:2], torch.tensor([40000, 300]))


def test_embed_text_shapes_norms_and_independence(tiny):
    ids = torch.zeros(3, 16, dtype=torch.long)
    ids[0, :4] = torch.tensor([998, 5, 6, 999])  # <start>, text, <end>: the largest id ends a row
    ids[1, :6] = torch.tensor([998, 7, 8, 9, 10, 999])
    ids[2, :3] = torch.tensor([998, 11, 999])
    out = tiny.embed_text(ids)
    assert out.shape == (3, 16)
    assert torch.allclose(out.norm(dim=-1), torch.full((3,), 1 / 0.07), rtol=1e-5)
    assert torch.equal(out, tiny.embed_text(ids))
    for row in range(3):
        assert torch.allclose(tiny.embed_text(ids[row : row + 1])[0], out[row], atol=1e-5)
    # causal: positions after the end token change nothing, so a shorter context agrees
    assert torch.allclose(tiny.embed_text(ids[:, :6]), out, atol=1e-5)
    changed = ids.clone()
    changed[0, 10] = 3
    assert torch.allclose(tiny.embed_text(changed)[0], out[0], atol=1e-5)
    with pytest.raises(ValueError, match="1000"):
        tiny.embed_text(torch.full((1, 4), 1000))
    with pytest.raises(ValueError, match="context"):
        tiny.embed_text(torch.zeros(1, 17, dtype=torch.long))


def test_tokenize_uses_the_openclip_vocabulary():
    config = dataclasses.replace(ImageBindConfig.tiny(), vocab_size=49408, context_length=77)
    model = ImageBind(config)
    ids = model.tokenize(["A dog barks.", "hello"])
    assert ids.shape == (2, 77) and ids.dtype == torch.long
    assert ids[:, 0].tolist() == [49406, 49406]
    assert (ids.argmax(dim=-1) > 0).all() and ids.max() == 49407
    assert model.embed_text(ids).shape == (2, 16)
    with pytest.raises(ValueError, match="49408"):
        ImageBind(ImageBindConfig.tiny()).tokenize("hi")


# ---------------------------------------------------------------------------- checkpoints


def _inputs():
    g = torch.Generator().manual_seed(3)
    ids = torch.zeros(2, 16, dtype=torch.long)
    ids[:, :3] = torch.tensor([[998, 4, 999], [998, 8, 999]])
    return torch.randn(2, 2, 3, 28, 28, generator=g), torch.randn(2, 20000, generator=g) * 0.1, ids


def _embed_all(model):
    frames, waves, ids = _inputs()
    return model.embed_vision(frames), model.embed_audio(waves), model.embed_text(ids)


def _other_modalities_keys():
    return {
        "modality_preprocessors.depth.cls_token": torch.zeros(1, 1, 4),
        "modality_trunks.thermal.blocks.0.norm_1.weight": torch.ones(4),
        "modality_heads.imu.3.weight": torch.zeros(2, 4),
        "modality_postprocessors.depth.1.log_logit_scale": torch.tensor(1.6),
    }


@pytest.fixture(scope="module")
def reference(tiny):
    return _embed_all(tiny)


def test_load_checkpoint_round_trip_and_skips_other_modalities(tmp_path, tiny, reference, caplog):
    state = dict(tiny.state_dict())
    state.update(_other_modalities_keys())
    path = tmp_path / "imagebind_tiny.pth"
    torch.save(state, path)
    torch.manual_seed(123)
    fresh = ImageBind(ImageBindConfig.tiny())
    assert not torch.allclose(fresh.embed_vision(_inputs()[0]), reference[0])
    with caplog.at_level("INFO", logger="empatheia.encoders.imagebind"):
        report = fresh.load_checkpoint(path)
    assert sorted(report.skipped) == sorted(_other_modalities_keys())
    assert set(report.loaded) == set(tiny.state_dict()) and not report.missing and not report.unexpected
    assert "modality_trunks.thermal" in caplog.text and "skipped 4" in caplog.text
    for ours, expected in zip(_embed_all(fresh), reference):
        assert torch.equal(ours, expected)
    assert not any(p.requires_grad for p in fresh.parameters())


def test_load_checkpoint_onto_the_meta_device(tmp_path, tiny, reference):
    path = tmp_path / "imagebind_tiny.pth"
    torch.save(tiny.state_dict(), path)
    with torch.device("meta"):
        model = ImageBind(ImageBindConfig.tiny())
    model.load_checkpoint(path)
    assert not any(t.is_meta for t in model.state_dict().values())
    for ours, expected in zip(_embed_all(model), reference):
        assert torch.equal(ours, expected)


def test_load_checkpoint_names_missing_wrong_and_unexpected_keys(tmp_path, tiny):
    good = dict(tiny.state_dict())
    model = ImageBind(ImageBindConfig.tiny())

    missing = dict(good)
    del missing["modality_heads.audio.2.weight"]
    torch.save(missing, tmp_path / "missing.pth")
    with pytest.raises(ImageBindCheckpointError, match=r"missing key\(s\): modality_heads\.audio\.2\.weight"):
        model.load_checkpoint(tmp_path / "missing.pth")
    report = model.load_checkpoint(tmp_path / "missing.pth", strict=False)
    assert report.missing == ["modality_heads.audio.2.weight"]

    wrong = dict(good)
    wrong["modality_preprocessors.vision.pos_embedding_helper.pos_embed"] = torch.zeros(1, 7, 32)
    torch.save(wrong, tmp_path / "wrong.pth")
    message = (
        r"modality_preprocessors\.vision\.pos_embedding_helper\.pos_embed: "
        r"checkpoint \(1, 7, 32\), model \(1, 5, 32\)"
    )
    for strict in (True, False):  # a shape never fits
        with pytest.raises(ImageBindCheckpointError, match=message):
            model.load_checkpoint(tmp_path / "wrong.pth", strict=strict)

    extra = dict(good)
    extra["modality_trunks.vision.blocks.2.norm_1.weight"] = torch.ones(32)
    torch.save(extra, tmp_path / "extra.pth")
    with pytest.raises(ImageBindCheckpointError, match=r"unexpected key\(s\): modality_trunks\.vision\.blocks\.2"):
        model.load_checkpoint(tmp_path / "extra.pth")
    assert model.load_checkpoint(tmp_path / "extra.pth", strict=False).unexpected == [
        "modality_trunks.vision.blocks.2.norm_1.weight"
    ]

    torch.save({"model": good, "epoch": 3}, tmp_path / "nested.pth")
    with pytest.raises(ImageBindCheckpointError, match="plain state dict"):
        model.load_checkpoint(tmp_path / "nested.pth")
