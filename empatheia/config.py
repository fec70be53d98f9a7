"""Configuration of an :class:`~empatheia.Empatheia` model.

One dataclass per part, gathered in :class:`EmpatheiaConfig`, saved and loaded as YAML.
Presets:

* ``tiny``: tiny configs of the real classes (HuBERT, open_clip ViT, Llama) with random
  weights drawn from ``seed``; builds in about a second on a CPU, used by the tests.
* ``paper``: the system of the Empatheia paper (Vicuna-7B v1.5, HuBERT-large,
  open_clip ViT-L-14-336 with OpenAI weights, StyleTTS2 and DreamTalk feature sizes).
  Names can be replaced by local paths; nothing is downloaded until the model is built.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import yaml

from generators.features import DREAMTALK_FEATURES, STYLETTS2_FEATURES

from .labels import AGE_LABELS, EMOTION_LABELS, GENDER_LABELS, TIMBRE_LABELS


@dataclass
class SpeechEncoderConfig:
    """A frozen HuBERT encoder; each utterance becomes ``num_tokens`` feature tokens."""

    pretrained: Optional[str] = None
    """Hugging Face name or local path of a ``HubertModel``; ``None`` builds random weights
    from ``architecture``."""
    architecture: Dict[str, Any] = field(default_factory=dict)
    """``transformers.HubertConfig`` arguments used when ``pretrained`` is ``None``."""
    hidden_size: int = 1024
    """Width of the encoder's last hidden state (checked against the built model)."""
    num_tokens: int = 16
    """Feature tokens per utterance (the encoder's frames are average-pooled to this)."""
    sample_rate: int = 16000


@dataclass
class VideoEncoderConfig:
    """A frozen open_clip vision tower. Frames are taken from each utterance's video at
    ``frame_rate`` per second (at most ``num_frames``), the face is cropped, and the
    frames' image embeddings are pooled over time into ``num_tokens`` tokens."""

    model_name: str = "ViT-L-14-336"
    pretrained: Optional[str] = None
    """open_clip pretrained tag (``"openai"``) or a local checkpoint path; ``None`` keeps
    random weights."""
    vision_cfg: Dict[str, Any] = field(default_factory=dict)
    """Overrides of open_clip's ``CLIPVisionCfg`` for ``model_name`` (tiny preset)."""
    embed_dim: int = 768
    """Width of the tower's image embedding (checked against the built model)."""
    image_size: int = 336
    num_frames: int = 8
    """Most frames taken per utterance; a longer clip gets them spread over its length."""
    frame_rate: float = 2.0
    """Frames per second taken from a video (AvaMERG utterances last ~5.7 s)."""
    face_crop: bool = True
    """Crop each clip to the face found by OpenCV's packaged Haar detector before resizing;
    a clip with no face is an error. ``False`` centre-crops the whole frame."""
    num_tokens: int = 8
    mean: List[float] = field(default_factory=lambda: [0.48145466, 0.4578275, 0.40821073])
    std: List[float] = field(default_factory=lambda: [0.26862954, 0.26130258, 0.27577711])


@dataclass
class ProjectorConfig:
    """MLP from an encoder's width into the language model's width (LLaVA's mlp2x_gelu)."""

    num_layers: int = 2


@dataclass
class LoraSettings:
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: List[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


@dataclass
class LanguageModelConfig:
    """The language core: any Hugging Face causal LM, adapted with LoRA."""

    pretrained: Optional[str] = "lmsys/vicuna-7b-v1.5"
    """Hugging Face name or local path; ``None`` builds random weights from
    ``architecture``."""
    model_type: str = "llama"
    architecture: Dict[str, Any] = field(default_factory=dict)
    """``AutoConfig.for_model(model_type, **architecture)`` arguments when random."""
    tokenizer: Optional[str] = None
    """Tokenizer name or path; ``None`` uses ``pretrained``; ``"builtin"`` builds the small
    byte-level BPE tokenizer that ships with the package (tiny preset)."""
    prompt_format: str = "vicuna"
    """``"vicuna"`` (USER:/ASSISTANT:), ``"chat_template"`` (the tokenizer's own) or
    ``"plain"``."""
    hidden_size: int = 4096
    num_signal_tokens: int = 16
    """Signal tokens per modality: ``<AUD1>..<AUDn>`` and ``<VID1>..<VIDn>``."""
    max_length: int = 2048
    """Longest prompt + target, in tokens."""
    max_new_tokens: int = 256
    """Default generation budget of ``respond``."""
    lora: LoraSettings = field(default_factory=LoraSettings)


@dataclass
class ContentSynchronizerConfig:
    """Transformer-VAE from the response text's hidden states to generator content features
    (eqs. 1-2). Output lengths are given per call (phonemes for speech, frames for video)."""

    d_model: int = 1024
    num_heads: int = 16
    num_layers: int = 4
    ffn_dim: int = 4096
    latent_dim: int = 256
    dropout: float = 0.1
    speech_content_dim: int = STYLETTS2_FEATURES.content_dim
    video_content_dim: int = DREAMTALK_FEATURES.content_dim
    max_speech_length: int = 1024
    max_video_length: int = 1500
    phonemes_per_char: float = STYLETTS2_FEATURES.units_per_char
    """Length estimate used when no speech generator gives the exact phoneme count."""
    frames_per_char: float = DREAMTALK_FEATURES.units_per_char
    """Length estimate used when no speech waveform gives the exact frame count."""


@dataclass
class StyleDisentanglerConfig:
    """Transformer-VAE from the signal tokens' hidden states to emotion and profile
    features and the generators' style features (eqs. 3-7), with the classifiers of
    eq. 11."""

    d_model: int = 1024
    num_heads: int = 16
    num_layers: int = 4
    ffn_dim: int = 4096
    latent_dim: int = 256
    dropout: float = 0.1
    num_queries: int = 4
    """Learned queries per (modality, branch)."""
    speech_style_dim: int = STYLETTS2_FEATURES.style_dim
    video_style_dim: int = DREAMTALK_FEATURES.style_dim
    emotion_labels: List[str] = field(default_factory=lambda: list(EMOTION_LABELS))
    profile_labels: Dict[str, List[str]] = field(
        default_factory=lambda: {
            "age": list(AGE_LABELS),
            "gender": list(GENDER_LABELS),
            "timbre": list(TIMBRE_LABELS),
        }
    )


@dataclass
class LossConfig:
    alpha: float = 0.2
    """Weight of L_ccl in stage 4 (eq. 13)."""
    beta: float = 0.3
    """Weight of L_sac in stage 4 (eq. 13)."""
    kl_weight: float = 1e-3
    """Weight of each VAE's KL term, added wherever that VAE is trained."""


@dataclass
class GeneratorsConfig:
    """Which speech and talking-head generators ``respond(speak=True, animate=True)``
    drives, and where their weights are (local paths; nothing is downloaded)."""

    speech: str = "styletts2"
    """``styletts2`` (the paper's) or ``piper`` (the packaged offline voice)."""
    talking_head: str = "dreamtalk"
    """``dreamtalk`` (the paper's) or ``avatar`` (the weight-free offline renderer)."""
    styletts2: Dict[str, Any] = field(default_factory=dict)
    """Fields of ``generators.styletts2.StyleTTS2Config`` (checkpoint and helper paths)."""
    dreamtalk: Dict[str, Any] = field(default_factory=dict)
    """Fields of ``generators.dreamtalk.DreamTalkConfig`` (checkpoints, wav2vec2 path)."""
    avatars: Optional[str] = None
    """Folder of registered avatars (voice and portrait per listener ID); ``None`` keeps
    them in memory for the session."""


@dataclass
class EmpatheiaConfig:
    speech_encoder: SpeechEncoderConfig = field(default_factory=SpeechEncoderConfig)
    video_encoder: VideoEncoderConfig = field(default_factory=VideoEncoderConfig)
    projector: ProjectorConfig = field(default_factory=ProjectorConfig)
    language_model: LanguageModelConfig = field(default_factory=LanguageModelConfig)
    content_synchronizer: ContentSynchronizerConfig = field(default_factory=ContentSynchronizerConfig)
    style_disentangler: StyleDisentanglerConfig = field(default_factory=StyleDisentanglerConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    generators: GeneratorsConfig = field(default_factory=GeneratorsConfig)
    preset: Optional[str] = None
    seed: int = 0
    """Seed of every randomly initialised weight, so a model rebuilt from this config
    (``from_pretrained``) has the same random base weights."""

    # ------------------------------------------------------------------ presets
    @classmethod
    def from_preset(cls, name: str, overrides: Optional[Dict[str, Any]] = None) -> "EmpatheiaConfig":
        """Build a preset; ``overrides`` maps dotted keys (``"language_model.pretrained"``)
        to values."""
        builders = {"tiny": _tiny, "paper": _paper}
        if name not in builders:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(builders)}")
        config = builders[name]()
        config.preset = name
        if overrides:
            config.update(overrides)
        return config

    # ------------------------------------------------------------------ editing
    def update(self, overrides: Dict[str, Any]) -> "EmpatheiaConfig":
        """Set dotted keys in place, e.g. ``{"loss.alpha": 0.5}``. An unknown key is an
        error that names it."""
        for dotted, value in overrides.items():
            *path, leaf = dotted.split(".")
            node: Any = self
            for i, part in enumerate(path):
                if not dataclasses.is_dataclass(node) or not hasattr(node, part):
                    raise KeyError(f"unknown config key {'.'.join(path[: i + 1])!r} (in {dotted!r})")
                node = getattr(node, part)
            if isinstance(node, dict):
                node[leaf] = value
            elif dataclasses.is_dataclass(node) and leaf in {f.name for f in dataclasses.fields(node)}:
                setattr(node, leaf, value)
            else:
                raise KeyError(f"unknown config key {dotted!r}")
        return self

    # ------------------------------------------------------------------ YAML
    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Dict[str, Any], source: str = "config") -> "EmpatheiaConfig":
        return _build_dataclass(cls, data, source)

    def save_yaml(self, path: Union[str, Path]) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def load_yaml(cls, path: Union[str, Path]) -> "EmpatheiaConfig":
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as error:
            raise ValueError(f"{path}: not valid YAML: {error}") from error
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
        return cls.from_dict(data, source=str(path))


def _build_dataclass(cls, data: Dict[str, Any], source: str):
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise KeyError(f"{source}: unknown key(s) {unknown} for {cls.__name__}; known: {sorted(known)}")
    kwargs = {}
    for name, value in data.items():
        field_type = known[name].type
        sub = _DATACLASS_FIELDS.get(field_type)
        if sub is not None and isinstance(value, dict):
            value = _build_dataclass(sub, value, f"{source}:{name}")
        kwargs[name] = value
    return cls(**kwargs)


_DATACLASS_FIELDS = {
    "SpeechEncoderConfig": SpeechEncoderConfig,
    "VideoEncoderConfig": VideoEncoderConfig,
    "ProjectorConfig": ProjectorConfig,
    "LanguageModelConfig": LanguageModelConfig,
    "LoraSettings": LoraSettings,
    "ContentSynchronizerConfig": ContentSynchronizerConfig,
    "StyleDisentanglerConfig": StyleDisentanglerConfig,
    "LossConfig": LossConfig,
    "GeneratorsConfig": GeneratorsConfig,
}


def _paper() -> EmpatheiaConfig:
    """Sizes of the paper's system (§4, Table 8); every name may be a local path."""
    return EmpatheiaConfig(
        speech_encoder=SpeechEncoderConfig(
            pretrained="facebook/hubert-large-ll60k",
            # HuBERT-large's architecture, used only if `pretrained` is set to None (random
            # full-size weights, e.g. for throughput measurements).
            architecture=dict(
                hidden_size=1024,
                num_hidden_layers=24,
                num_attention_heads=16,
                intermediate_size=4096,
                feat_extract_norm="layer",
                do_stable_layer_norm=True,
                conv_bias=True,
            ),
            hidden_size=1024,
            num_tokens=16,
        ),
        video_encoder=VideoEncoderConfig(
            model_name="ViT-L-14-336", pretrained="openai", embed_dim=768, image_size=336, num_frames=8, num_tokens=8
        ),
        language_model=LanguageModelConfig(
            pretrained="lmsys/vicuna-7b-v1.5",
            # Vicuna-7B v1.5 (a Llama-2-7B), used only if `pretrained` is set to None.
            model_type="llama",
            architecture=dict(
                vocab_size=32000,
                hidden_size=4096,
                intermediate_size=11008,
                num_hidden_layers=32,
                num_attention_heads=32,
                num_key_value_heads=32,
                max_position_embeddings=4096,
                rms_norm_eps=1e-5,
                tie_word_embeddings=False,
            ),
            prompt_format="vicuna",
            hidden_size=4096,
            max_length=2048,
        ),
    )


def _tiny() -> EmpatheiaConfig:
    """Tiny configs of the real classes, random weights: builds in about a second."""
    return EmpatheiaConfig(
        speech_encoder=SpeechEncoderConfig(
            pretrained=None,
            architecture=dict(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=64,
                conv_dim=[32, 32, 32, 32, 32, 32, 32],
                conv_stride=[5, 2, 2, 2, 2, 2, 2],
                conv_kernel=[10, 3, 3, 3, 3, 2, 2],
                num_conv_pos_embeddings=16,
                num_conv_pos_embedding_groups=4,
                # HuBERT-large's normalisation, which lets padded batches match unpadded
                # utterances (group norm, as in HuBERT-base, mixes padding into every frame).
                feat_extract_norm="layer",
                do_stable_layer_norm=True,
                conv_bias=True,
            ),
            hidden_size=32,
            num_tokens=4,
        ),
        video_encoder=VideoEncoderConfig(
            model_name="ViT-L-14-336",
            pretrained=None,
            vision_cfg=dict(image_size=32, layers=2, width=32, head_width=16, patch_size=8),
            embed_dim=24,
            image_size=32,
            num_frames=4,
            # Tests feed synthetic frames with no face in them.
            face_crop=False,
            num_tokens=2,
        ),
        language_model=LanguageModelConfig(
            pretrained=None,
            model_type="llama",
            architecture=dict(
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=4096,
                tie_word_embeddings=False,
            ),
            tokenizer="builtin",
            prompt_format="plain",
            hidden_size=64,
            num_signal_tokens=16,
            max_length=1024,
            max_new_tokens=48,
            lora=LoraSettings(r=4, alpha=8, dropout=0.0),
        ),
        content_synchronizer=ContentSynchronizerConfig(
            d_model=32,
            num_heads=4,
            num_layers=2,
            ffn_dim=64,
            latent_dim=16,
            dropout=0.0,
            speech_content_dim=24,
            video_content_dim=20,
            max_speech_length=256,
            max_video_length=256,
        ),
        style_disentangler=StyleDisentanglerConfig(
            d_model=32,
            num_heads=4,
            num_layers=2,
            ffn_dim=64,
            latent_dim=16,
            dropout=0.0,
            num_queries=2,
            speech_style_dim=12,
            video_style_dim=10,
        ),
        generators=GeneratorsConfig(speech="piper", talking_head="avatar"),
    )
