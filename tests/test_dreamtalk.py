"""DreamTalk: the published architecture at tiny sizes (random weights, a tiny random
wav2vec2), and the official checkpoint layout at full size."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile
import torch
from transformers import Wav2Vec2Config, Wav2Vec2Model

from empatheia.errors import DataError
from empatheia.media import load_audio
from empatheia.generators.base import Waveform
from empatheia.generators.dreamtalk import CheckpointError, DreamTalk, DreamTalkConfig, audio_windows
from empatheia.generators.dreamtalk.diffusion import VarianceSchedule
from empatheia.feature_sizes import DREAMTALK_FEATURES

TINY = DreamTalkConfig.tiny()
PORTRAIT = np.random.default_rng(0).integers(0, 256, size=(90, 120, 3), dtype=np.uint8)


def tiny_wav2vec2(hidden: int = TINY.audio_feature_dim) -> Wav2Vec2Model:
    """wav2vec2 with the real 320-sample (50 Hz) convolutional stride, a few channels."""
    config = Wav2Vec2Config(
        hidden_size=hidden,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        conv_dim=(16,) * 7,
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        feat_extract_norm="layer",
        do_stable_layer_norm=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return Wav2Vec2Model(config).eval()


@pytest.fixture(scope="module")
def model() -> DreamTalk:
    return DreamTalk(TINY, wav2vec2=tiny_wav2vec2(), seed=0)


def speech(seconds: float, rate: int = 16000, seed: int = 0) -> Waveform:
    t = torch.arange(int(seconds * rate)) / rate
    noise = torch.randn(t.shape[0], generator=torch.Generator().manual_seed(seed))
    return Waveform((0.3 * torch.sin(2 * torch.pi * 190 * t) + 0.05 * noise).float(), rate)


def style(seed: int) -> torch.Tensor:
    return torch.randn(TINY.d_model, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------- animate
@pytest.mark.parametrize("seconds, rate", [(1.3, 16000), (0.87, 22050)])
def test_animate_from_speech_gives_one_frame_per_25th_of_a_second(model, seconds, rate):
    clip = speech(seconds, rate)
    video = model.animate(clip, None, style(0), PORTRAIT)
    assert video.fps == 25.0
    assert video.frames.shape == (round(clip.duration * 25), TINY.image_size, TINY.image_size, 3)
    assert video.frames.dtype == torch.uint8
    assert video.frames.shape[0] == model.frame_count(clip)


def test_given_content_of_another_length_is_resampled_to_the_frame_count(model):
    clip = speech(1.0)  # 25 frames
    video = model.animate(clip, torch.randn(10, TINY.content_dim), style(0), PORTRAIT)
    assert video.frames.shape[0] == 25
    with pytest.raises(ValueError, match="content must be"):
        model.animate(clip, torch.randn(10, TINY.content_dim + 1), style(0), PORTRAIT)
    with pytest.raises(ValueError, match="style must be"):
        model.animate(clip, None, torch.randn(TINY.d_model + 1), PORTRAIT)


def test_content_from_speech_is_the_content_feature_animate_reads(model):
    clip = speech(0.8)
    content = model.speech_content(clip)  # (L, W, d)
    assert content.shape == (20, TINY.window_frames, TINY.d_model)
    own = model.animate(clip, None, style(1), PORTRAIT).frames
    given = model.animate(clip, content.flatten(1), style(1), PORTRAIT).frames
    assert torch.equal(own, given)


def test_guidance_with_a_ready_style_code(model):
    content = model.speech_content(speech(0.6))[None]
    code = style(2)[None]
    plain = model.sample_coefficients(content, code, guidance_scale=1.0)
    guided = model.sample_coefficients(content, code, guidance_scale=3.0)
    assert guided.shape == plain.shape == (1, 15, TINY.coeff_dim)
    assert torch.isfinite(guided).all() and not torch.allclose(guided, plain)
    # At scale 0 only the unconditional branch is left: the null style's own prediction.
    null = model.diffusion.null_style_code()
    assert torch.allclose(
        model.sample_coefficients(content, code, guidance_scale=0.0),
        model.sample_coefficients(content, null, guidance_scale=1.0),
        atol=1e-5,
    )
    video = model.animate(speech(0.6), None, style(2), PORTRAIT, guidance_scale=2.0)
    assert video.frames.shape[0] == 15


def test_style_codes_steer_the_motion_and_sampling_is_repeatable(model):
    content = model.speech_content(speech(0.6))[None]
    a = model.sample_coefficients(content, style(3)[None])
    b = model.sample_coefficients(content, style(4)[None])
    assert not torch.allclose(a, b)
    assert torch.equal(a, model.sample_coefficients(content, style(3)[None]))
    assert not torch.equal(a, model.sample_coefficients(content, style(3)[None], seed=7))


def test_pose_defaults_to_neutral_and_a_short_pose_holds_its_last_row(model):
    neutral = model.pose_sequence(None, 4)
    assert torch.allclose(neutral, torch.tensor(TINY.neutral_pose).expand(4, -1))
    pose = torch.arange(18, dtype=torch.float32).reshape(2, 9)
    held = model.pose_sequence(pose, 5)
    assert torch.equal(held[:2], pose) and torch.equal(held[2:], pose[1:].expand(3, -1))
    frames = model.render(PORTRAIT, torch.zeros(5, TINY.coeff_dim), pose)
    assert frames.shape == (5, TINY.image_size, TINY.image_size, 3)


def test_audio_windows_centre_frame_i_on_audio_frame_2i_with_zero_padding():
    features = (torch.arange(7, dtype=torch.float32) + 1)[:, None]  # (N=7, C=1), no zeros
    windows = audio_windows(features, num_frames=5, window=2)[..., 0]
    assert windows.shape == (5, 5)
    assert windows[0].tolist() == [0, 0, 1, 2, 3]
    assert windows[2].tolist() == [3, 4, 5, 6, 7]
    assert windows[4].tolist() == [7, 0, 0, 0, 0]


def test_schedule_and_ddim_steps_follow_the_published_sampler():
    schedule = VarianceSchedule(1000, 1e-4, 0.02)
    assert schedule.betas.shape == (1001,) and schedule.betas[0] == 0
    assert schedule.alpha_bars[0] == 1
    assert torch.isclose(schedule.betas[1], torch.tensor(1e-4)) and torch.isclose(schedule.betas[-1], torch.tensor(0.02))
    assert schedule.ddim_timesteps(10).tolist() == [1, 101, 201, 301, 401, 501, 601, 701, 801, 901]


# ---------------------------------------------------------------------- gold features
def test_content_features_one_row_per_frame(model, tmp_path):
    paths = []
    for name, seconds in (("a", 1.0), ("b", 0.52)):
        path = tmp_path / f"{name}.wav"
        soundfile.write(path, speech(seconds).samples.numpy(), 16000)
        paths.append(path)
    a, b = model.content_features(paths)
    assert a.shape == (25, TINY.content_dim) and b.shape == (13, TINY.content_dim)
    assert a.dtype == torch.float32
    # The gold feature is what animate derives from the same audio.
    expected = model.speech_content(Waveform(load_audio(paths[0], 16000), 16000)).flatten(1)
    assert torch.allclose(a, expected, atol=1e-5)
    with pytest.raises(DataError, match="missing.wav"):
        model.content_features([tmp_path / "missing.wav"])


def test_style_features_read_coefficients_next_to_the_video(model, tmp_path):
    rng = np.random.default_rng(0)
    exp = {k: rng.standard_normal((n, 64)).astype(np.float32) for k, n in (("a", 40), ("b", 30), ("c", 20), ("e", 100))}
    np.save(tmp_path / "a.coeffs.npy", exp["a"])  # (F, 64)
    np.savetxt(tmp_path / "b.txt", np.concatenate([exp["b"], rng.standard_normal((30, 9))], 1))  # (F, 73)
    full = rng.standard_normal((20, 257)).astype(np.float32)
    full[:, 80:144] = exp["c"]
    np.save(tmp_path / "c.npy", full)  # a coefficient file given directly, Deep3DFaceRecon layout
    np.save(tmp_path / "e.coeffs.npy", exp["e"])  # longer than style_max_len (64)

    codes = model.style_features([tmp_path / "a.mp4", tmp_path / "b.mp4", tmp_path / "c.npy", tmp_path / "e.mp4"])
    assert [tuple(c.shape) for c in codes] == [(TINY.d_model,)] * 4
    one_by_one = [model.style_code([torch.from_numpy(exp[k])])[0] for k in "abce"]
    for code, single in zip(codes, one_by_one):  # padding in a batch changes nothing
        assert torch.allclose(code, single, atol=1e-5)
    assert torch.allclose(codes[3], model.style_code([torch.from_numpy(exp["e"][:64])])[0], atol=1e-5)

    with pytest.raises(DataError, match=r"d\.mp4.*d\.coeffs\.npy"):
        model.style_features([tmp_path / "d.mp4"])
    np.save(tmp_path / "f.coeffs.npy", np.zeros((5, 50), np.float32))
    with pytest.raises(DataError, match="50 columns"):
        model.style_features([tmp_path / "f.mp4"])


def test_an_injected_coefficient_reader_replaces_the_files(tmp_path):
    coefficients = np.random.default_rng(1).standard_normal((12, 64)).astype(np.float32)
    seen = []

    def reader(path):
        seen.append(path.name)
        return coefficients

    model = DreamTalk(TINY, coefficient_reader=reader)
    (code,) = model.style_features([tmp_path / "clip.mp4"])
    assert seen == ["clip.mp4"]
    assert torch.allclose(code, model.style_code([torch.from_numpy(coefficients)])[0])


def test_official_mat_layout_is_read_when_scipy_is_installed(model, tmp_path):
    scipy_io = pytest.importorskip("scipy.io")
    coeff = np.random.default_rng(2).standard_normal((16, 257)).astype(np.float32)
    transform = np.tile(np.array([[256, 256, 0.99, 128.0, 123.5]], np.float32), (16, 1))
    scipy_io.savemat(tmp_path / "clip.mat", {"coeff": coeff, "transform_params": transform})
    (code,) = model.style_features([tmp_path / "clip.mp4"])
    assert torch.allclose(code, model.style_code([torch.from_numpy(coeff[:, 80:144])])[0], atol=1e-5)


def test_features_and_fingerprint(model):
    assert DreamTalk.features == DREAMTALK_FEATURES
    assert (model.features.content_dim, model.features.style_dim) == (TINY.content_dim, TINY.d_model)
    assert DreamTalk(TINY, seed=0).fingerprint() == DreamTalk(TINY, seed=0).fingerprint()
    assert DreamTalk(TINY, seed=0).fingerprint() != DreamTalk(TINY, seed=1).fingerprint()
    assert "random-seed-0" in model.fingerprint() and "wav2vec2=state:" in model.fingerprint()
    with pytest.raises(ValueError, match="wav2vec2"):
        DreamTalk(TINY).animate(speech(0.5), None, style(0), PORTRAIT)


def test_wav2vec2_is_loaded_from_a_local_folder_on_first_use(tmp_path):
    tiny_wav2vec2().save_pretrained(tmp_path / "wav2vec2")
    model = DreamTalk(DreamTalkConfig.tiny(wav2vec2=str(tmp_path / "wav2vec2")))
    assert model._wav2vec2 is None  # nothing loaded until content is derived from audio
    path = tmp_path / "a.wav"
    soundfile.write(path, speech(0.4).samples.numpy(), 16000)
    (content,) = model.content_features([path])
    assert content.shape == (10, TINY.content_dim)
    assert "wav2vec2=sha256:" in model.fingerprint()
    with pytest.raises(FileNotFoundError, match="nowhere"):
        DreamTalk(DreamTalkConfig.tiny(wav2vec2=str(tmp_path / "nowhere"))).content_features([path])


def test_config_from_plain_fields_and_its_checks():
    # As it comes from YAML (GeneratorsConfig.dreamtalk): lists, not tuples.
    config = DreamTalkConfig(**{"upper_face_indices": list(TINY.upper_face_indices), "neutral_pose": [0.0] * 9})
    assert config == DreamTalkConfig(neutral_pose=(0.0,) * 9)
    assert (config.window_frames, config.content_dim) == (11, DREAMTALK_FEATURES.content_dim)
    with pytest.raises(ValueError, match="split range"):
        DreamTalkConfig(lower_face_indices=(0, 1))
    with pytest.raises(ValueError, match="multiple of"):
        DreamTalkConfig(image_size=200)


# ---------------------------------------------------------------------- checkpoints
# Names and shapes read from the official source (ali-vilab/dreamtalk: configs/default.py,
# core/networks/{diffusion_net,diffusion_util,generator,disentangle_decoder,transformer,
# self_attention_pooling}.py; generators/{face_model,base_function}.py and
# renderer_conf.yaml), as the keys of `denoising_network.pth` / `renderer.pt`.
OFFICIAL_DENOISER_KEYS = {
    "diff_net.null_style_clip": (256, 64),
    "diff_net.null_pad_mask": (256,),
    "diff_net.var_sched.betas": (1001,),
    "diff_net.var_sched.alphas": (1001,),
    "diff_net.var_sched.alpha_bars": (1001,),
    "diff_net.var_sched.sigmas_flex": (1001,),
    "diff_net.var_sched.sigmas_inflex": (1001,),
    "diff_net.net.content_encoder.increase_embed_dim.weight": (256, 1024),
    "diff_net.net.content_encoder.increase_embed_dim.bias": (256,),
    "diff_net.net.content_encoder.pos_embed.pos_table": (1, 11, 256),
    "diff_net.net.content_encoder.encoder.layers.0.self_attn.in_proj_weight": (768, 256),
    "diff_net.net.content_encoder.encoder.layers.0.self_attn.in_proj_bias": (768,),
    "diff_net.net.content_encoder.encoder.layers.0.self_attn.out_proj.weight": (256, 256),
    "diff_net.net.content_encoder.encoder.layers.1.linear1.weight": (1024, 256),
    "diff_net.net.content_encoder.encoder.layers.2.linear2.weight": (256, 1024),
    "diff_net.net.content_encoder.encoder.layers.2.norm2.bias": (256,),
    "diff_net.net.style_encoder.increase_embed_dim.weight": (256, 64),
    "diff_net.net.style_encoder.pos_embed.pos_table": (1, 256, 256),
    "diff_net.net.style_encoder.encoder.layers.2.self_attn.in_proj_weight": (768, 256),
    "diff_net.net.style_encoder.encoder.layers.0.norm1.weight": (256,),
    "diff_net.net.style_encoder.aggregate_method.W.0.weight": (256, 256),
    "diff_net.net.style_encoder.aggregate_method.W.0.bias": (256,),
    "diff_net.net.style_encoder.aggregate_method.W.2.weight": (1, 256),
    "diff_net.net.style_encoder.aggregate_method.W.2.bias": (1,),
    "diff_net.net.decoder.pos_embed.pos_table": (1, 11, 256),
    "diff_net.net.decoder.upper_decoder.layers.0.self_attn.in_proj_weight": (768, 256),
    "diff_net.net.decoder.upper_decoder.layers.0.multihead_attn.in_proj_weight": (768, 256),
    "diff_net.net.decoder.upper_decoder.layers.1.multihead_attn.out_proj.bias": (256,),
    "diff_net.net.decoder.upper_decoder.layers.2.norm3.weight": (256,),
    "diff_net.net.decoder.upper_decoder.norm.weight": (256,),
    "diff_net.net.decoder.lower_decoder.layers.2.linear1.bias": (1024,),
    "diff_net.net.decoder.lower_decoder.norm.bias": (256,),
    "diff_net.net.decoder.upper_tail_fc.0.weight": (128, 256),
    "diff_net.net.decoder.upper_tail_fc.2.weight": (128, 128),
    "diff_net.net.decoder.upper_tail_fc.4.weight": (51, 128),
    "diff_net.net.decoder.lower_tail_fc.4.weight": (13, 128),
    "diff_net.net.decoder.lower_tail_fc.4.bias": (13,),
    "diff_net.net.content_xt_to_decoder_input_wo_time.0.weight": (256, 320),
    "diff_net.net.content_xt_to_decoder_input_wo_time.2.weight": (256, 256),
    "diff_net.net.content_xt_to_decoder_input_wo_time.4.bias": (256,),
    "diff_net.net.time_embed_net.0.weight": (256, 256),
    "diff_net.net.time_embed_net.2.bias": (256,),
}
OFFICIAL_DENOISER_KEY_COUNT = 224  # 39 content + 43 style + 125 decoder + 10 MLPs + 5 schedule + 2 null style
OFFICIAL_RENDERER_KEYS = {
    "mapping_net.first.0.weight": (256, 73, 7),
    "mapping_net.first.0.bias": (256,),
    "mapping_net.encoder0.1.weight": (256, 256, 3),
    "mapping_net.encoder2.1.bias": (256,),
    "warpping_net.hourglass.encoder.input_layer.weight": (32, 3, 7, 7),
    "warpping_net.hourglass.encoder.encoder0.conv_0.weight": (64, 32, 4, 4),
    "warpping_net.hourglass.encoder.encoder0.norm_0.mlp_shared.0.weight": (128, 256),
    "warpping_net.hourglass.encoder.encoder0.norm_0.mlp_gamma.weight": (32, 128),
    "warpping_net.hourglass.encoder.encoder2.norm_1.mlp_beta.weight": (256, 128),
    "warpping_net.hourglass.encoder.encoder4.conv_1.weight": (256, 256, 3, 3),
    "warpping_net.hourglass.decoder.decoder4.conv_0.weight": (256, 256, 3, 3),
    "warpping_net.hourglass.decoder.decoder3.conv_0.weight": (256, 512, 3, 3),
    "warpping_net.hourglass.decoder.decoder3.norm_s.mlp_beta.weight": (512, 128),
    "warpping_net.hourglass.decoder.decoder2.conv_0.weight": (128, 512, 3, 3),
    "warpping_net.hourglass.decoder.decoder2.conv_1.weight": (128, 128, 3, 3),
    "warpping_net.hourglass.decoder.decoder2.conv_s.weight": (512, 128, 3, 3),
    "warpping_net.flow_out.0.weight": (256, 1, 1),
    "warpping_net.flow_out.2.weight": (2, 256, 7, 7),
    "editing_net.encoder.first.model.0.weight": (64, 6, 7, 7),
    "editing_net.encoder.first.model.1.weight": (64, 1, 1),
    "editing_net.encoder.down0.model.0.weight": (128, 64, 3, 3),
    "editing_net.encoder.down2.model.1.bias": (256, 1, 1),
    "editing_net.decoder.res2.res0.conv1.weight": (256, 256, 3, 3),
    "editing_net.decoder.res2.res1.norm2.mlp_beta.weight": (256, 128),
    "editing_net.decoder.up2.model.0.weight": (256, 256, 3, 3),
    "editing_net.decoder.up0.model.0.weight": (64, 128, 3, 3),
    "editing_net.decoder.res0.res1.norm1.mlp_gamma.weight": (128, 128),
    "editing_net.decoder.jump1.model.0.weight": (128, 128, 3, 3),
    "editing_net.decoder.jump0.model.1.weight": (64, 1, 1),
    "editing_net.decoder.final.model.0.weight": (3, 64, 7, 7),
    "editing_net.decoder.final.model.0.bias": (3,),
}
OFFICIAL_RENDERER_KEY_COUNT = 304


def official_files(model: DreamTalk, directory, extra_denoiser=None, extra_renderer=None):
    """Save ``model``'s weights the way the official files are wrapped."""
    denoiser = {"diff_net." + k: v for k, v in model.diffusion.state_dict().items()}
    denoiser.update(extra_denoiser or {})
    renderer = dict(model.renderer.state_dict())
    renderer.update(extra_renderer or {})
    paths = directory / "denoising_network.pth", directory / "renderer.pt"
    torch.save({"model_state_dict": denoiser}, paths[0])
    torch.save({"net_G_ema": renderer}, paths[1])
    return paths


def test_full_size_layout_matches_the_official_checkpoints(tmp_path):
    source = DreamTalk(DreamTalkConfig(), seed=1)
    denoiser = {"diff_net." + k: v for k, v in source.diffusion.state_dict().items()}
    renderer = source.renderer.state_dict()
    assert len(denoiser) == OFFICIAL_DENOISER_KEY_COUNT and len(renderer) == OFFICIAL_RENDERER_KEY_COUNT
    for name, shape in OFFICIAL_DENOISER_KEYS.items():
        assert tuple(denoiser[name].shape) == shape, name
    for name, shape in OFFICIAL_RENDERER_KEYS.items():
        assert tuple(renderer[name].shape) == shape, name
    assert denoiser["diff_net.null_pad_mask"].dtype == torch.bool
    # 51 upper-face + 13 mouth coefficients cover the 64 expression coefficients.
    assert len(DreamTalkConfig().upper_face_indices) == 51 and len(DreamTalkConfig().lower_face_indices) == 13

    # Training-time entries outside "diff_net." are ignored, as the official loader does.
    paths = official_files(source, tmp_path, extra_denoiser={"discriminator.weight": torch.zeros(3)})
    config = DreamTalkConfig(denoiser_checkpoint=str(paths[0]), renderer_checkpoint=str(paths[1]))
    loaded = DreamTalk.from_pretrained(config)
    for mine, theirs in ((loaded.diffusion, source.diffusion), (loaded.renderer, source.renderer)):
        other = theirs.state_dict()
        assert all(torch.equal(v, other[k]) for k, v in mine.state_dict().items())
    assert "sha256:" in loaded.fingerprint() and "random" not in loaded.fingerprint()
    assert loaded.features == DREAMTALK_FEATURES


def test_checkpoint_mismatches_name_the_file_and_the_keys(tmp_path):
    source = DreamTalk(TINY)
    key = "net.style_encoder.aggregate_method.W.0.weight"
    state = {"diff_net." + k: v for k, v in source.diffusion.state_dict().items()}
    state["diff_net.net.style_encoder.pool.weight"] = state.pop("diff_net." + key)
    bad = tmp_path / "renamed.pth"
    torch.save({"model_state_dict": state}, bad)
    with pytest.raises(CheckpointError) as error:
        DreamTalk(TINY).load_checkpoints(denoiser=bad)
    message = str(error.value)
    assert str(bad) in message and "1 missing keys: diff_net." + key in message
    assert "1 unexpected keys: diff_net.net.style_encoder.pool.weight" in message

    renderer = dict(source.renderer.state_dict())
    renderer["mapping_net.first.0.weight"] = torch.zeros(1, 2, 3)
    wrong_shape = tmp_path / "wrong_shape.pt"
    torch.save({"net_G_ema": renderer}, wrong_shape)
    with pytest.raises(CheckpointError, match=r"wrong_shape\.pt.*wrong shapes: mapping_net\.first\.0\.weight"):
        DreamTalk(TINY).load_checkpoints(renderer=wrong_shape)

    no_entry = tmp_path / "no_entry.pt"
    torch.save({"net_G": renderer}, no_entry)
    with pytest.raises(CheckpointError, match=r"no_entry\.pt: no 'net_G_ema' entry"):
        DreamTalk(TINY).load_checkpoints(renderer=no_entry)
    with pytest.raises(CheckpointError, match="not found"):
        DreamTalk(TINY).load_checkpoints(renderer=tmp_path / "absent.pt")
    with pytest.raises(CheckpointError, match="renderer_checkpoint not set"):
        DreamTalk.from_pretrained(DreamTalkConfig.tiny(denoiser_checkpoint=str(bad)))


class TrainingConfig:
    """Stands in for the non-tensor objects a training checkpoint may carry."""


def test_checkpoints_with_python_objects_need_trust(tmp_path):
    source = DreamTalk(TINY, seed=3)
    paths = official_files(source, tmp_path)
    checkpoint = torch.load(paths[0], weights_only=True)
    checkpoint["cfg"] = TrainingConfig()
    torch.save(checkpoint, paths[0])
    with pytest.raises(CheckpointError, match="trust_checkpoints"):
        DreamTalk.from_pretrained(DreamTalkConfig.tiny(denoiser_checkpoint=str(paths[0]), renderer_checkpoint=str(paths[1])))
    trusted = DreamTalkConfig.tiny(denoiser_checkpoint=str(paths[0]), renderer_checkpoint=str(paths[1]), trust_checkpoints=True)
    loaded = DreamTalk.from_pretrained(trusted)
    assert torch.equal(loaded.diffusion.null_style_code(), source.diffusion.null_style_code())


def test_per_unit_content_is_spread_by_the_alignment_with_silence_in_pauses(model):
    from empatheia.generators.base import expand_units

    clip = speech(1.0)  # 25 frames
    # Three units with silence before, between and after them.
    alignment = torch.full((clip.samples.shape[0],), -1, dtype=torch.long)
    alignment[1600:6000], alignment[6000:7000], alignment[9000:14000] = 0, 1, 2
    aligned = Waveform(clip.samples, clip.sample_rate, alignment)
    units = torch.randn(3, TINY.content_dim, generator=torch.Generator().manual_seed(3))
    silence = model.silence_content()
    quiet = Waveform(torch.zeros(16000), 16000)
    assert torch.allclose(silence, model.speech_content(quiet, 1).reshape(-1).float())
    expanded, labels = expand_units(units, aligned, 25, model.fps, silence)
    assert (labels >= 0).sum() > 0 and (labels < 0).sum() > 0
    assert torch.equal(expanded[labels < 0], silence.expand(int((labels < 0).sum()), -1))
    from_units = model.animate(aligned, units, style(0), PORTRAIT, seed=1).frames
    from_frames = model.animate(clip, expanded, style(0), PORTRAIT, seed=1).frames
    assert from_units.shape[0] == 25 and torch.equal(from_units, from_frames)
