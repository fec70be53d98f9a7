"""StyleTTS2 driven by C^s and S^s: phonemes, gold features, synthesis and checkpoints.

Random weights only (no StyleTTS2 weights ship in any package); the full LibriTTS
architecture builds in under a second, the ``tiny`` preset keeps random speech short.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("styletts2", reason="StyleTTS2 needs the styletts2 package (installed --no-deps)")
pytest.importorskip("gruut", reason="StyleTTS2 phonemes need gruut and gruut-lang-en")
soundfile = pytest.importorskip("soundfile")

from empatheia.generators.base import Avatar  # noqa: E402
from empatheia.feature_sizes import STYLETTS2_FEATURES  # noqa: E402
from empatheia.generators.styletts2 import (  # noqa: E402
    FRAME_SAMPLES,
    SYNTHESIS_MODULES,
    TAIL_TRIM,
    StyleTTS2CheckpointError,
    StyleTTS2Config,
    StyleTTS2Speech,
    _trim_silence,
)

from .conftest import shared_data  # noqa: E402

TEXTS = ["Hello, world!", "That's wonderful! How does it feel?", "Hi."]


@pytest.fixture(scope="module")
def full() -> StyleTTS2Speech:
    """The released LibriTTS architecture, random weights (seed 0)."""
    return StyleTTS2Speech.from_config(StyleTTS2Config())


@pytest.fixture(scope="module")
def full_short() -> StyleTTS2Speech:
    """The full architecture, random weights, with the duration head's bias lowered: as
    drawn, each of its 50 bins adds about half a frame, ~25 frames (0.6 s) per token, so
    a short sentence takes half a minute to decode on a CPU; a bias of -3 gives ~2 frames
    per token, the rate of real speech. The architecture is unchanged."""
    model = StyleTTS2Speech.from_config(StyleTTS2Config())
    model.nets["predictor"].duration_proj.linear_layer.bias.data -= 3.0
    return model


@pytest.fixture(scope="module")
def tiny() -> StyleTTS2Speech:
    return StyleTTS2Speech.from_config(StyleTTS2Config.tiny())


def avatar(voice: str = "default", key: str = "listener-1") -> Avatar:
    return Avatar(key=key, portrait=np.zeros((8, 8, 3), np.uint8), voice=voice, profile={})


def styles(model: StyleTTS2Speech, n: int, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(model.features.style_dim, generator=g) for _ in range(n)]


def write_clip(path, seconds: float, rate: int = 16000, silence: float = 0.0, seed: int = 0):
    """A voiced-sounding clip (harmonics plus noise) with ``silence`` seconds either side."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    voiced = sum(np.sin(2 * np.pi * 140 * k * t) / k for k in range(1, 6)) * 0.2
    voiced += rng.standard_normal(t.shape) * 0.02
    pad = np.zeros(int(silence * rate))
    soundfile.write(str(path), np.concatenate([pad, voiced, pad]).astype(np.float32), rate)
    return path


# ------------------------------------------------------------------------ phonemes
def test_phonemes_follow_espeak_spelling_and_the_symbol_table(tiny):
    phonemizer = tiny.phonemizer
    assert phonemizer.phonemes("Hello, world!") == "hɛlˈoʊ , wˈɜːld !"
    # Affricates without gruut's tie bar, long vowels as espeak writes them.
    assert phonemizer.phonemes("Church keys.") == "tʃˈɜːtʃ kˈiːz ."
    tokens = phonemizer.tokens("Hello, world!")
    assert tokens[0] == 0 and len(tokens) == 1 + len("hɛlˈoʊ , wˈɜːld !")
    assert all(0 <= t < tiny.params["n_token"] for t in tokens)
    assert tiny.content_length("Hello, world!") == len(tokens)
    # Quotes and brackets are silent; numbers are read out.
    assert phonemizer.phonemes('"Really" (yes)') == phonemizer.phonemes("Really yes")
    assert len(phonemizer.phonemes("42")) > 4
    with pytest.raises(ValueError, match="no speakable phonemes"):
        tiny.content_length("  ")


def test_texts_longer_than_plbert_positions_are_refused(tiny):
    with pytest.raises(ValueError, match="PL-BERT's 512 positions"):
        tiny.content_features(["This sentence is long enough. " * 25])


# --------------------------------------------------------- full architecture, random
def test_full_architecture_has_the_published_shapes(full):
    assert full.features is STYLETTS2_FEATURES
    assert (full.features.content_dim, full.features.style_dim) == (1024, 256)
    assert full.sample_rate == 24000 and full.params["decoder"]["type"] == "hifigan"
    nets = full.nets
    assert set(nets) == set(SYNTHESIS_MODULES)
    assert nets["text_encoder"].embedding.weight.shape == (178, 512)
    assert nets["bert"].config.hidden_size == 768 and nets["bert"].config.num_hidden_layers == 12
    assert nets["bert_encoder"].weight.shape == (512, 768)
    assert nets["style_encoder"].unshared.out_features == 128
    assert nets["predictor_encoder"].unshared.out_features == 128
    assert nets["predictor"].duration_proj.linear_layer.out_features == 50


def test_full_architecture_gold_features(full, tmp_path):
    contents = full.content_features(TEXTS)
    assert [c.shape for c in contents] == [(full.content_length(t), 1024) for t in TEXTS]
    assert all(c.dtype == torch.float32 and torch.isfinite(c).all() for c in contents)
    # Batched rows are the rows of each text alone (padding is masked in both encoders).
    alone = full.content_features([TEXTS[1]])[0]
    torch.testing.assert_close(contents[1], alone, atol=1e-4, rtol=1e-4)

    clips = [
        write_clip(tmp_path / "a.wav", 1.5, silence=0.5),
        write_clip(tmp_path / "b.wav", 0.3, rate=24000, seed=1),  # shorter than the encoders' window
    ]
    found = full.style_features(clips)
    assert [s.shape for s in found] == [(256,), (256,)]
    assert all(torch.isfinite(s).all() for s in found)
    assert not torch.allclose(found[0], found[1])


def test_style_of_real_emotional_speech(full):
    """Real 16 kHz recordings (resampled to 24 kHz): one finite 256-d style each, and
    different speakers' clips give different styles."""
    clips = [shared_data(f"media/speech/{name}.wav") for name in ("angry1", "sad")]
    found = full.style_features(clips)
    assert [s.shape for s in found] == [(256,), (256,)]
    assert all(torch.isfinite(s).all() for s in found) and not torch.allclose(found[0], found[1])


def test_full_architecture_synthesizes_24khz_speech_of_plausible_length(full_short):
    text = TEXTS[0]
    length = full_short.content_length(text)
    wave = full_short.synthesize(text, None, styles(full_short, 1)[0], avatar())
    assert wave.sample_rate == 24000
    samples = wave.samples
    assert samples.dim() == 1 and samples.dtype == torch.float32
    assert torch.isfinite(samples).all() and samples.abs().max() <= 1.0
    # At least one frame per phoneme token, at most max_dur frames per token.
    assert length * FRAME_SAMPLES - TAIL_TRIM <= samples.shape[0] <= length * 50 * FRAME_SAMPLES - TAIL_TRIM
    assert (samples.shape[0] + TAIL_TRIM) % FRAME_SAMPLES == 0
    assert samples.std() > 1e-3  # not silence


def test_given_content_drives_synthesis_like_the_text(full_short):
    text = TEXTS[2]
    style = styles(full_short, 1)[0]
    from_text = full_short.synthesize(text, None, style, avatar()).samples
    content = full_short.content_features([text])[0]
    from_content = full_short.synthesize(text, content, style, avatar()).samples
    torch.testing.assert_close(from_text, from_content)
    # C^s, not the text, is what is spoken.
    other = full_short.synthesize(text, content.flip(0), style, avatar()).samples
    assert other.shape != from_content.shape or not torch.allclose(other, from_content)


def test_different_styles_give_different_speech(full_short):
    text = TEXTS[2]
    content = full_short.content_features([text])[0]
    first, second = styles(full_short, 2)
    wave_1 = full_short.synthesize(text, content, first, avatar()).samples
    wave_2 = full_short.synthesize(text, content, second, avatar()).samples
    assert wave_1.shape != wave_2.shape or (wave_1 - wave_2).abs().mean() > 1e-3
    # Only the acoustic half changed: durations (prosodic half) stay, the sound differs.
    mixed = torch.cat([second[:128], first[128:]])
    wave_3 = full_short.synthesize(text, content, mixed, avatar()).samples
    assert wave_3.shape == wave_1.shape and (wave_3 - wave_1).abs().mean() > 1e-3


# ------------------------------------------------------------------ tiny: contracts
def test_synthesis_checks_its_inputs(tiny):
    text = TEXTS[0]
    style = styles(tiny, 1)[0]
    length = tiny.content_length(text)
    with pytest.raises(ValueError, match=r"content must be"):
        tiny.synthesize(text, torch.zeros(length + 1, 1024), style, avatar())
    with pytest.raises(ValueError, match="style must have 256"):
        tiny.synthesize(text, None, torch.zeros(128), avatar())
    with pytest.raises(ValueError, match="no reference clip"):
        tiny.synthesize(text, None, None, avatar(voice="default"))


def test_same_inputs_same_waveform_and_avatar_voice_as_fallback_style(tiny, tmp_path):
    text = TEXTS[0]
    clip = str(write_clip(tmp_path / "voice.wav", 1.2))
    style = tiny.style_features([clip])[0]
    with_style = tiny.synthesize(text, None, style, avatar())
    again = tiny.synthesize(text, None, style, avatar())
    torch.testing.assert_close(with_style.samples, again.samples)
    from_voice = tiny.synthesize(text, None, None, avatar(voice=clip))
    torch.testing.assert_close(from_voice.samples, with_style.samples)
    # Given S^s wins over the avatar's clip.
    other = styles(tiny, 1, seed=3)[0]
    given = tiny.synthesize(text, None, other, avatar(voice=clip))
    assert given.samples.shape != with_style.samples.shape or not torch.allclose(given.samples, with_style.samples)


def test_trim_silence_cuts_quiet_ends():
    rate = 24000
    tone = torch.sin(torch.arange(rate) * 2 * torch.pi * 200 / rate) * 0.5
    wave = torch.cat([torch.zeros(rate), tone, torch.zeros(rate)])
    trimmed = _trim_silence(wave)
    # Frames of 2048 samples that overlap the tone count as loud: up to one frame more.
    assert rate <= trimmed.shape[0] <= rate + 2 * 2048
    assert trimmed.abs().max() == wave.abs().max()
    assert _trim_silence(torch.zeros(rate)).shape[0] == rate  # all silent: kept


def test_fingerprint_follows_the_weights(full, tiny):
    assert full.fingerprint() == full.fingerprint()
    assert full.fingerprint() == StyleTTS2Speech.from_config(StyleTTS2Config()).fingerprint()
    assert full.fingerprint() != tiny.fingerprint()


# ----------------------------------------------------------------------- checkpoints
def official_layout(model: StyleTTS2Speech, modules=SYNTHESIS_MODULES) -> dict:
    """``{"net": {module: {"module.<key>": tensor}}}`` as the released checkpoint holds it,
    with the entries a real one has beyond the synthesis modules."""
    net = {
        name: {f"module.{key}": value.clone() for key, value in model.nets[name].state_dict().items()}
        for name in modules
    }
    if "bert" in net:
        # Older transformers saved PL-BERT's position ids as a buffer.
        net["bert"]["module.embeddings.position_ids"] = torch.arange(512)[None]
    net["diffusion"] = {"module.unet.proj.weight": torch.zeros(4, 4)}
    net["mpd"] = {"module.discriminators.0.conv.weight": torch.zeros(2)}
    return {"net": net, "epoch": 20, "iters": 1000}


def test_checkpoint_in_the_official_layout_loads(full, tmp_path):
    source = StyleTTS2Speech.from_config(StyleTTS2Config(seed=1))
    path = tmp_path / "epochs_2nd_00020.pth"
    torch.save(official_layout(source), path)
    loaded = StyleTTS2Speech.from_config(StyleTTS2Config(checkpoint=str(path)))  # seed 0 otherwise
    for name in SYNTHESIS_MODULES:
        expected = source.nets[name].state_dict()
        for key, value in loaded.nets[name].state_dict().items():
            assert torch.equal(value, expected[key]), f"{name}.{key}"
    assert loaded.fingerprint() == source.fingerprint() != full.fingerprint()


def test_plbert_from_its_own_checkpoint_when_the_main_one_lacks_it(full, tmp_path):
    main = tmp_path / "no_bert.pth"
    torch.save(official_layout(full, [m for m in SYNTHESIS_MODULES if m != "bert"]), main)
    with pytest.raises(StyleTTS2CheckpointError, match="'bert' is missing.*plbert_checkpoint"):
        StyleTTS2Speech.from_config(StyleTTS2Config(checkpoint=str(main)))

    donor = StyleTTS2Speech.from_config(StyleTTS2Config(seed=2))
    plbert = tmp_path / "step_1000000.t7"
    weights = {f"module.encoder.{k}": v for k, v in donor.nets["bert"].state_dict().items()}
    weights["module.mask_predictor.weight"] = torch.zeros(3)  # pre-training head, not needed
    torch.save({"net": weights}, plbert)
    loaded = StyleTTS2Speech.from_config(StyleTTS2Config(checkpoint=str(main), plbert_checkpoint=str(plbert)))
    torch.testing.assert_close(
        loaded.nets["bert"].embeddings.word_embeddings.weight, donor.nets["bert"].embeddings.word_embeddings.weight
    )
    torch.testing.assert_close(loaded.nets["decoder"].asr_res[0].bias, full.nets["decoder"].asr_res[0].bias)


class _Opaque:
    """Not a tensor: ``weights_only`` loading refuses it."""


@pytest.mark.parametrize(
    "break_it, message",
    [
        (
            lambda net: net["text_encoder"].pop("module.embedding.weight"),
            r"net\.text_encoder.*missing keys: embedding\.weight",
        ),
        (
            lambda net: net["text_encoder"].__setitem__("module.extra.weight", torch.zeros(1)),
            r"net\.text_encoder.*unexpected keys: extra\.weight",
        ),
        (
            lambda net: net["text_encoder"].__setitem__("module.embedding.weight", torch.zeros(100, 512)),
            r"net\.text_encoder.*wrong shapes: embedding\.weight \(100, 512\) \(expected \(178, 512\)\)",
        ),
        (lambda net: net.pop("text_encoder"), r"module 'text_encoder' is missing under 'net'"),
    ],
    ids=["missing-key", "unexpected-key", "wrong-shape", "missing-module"],
)
def test_checkpoint_that_does_not_fit_is_refused_with_what_is_wrong(full, tmp_path, break_it, message):
    # bert and bert_encoder load first, text_encoder third: the error comes before the
    # large modules, which this partial checkpoint leaves out.
    state = official_layout(full, ["bert", "bert_encoder", "text_encoder"])
    break_it(state["net"])
    path = tmp_path / "broken.pth"
    torch.save(state, path)
    with pytest.raises(StyleTTS2CheckpointError, match=message) as error:
        StyleTTS2Speech.from_config(StyleTTS2Config(checkpoint=str(path)))
    assert str(path) in str(error.value)


def test_checkpoint_without_net_or_with_pickled_objects_is_refused(tmp_path):
    path = tmp_path / "model.pth"
    torch.save({"model": {}}, path)
    with pytest.raises(StyleTTS2CheckpointError, match="under 'net'"):
        StyleTTS2Speech.from_config(StyleTTS2Config.tiny(checkpoint=str(path)))
    torch.save({"net": {}, "meta": _Opaque()}, path)
    with pytest.raises(StyleTTS2CheckpointError, match="trust_checkpoint=True"):
        StyleTTS2Speech.from_config(StyleTTS2Config.tiny(checkpoint=str(path)))
    with pytest.raises(FileNotFoundError, match="nothing.pth"):
        StyleTTS2Speech.from_config(StyleTTS2Config.tiny(checkpoint=str(tmp_path / "nothing.pth")))


def test_alignment_follows_the_predicted_durations(tiny):
    """The waveform's alignment is the predicted durations: token ``k`` for
    ``frames[k] x FRAME_SAMPLES`` samples, a frame late for the hifigan decoder, less
    the trimmed tail."""
    from empatheia.generators.styletts2 import FRAME_SAMPLES, TAIL_TRIM

    captured = []
    hook = tiny.nets["predictor"].duration_proj.register_forward_hook(lambda m, i, out: captured.append(out))
    try:
        text = "I hear you."
        wave = tiny.synthesize(text, None, styles(tiny, 1)[0], avatar())
    finally:
        hook.remove()
    frames = torch.sigmoid(captured[-1]).sum(-1)[0].round().clamp(min=1).long().cpu()
    units = tiny.content_length(text)
    assert frames.shape == (units,) and tiny.content_units(text).shape == (units,)
    per_frame = torch.arange(units).repeat_interleave(frames)
    if tiny.params["decoder"]["type"] == "hifigan":
        per_frame = torch.cat([per_frame[:1], per_frame[:-1]])
    expected = per_frame.repeat_interleave(FRAME_SAMPLES)
    if expected.shape[0] > 2 * TAIL_TRIM:
        expected = expected[:-TAIL_TRIM]
    assert wave.alignment.shape == wave.samples.shape
    assert torch.equal(wave.alignment, expected)
    assert int(tiny.content_units(text).max()) < tiny.unit_vocab_size
