"""StyleTTS2 (LibriTTS model) driven by Empatheia's speech content C^s and style S^s.

StyleTTS2 reads a phoneme sequence twice: its acoustic text encoder (``text_encoder``)
and PL-BERT (``bert``, projected by ``bert_encoder``) each turn it into one 512-d row per
phoneme token. A 256-d reference style drives the rest: the acoustic half (128) conditions
the decoder, the prosodic half (128) the prosody predictor. Empatheia writes exactly
these two things:

* C^s, ``(Ls, 1024)``: per phoneme token, the text-encoder row followed by the
  PL-BERT-encoder row. At synthesis the text-encoder half feeds the decoder (aligned to
  frames by the predicted durations) and the PL-BERT half feeds the prosody predictor
  (durations, then F0 and energy), in the places the two encoders' outputs normally take.
* S^s, ``(256,)``: acoustic style followed by prosodic style, the concatenation of
  ``style_encoder`` and ``predictor_encoder`` over a reference clip's 24 kHz log-mel. It
  replaces StyleTTS2's reference style *and* its style diffusion: the style is used as
  given, so the diffusion model is not built.

Gold features for training (:meth:`StyleTTS2Speech.content_features` and
:meth:`StyleTTS2Speech.style_features`) are computed by the same modules, so a head that
reproduces them drives the generator exactly as the text and the reference clip would.

Weights are the user's own local files, never downloaded: the second-stage checkpoint
``epochs_2nd_00020.pth`` (``{"net": {module: {"module.<key>": tensor}}}``) and, only when
that checkpoint lacks ``bert``, PL-BERT's ``step_1000000.t7``. Without a checkpoint the
modules keep random weights (tests, smoke runs). The module classes come from the
``styletts2`` PyPI package (installed ``--no-deps``, see :data:`INSTALL_HINT`), built from
its YAML configs.

Phonemes: the released models were trained on espeak-ng IPA (``en-us``, with stress
marks, punctuation kept as space-separated tokens). espeak is a system library that is not
always present, so phonemes come from gruut (``gruut-lang-en``, pure Python, offline),
whose IPA is rewritten to espeak's conventions where they differ systematically (long
vowels, stressed r-coloured vowel, affricates without a tie bar) and mapped onto the
package's 178-symbol table. A few espeak habits are not reproduced (flapped /t/, reduced
``ᵻ``): the sequences are close to, not identical with, the training distribution.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import logging
import os
import pickle
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from empatheia.feature_sizes import STYLETTS2_FEATURES, GeneratorFeatures

from .base import Avatar, PathLike, SpeechGenerator, Waveform
from .checkpoint_fit import state_dict_problems

logger = logging.getLogger(__name__)

INSTALL_HINT = (
    "pip install --no-deps styletts2==0.1.6 && pip install gruut gruut-lang-en munch einops-exts "
    "(styletts2's own requirements pin an old transformers; its model code works without them)"
)

SAMPLE_RATE = 24000
HOP_LENGTH = 300
"""Samples per mel frame at 24 kHz (80 frames a second)."""
FRAME_SAMPLES = 2 * HOP_LENGTH
"""Samples per duration unit: StyleTTS2 aligns phonemes at half the mel rate (its aligner
downsamples by two) and the decoder upsamples by two again, so one predicted frame of a
phoneme's duration is 600 samples, 25 ms."""

SYNTHESIS_MODULES = (
    "bert",
    "bert_encoder",
    "text_encoder",
    "predictor",
    "style_encoder",
    "predictor_encoder",
    "decoder",
)
"""Entries of the checkpoint's ``net`` that this generator builds and loads. The others
(``diffusion``: replaced by S^s; ``text_aligner``, ``pitch_extractor``, ``mpd``, ``msd``,
``wd``: training only) are skipped."""

TAIL_TRIM = 50
"""Samples dropped from the end of every waveform: the released decoders end on a short
click, which the official inference also cuts."""

# Reference-clip features (the LibriTTS recipe). The released models were trained with
# torchaudio's MelSpectrogram left at its default sample_rate of 16000 although the audio
# is 24 kHz, so the mel filters are laid out as if for 16 kHz audio (they cover the whole
# 0-12 kHz band on a stretched scale). The style encoders only know those filters, so
# they are reproduced as they are.
_MEL = dict(sample_rate=16000, n_mels=80, n_fft=2048, win_length=1200, hop_length=HOP_LENGTH)
_LOG_MEL_MEAN, _LOG_MEL_STD = -4.0, 4.0
_TRIM_TOP_DB = 30.0
"""Leading and trailing audio quieter than this below the clip's loudest frame is cut
before the style is read (the official reference-clip recipe)."""
_TRIM_FRAME, _TRIM_HOP = 2048, 512
_MIN_STYLE_FRAMES = 80
"""The style encoders halve time four times and end on a 5-wide convolution, so they need
at least 65 mel frames; shorter clips are tiled up to one second (80 frames)."""

_LANGUAGE = "en-us"
"""The released LibriTTS model is English (en-us espeak phonemes)."""
_PAD_TOKEN = 0
"""Symbol 0 (``$``): StyleTTS2 prepends it to every phoneme sequence at inference."""


def _package_file(*parts: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec("styletts2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the styletts2 package is not installed: {INSTALL_HINT}")
    return Path(list(spec.submodule_search_locations)[0]).joinpath(*parts)


# ----------------------------------------------------------------------------- config
@dataclass
class StyleTTS2Config:
    """Where StyleTTS2's weights and configs are (all local paths) and how to run it.

    ``StyleTTS2Config()`` is the full LibriTTS architecture with random weights;
    ``StyleTTS2Config(checkpoint=".../epochs_2nd_00020.pth")`` the released model;
    :meth:`tiny` a smaller random architecture for tests.

    The ASR (text aligner) and JDC (pitch extractor) helper models only serve StyleTTS2's
    own training, as alignment and F0 targets; synthesis and the gold features need
    neither, so they take no paths here (their entries in the checkpoint are skipped).
    """

    checkpoint: Optional[str] = None
    """Second-stage checkpoint (``epochs_2nd_00020.pth``); ``None`` keeps random weights."""
    model_config: Optional[str] = None
    """YAML with ``model_params`` (the checkpoint's ``config.yml``); ``None`` reads the
    LibriTTS config shipped in the styletts2 package."""
    plbert_config: Optional[str] = None
    """PL-BERT YAML (``Utils/PLBERT/config.yml``); ``None`` reads the package's."""
    plbert_checkpoint: Optional[str] = None
    """PL-BERT weights (``step_1000000.t7``), read only when ``checkpoint`` has no ``bert``
    entry (the second-stage checkpoint carries its own fine-tuned PL-BERT)."""
    preset: str = "libritts"
    """``libritts`` (the released architecture) or ``tiny`` (one vocoder residual block
    per stage, shallow PL-BERT and encoders, short random durations; still 1024-d content
    and 256-d style, for tests)."""
    model_overrides: Dict[str, Any] = field(default_factory=dict)
    """Merged (recursively) into ``model_params`` after the preset."""
    plbert_overrides: Dict[str, Any] = field(default_factory=dict)
    """Merged into PL-BERT's ``model_params`` after the preset."""
    device: str = "cpu"
    seed: int = 0
    """Seed of the random initial weights, so two builds without a checkpoint agree."""
    batch_size: int = 16
    """Texts per batch in :meth:`StyleTTS2Speech.content_features`."""
    trust_checkpoint: bool = False
    """Checkpoints are read with ``torch.load(weights_only=True)``; set this to unpickle
    arbitrary objects from a file you trust (e.g. one saved with numpy scalars)."""

    @classmethod
    def tiny(cls, **fields) -> "StyleTTS2Config":
        return cls(preset="tiny", **fields)


_PRESETS: Dict[str, Tuple[dict, dict]] = {
    "libritts": ({}, {}),
    # The decoder's inner widths (1024; 512 for the text features and into the vocoder)
    # are fixed in the package's code, so hidden_dim stays 512 and style_dim 128 (which
    # also keeps the features Empatheia's heads are sized for); what shrinks is the
    # depth, the style encoders, PL-BERT and the vocoder's residual blocks. Each of the
    # max_dur duration bins adds about half a frame under random weights, so a small
    # max_dur keeps random speech short (2 frames a token rather than 25).
    "tiny": (
        {
            "dim_in": 8,
            "n_layer": 1,
            "max_dur": 4,
            "decoder": {"resblock_kernel_sizes": [3], "resblock_dilation_sizes": [[1, 3, 5]]},
        },
        {"hidden_size": 64, "num_attention_heads": 2, "intermediate_size": 128, "num_hidden_layers": 1,
         "embedding_size": 32},
    ),
}


def _merge(base: dict, overrides: Mapping) -> dict:
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _read_yaml_params(path: Path, what: str) -> dict:
    import yaml

    if not path.is_file():
        raise FileNotFoundError(f"StyleTTS2 {what} not found: {path}")
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    if not isinstance(data, dict) or not isinstance(data.get("model_params"), dict):
        raise ValueError(f"StyleTTS2 {what} {path} has no 'model_params' mapping")
    return data["model_params"]


def _model_params(config: StyleTTS2Config) -> Tuple[dict, dict]:
    """(StyleTTS2 ``model_params``, PL-BERT ``model_params``) after preset and overrides."""
    if config.preset not in _PRESETS:
        raise ValueError(f"StyleTTS2Config.preset: unknown {config.preset!r}; choose one of {list(_PRESETS)}")
    model_yaml = Path(config.model_config) if config.model_config else _package_file("Configs", "config_libritts.yml")
    plbert_yaml = Path(config.plbert_config) if config.plbert_config else _package_file("Utils", "PLBERT", "config.yml")
    model_preset, plbert_preset = _PRESETS[config.preset]
    model = _merge(_merge(_read_yaml_params(model_yaml, "model config"), model_preset), config.model_overrides)
    plbert = _merge(_merge(_read_yaml_params(plbert_yaml, "PL-BERT config"), plbert_preset), config.plbert_overrides)
    return model, plbert


# ------------------------------------------------------------------------- modules
def _build_modules(params: dict, plbert_params: dict) -> nn.ModuleDict:
    """The synthesis modules of the checkpoint layout, with the package's classes."""
    try:
        from styletts2 import models as st  # needs munch and einops-exts besides torch
    except ImportError as error:
        raise ImportError(f"StyleTTS2 needs the styletts2 package and its model code's dependencies ({error}): "
                          f"{INSTALL_HINT}") from error
    from transformers import AlbertConfig, AlbertModel

    hidden, style_dim, dec = params["hidden_dim"], params["style_dim"], params["decoder"]
    if dec["type"] == "hifigan":
        from styletts2.Modules.hifigan import Decoder

        decoder_extra = {}
    elif dec["type"] == "istftnet":
        try:
            from styletts2.Modules.istftnet import Decoder
        except ImportError as error:  # istftnet needs scipy, the hifigan decoder does not
            raise ImportError(f"the istftnet decoder needs scipy: pip install scipy ({error})") from error
        decoder_extra = {"gen_istft_n_fft": dec["gen_istft_n_fft"], "gen_istft_hop_size": dec["gen_istft_hop_size"]}
    else:
        raise ValueError(f"StyleTTS2 model_params.decoder.type must be 'hifigan' or 'istftnet', got {dec['type']!r}")

    bert = AlbertModel(AlbertConfig(**plbert_params))
    return nn.ModuleDict(
        {
            "bert": bert,
            "bert_encoder": nn.Linear(bert.config.hidden_size, hidden),
            "text_encoder": st.TextEncoder(
                channels=hidden, kernel_size=5, depth=params["n_layer"], n_symbols=params["n_token"]
            ),
            "predictor": st.ProsodyPredictor(
                style_dim=style_dim, d_hid=hidden, nlayers=params["n_layer"], max_dur=params["max_dur"],
                dropout=params["dropout"],
            ),
            "style_encoder": st.StyleEncoder(dim_in=params["dim_in"], style_dim=style_dim, max_conv_dim=hidden),
            "predictor_encoder": st.StyleEncoder(dim_in=params["dim_in"], style_dim=style_dim, max_conv_dim=hidden),
            "decoder": Decoder(
                dim_in=hidden, style_dim=style_dim, dim_out=params["n_mels"],
                resblock_kernel_sizes=dec["resblock_kernel_sizes"], upsample_rates=dec["upsample_rates"],
                upsample_initial_channel=dec["upsample_initial_channel"],
                resblock_dilation_sizes=dec["resblock_dilation_sizes"],
                upsample_kernel_sizes=dec["upsample_kernel_sizes"], **decoder_extra,
            ),
        }
    )


# ---------------------------------------------------------------------- checkpoints
class StyleTTS2CheckpointError(ValueError):
    """A checkpoint that does not fit the built modules; the message names the file, the
    module and the missing, unexpected or mis-shaped keys."""


def _torch_load(path: Path, trusted: bool) -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"StyleTTS2 checkpoint not found: {path}")
    try:
        try:
            # mmap: only the tensors of the modules actually loaded are read from disk (the
            # released file also holds discriminators and optimizer state).
            return torch.load(path, map_location="cpu", weights_only=not trusted, mmap=True)
        except RuntimeError as error:
            if "mmap" not in str(error):
                raise
            return torch.load(path, map_location="cpu", weights_only=not trusted)  # legacy format
    except pickle.UnpicklingError as error:
        raise StyleTTS2CheckpointError(
            f"{path}: cannot be read as plain tensors ({error}). If you trust this file, set "
            "StyleTTS2Config(trust_checkpoint=True) to unpickle it fully."
        ) from None


def _strip_prefix(state: Mapping[str, torch.Tensor], prefix: str) -> Dict[str, torch.Tensor]:
    """Drop ``prefix`` (``module.``, left by DataParallel) when every key carries it."""
    if state and all(k.startswith(prefix) for k in state):
        return {k[len(prefix):]: v for k, v in state.items()}
    return dict(state)


def _load_module(module: nn.Module, state: Mapping[str, torch.Tensor], where: str) -> None:
    """Strict ``load_state_dict`` with an error that lists what does not fit."""
    expected = module.state_dict()
    # Buffers the module recomputes itself (e.g. PL-BERT's ``embeddings.position_ids``,
    # saved by older transformers) are not weights: accept and ignore them.
    recomputed = {name for name, _ in module.named_buffers()} - set(expected)
    state = {k: v for k, v in state.items() if k not in recomputed}
    problems = state_dict_problems(module, state)
    if problems:
        raise StyleTTS2CheckpointError(
            f"{where} does not fit the model built from the config: " + "; ".join(problems)
            + ". Is the model config (model_config, preset, overrides) the one this checkpoint was trained with?"
        )
    module.load_state_dict(state, strict=True)


def _load_checkpoint(nets: nn.ModuleDict, config: StyleTTS2Config) -> None:
    path = Path(config.checkpoint)
    state = _torch_load(path, config.trust_checkpoint)
    if not isinstance(state, Mapping) or not isinstance(state.get("net"), Mapping):
        found = sorted(map(str, state)) if isinstance(state, Mapping) else type(state).__name__
        raise StyleTTS2CheckpointError(
            f"{path}: expected a StyleTTS2 checkpoint with the modules under 'net', found {found}"
        )
    net = state["net"]
    for name, module in nets.items():
        if name == "bert" and name not in net and config.plbert_checkpoint:
            _load_plbert(module, Path(config.plbert_checkpoint), config.trust_checkpoint)
            continue
        if name not in net:
            raise StyleTTS2CheckpointError(
                f"{path}: module {name!r} is missing under 'net' (found {sorted(net)})"
                + ("; give plbert_checkpoint to read PL-BERT from its own file" if name == "bert" else "")
            )
        _load_module(module, _strip_prefix(net[name], "module."), f"{path} [net.{name}]")
    skipped = sorted(set(net) - set(nets))
    if skipped:
        logger.info("StyleTTS2: %s: not used for synthesis, skipped: %s", path, ", ".join(skipped))


def _load_plbert(bert: nn.Module, path: Path, trusted: bool) -> None:
    """PL-BERT's own checkpoint: ALBERT weights under ``net`` as ``module.encoder.<key>``,
    next to the pre-training heads, which are not needed."""
    state = _torch_load(path, trusted)
    if not isinstance(state, Mapping) or not isinstance(state.get("net"), Mapping):
        raise StyleTTS2CheckpointError(f"{path}: expected a PL-BERT checkpoint with its weights under 'net'")
    weights = _strip_prefix(state["net"], "module.")
    encoder = {k[len("encoder."):]: v for k, v in weights.items() if k.startswith("encoder.")}
    if not encoder:
        raise StyleTTS2CheckpointError(f"{path}: no 'encoder.' (ALBERT) weights under 'net'")
    _load_module(bert, encoder, f"{path} [PL-BERT encoder]")


# ------------------------------------------------------------------------ phonemes
_TIE = "\u0361"
_STRESS = ("ˈ", "ˌ")


def _espeak_like(phonemes: Sequence[str]) -> str:
    """One word's gruut phonemes (stress marks attached to vowels) in espeak-ng's en-us
    spelling, the spelling StyleTTS2's training transcripts use."""
    out = []
    for i, phoneme in enumerate(phonemes):
        phoneme = phoneme.replace(_TIE, "")  # espeak writes tʃ and dʒ, gruut t͡ʃ and d͡ʒ
        stress = phoneme[0] if phoneme[:1] in _STRESS else ""
        base = phoneme[len(stress):]
        following = phonemes[i + 1] if i + 1 < len(phonemes) else ""
        if base == "ɔ" and stress and following == "ɹ":
            base = "oː"  # "more": espeak mˈoːɹ
        elif base in ("ɑ", "ɔ"):
            base += "ː"  # "got", "thought": ɡˈɑːt, θˈɔːt
        elif base in ("i", "u") and stress:
            base += "ː"  # "keys", "you": kˈiːz, jˈuː (unstressed final -i stays short)
        elif base in ("ɚ", "ɝ") and stress:
            base = "ɜː"  # "first": fˈɜːst
        elif base == "ɝ":
            base = "ɚ"
        out.append(stress + base)
    return "".join(out)


class StyleTTS2Phonemizer:
    """English text -> the phoneme tokens StyleTTS2 reads, offline (gruut, see the module
    docstring). Words become espeak-style IPA, punctuation stays as its own
    space-separated token, and the sequence starts with the pad symbol."""

    def __init__(self):
        try:
            import gruut
            from styletts2.text_utils import dicts
        except ImportError as error:
            raise ImportError(f"StyleTTS2 phonemes need gruut, gruut-lang-en and styletts2: {INSTALL_HINT}") from error
        self._sentences = gruut.sentences
        self.symbols: Dict[str, int] = dict(dicts)
        """The package's symbol table (its text cleaner): character -> token id."""
        self._punctuation = set(';:,.!?¡¿—…«»“” ')
        self.version = f"gruut-{getattr(gruut, '__version__', '?')}-espeaklike-1"
        """Changes whenever the same text could give other tokens (part of fingerprints)."""

    def phonemes(self, text: str) -> str:
        """IPA words and punctuation separated by single spaces, e.g. ``"Hello, world!"``
        -> ``"hɛlˈoʊ , wˈɜːld !"``."""
        words: List[str] = []
        for sentence in self._sentences(text.strip(), lang=_LANGUAGE):
            for word in sentence:
                if word.is_major_break or word.is_minor_break or not word.phonemes:
                    # Punctuation: keep the marks the symbol table knows (quotes and
                    # brackets have no sound and are dropped, as the official recipe does).
                    spelled = "".join(c for c in word.text if c in self._punctuation and c != " ")
                else:
                    spelled = "".join(c for c in _espeak_like(word.phonemes) if c in self.symbols)
                if spelled:
                    words.append(spelled)
        return " ".join(words)

    def tokens(self, text: str) -> List[int]:
        """Token ids, the leading pad symbol included: ``len`` is the content length."""
        phonemes = self.phonemes(text)
        if not phonemes:
            raise ValueError(f"StyleTTS2: no speakable phonemes in text {text!r}")
        return [_PAD_TOKEN] + [self.symbols[c] for c in phonemes]


# ---------------------------------------------------------------------- audio
def _trim_silence(wave: torch.Tensor) -> torch.Tensor:
    """``(T,)`` -> ``(T',)`` without the leading and trailing frames more than
    :data:`_TRIM_TOP_DB` below the loudest frame (frame RMS, centred frames)."""
    padded = torch.nn.functional.pad(wave[None, None], (_TRIM_FRAME // 2, _TRIM_FRAME // 2))[0, 0]
    if padded.shape[0] < _TRIM_FRAME:
        return wave
    frames = padded.unfold(0, _TRIM_FRAME, _TRIM_HOP)  # (n_frames, _TRIM_FRAME)
    rms = frames.pow(2).mean(-1).sqrt()
    if float(rms.max()) <= 0.0:
        return wave
    loud = torch.nonzero(20 * torch.log10(rms / rms.max() + 1e-12) > -_TRIM_TOP_DB).flatten()
    start = int(loud[0]) * _TRIM_HOP
    end = min(wave.shape[0], (int(loud[-1]) + 1) * _TRIM_HOP)
    return wave[start:end] if end > start else wave


# ---------------------------------------------------------------------- generator
class StyleTTS2Speech(SpeechGenerator):
    """StyleTTS2 reading C^s and S^s (see the module docstring).

    Build with :meth:`from_config`. ``avatar.voice`` may be a reference clip: it is read
    only when ``synthesize`` gets no style (S^s from Empatheia is used as given, so the
    avatar's clip does not override or blend into it).
    """

    features: GeneratorFeatures = STYLETTS2_FEATURES
    sample_rate: int = SAMPLE_RATE

    def __init__(self, config: Optional[StyleTTS2Config] = None):
        self.config = config = config or StyleTTS2Config()
        self.params, self.plbert_params = _model_params(config)
        self.hidden_dim: int = self.params["hidden_dim"]
        self.style_dim: int = self.params["style_dim"]
        """Width of one style half; S^s is twice this."""
        self.max_tokens: int = self.plbert_params["max_position_embeddings"]
        """PL-BERT's positions bound the phoneme tokens of one text."""
        if (2 * self.hidden_dim, 2 * self.style_dim) != (STYLETTS2_FEATURES.content_dim, STYLETTS2_FEATURES.style_dim):
            self.features = dataclasses.replace(
                STYLETTS2_FEATURES, content_dim=2 * self.hidden_dim, style_dim=2 * self.style_dim
            )
        self.phonemizer = StyleTTS2Phonemizer()
        # Seeded in a forked RNG: a build is reproducible without touching global state.
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            torch.manual_seed(config.seed)
            # The package's code uses the old weight_norm and single-layer LSTMs with
            # dropout; both warnings are about its code and change nothing here.
            warnings.filterwarnings("ignore", message=r".*torch\.nn\.utils\.weight_norm.*is deprecated")
            warnings.filterwarnings("ignore", message=r"dropout option adds dropout after all but last recurrent layer")
            self.nets = _build_modules(self.params, self.plbert_params)
        if config.checkpoint:
            _load_checkpoint(self.nets, config)
        self.nets.eval().requires_grad_(False)
        self.device = torch.device(config.device)
        self.nets.to(self.device)
        import torchaudio

        self._to_mel = torchaudio.transforms.MelSpectrogram(**_MEL).to(self.device)
        self._fingerprint: Optional[str] = None

    @classmethod
    def from_config(cls, config: StyleTTS2Config) -> "StyleTTS2Speech":
        """Build the modules (random weights without ``config.checkpoint``) and load the
        checkpoint; raises :class:`StyleTTS2CheckpointError` when it does not fit."""
        return cls(config)

    # ------------------------------------------------------------------ content
    def content_length(self, text: str) -> int:
        """Phoneme tokens of ``text``, the leading pad symbol included."""
        return len(self.phonemizer.tokens(text))

    @property
    def unit_vocab_size(self) -> int:
        """Token ids :meth:`content_units` can give: the model's symbol count."""
        return int(self.params["n_token"])

    def content_units(self, text: str) -> torch.Tensor:
        """``(Ls,)`` int64 phoneme token ids of ``text`` (the leading pad included), in
        the order of C^s's rows."""
        return torch.tensor(self.phonemizer.tokens(text), dtype=torch.long)

    def _tokens(self, text: str) -> List[int]:
        tokens = self.phonemizer.tokens(text)
        if len(tokens) > self.max_tokens:
            raise ValueError(
                f"StyleTTS2: {len(tokens)} phoneme tokens exceed PL-BERT's {self.max_tokens} positions; "
                f"split the text into shorter sentences (text starts {text[:60]!r})"
            )
        return tokens

    @torch.no_grad()
    def content_features(self, texts: Sequence[str]) -> List[torch.Tensor]:
        """Gold C^s: per text ``(Ls, 2 * hidden_dim)`` float32 on the CPU, rows
        ``[text_encoder | bert_encoder(bert)]`` per phoneme token, ``Ls == content_length``.

        Texts are batched by length; padding is masked in both encoders, so a text gets
        the same rows alone or in a batch.
        """
        token_lists = [self._tokens(t) for t in texts]
        order = sorted(range(len(texts)), key=lambda i: len(token_lists[i]))
        out: List[Optional[torch.Tensor]] = [None] * len(texts)
        step = max(1, self.config.batch_size)
        for first in range(0, len(order), step):
            batch = order[first:first + step]
            lengths = torch.tensor([len(token_lists[i]) for i in batch], device=self.device)  # (B,)
            ids = torch.full((len(batch), int(lengths.max())), _PAD_TOKEN, dtype=torch.long, device=self.device)
            for row, i in enumerate(batch):
                ids[row, : len(token_lists[i])] = torch.tensor(token_lists[i], device=self.device)
            content = self._encode_text(ids, lengths)  # (B, L, 2H)
            for row, i in enumerate(batch):
                # clone: a saved row must not carry the whole batch's storage with it
                out[i] = content[row, : len(token_lists[i])].float().cpu().clone()
        return out  # type: ignore[return-value]

    def _encode_text(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``ids (B, L)``, ``lengths (B,)`` -> ``(B, L, 2H)`` text-encoder ⊕ PL-BERT rows."""
        padding = torch.arange(ids.shape[1], device=ids.device)[None] >= lengths[:, None]  # (B, L), True = pad
        acoustic = self.nets["text_encoder"](ids, lengths, padding)  # (B, H, L)
        bert = self.nets["bert"](ids, attention_mask=(~padding).long()).last_hidden_state  # (B, L, 768)
        prosodic = self.nets["bert_encoder"](bert)  # (B, L, H)
        return torch.cat([acoustic.transpose(1, 2), prosodic], dim=-1)

    # ------------------------------------------------------------------ style
    def style_features(self, audio: Sequence[PathLike]) -> List[torch.Tensor]:
        """Gold S^s: per clip ``(2 * style_dim,)`` float32 on the CPU, acoustic style then
        prosodic style over the clip's 24 kHz log-mel (silence at both ends trimmed)."""
        from empatheia.media import load_audio

        return [self.style_from_waveform(load_audio(path, SAMPLE_RATE), SAMPLE_RATE) for path in audio]

    @torch.no_grad()
    def style_from_waveform(self, samples: torch.Tensor, sample_rate: int) -> torch.Tensor:
        """``(T,)`` mono float audio at ``sample_rate`` -> ``(2 * style_dim,)`` style."""
        wave = samples.detach().float().flatten().cpu()
        if sample_rate != SAMPLE_RATE:
            import torchaudio.functional

            wave = torchaudio.functional.resample(wave, int(sample_rate), SAMPLE_RATE)
        wave = _trim_silence(wave).to(self.device)
        mel = self._to_mel(wave)  # (80, F)
        mel = (torch.log(1e-5 + mel) - _LOG_MEL_MEAN) / _LOG_MEL_STD
        if mel.shape[-1] < _MIN_STYLE_FRAMES:
            mel = mel.repeat(1, -(-_MIN_STYLE_FRAMES // mel.shape[-1]))[:, :_MIN_STYLE_FRAMES]
        image = mel[None, None]  # (1, 1, 80, F): the style encoders are 2-D CNNs
        acoustic = self.nets["style_encoder"](image)  # (1, S)
        prosodic = self.nets["predictor_encoder"](image)  # (1, S)
        return torch.cat([acoustic, prosodic], dim=-1)[0].float().cpu()

    def reference_style(self, avatar: Avatar) -> torch.Tensor:
        """The style of the avatar's reference clip (``avatar.voice`` as an audio path)."""
        if not avatar.voice or not os.path.isfile(avatar.voice):
            raise ValueError(
                f"StyleTTS2: no style given and avatar {avatar.key!r} has no reference clip "
                f"(voice={avatar.voice!r} is not an audio file); pass S^s or register a voice clip"
            )
        return self.style_features([avatar.voice])[0]

    # ------------------------------------------------------------------ synthesis
    def synthesize(
        self, text: str, content: Optional[torch.Tensor], style: Optional[torch.Tensor], avatar: Avatar
    ) -> Waveform:
        """Speech for ``text`` from C^s and S^s.

        Args:
            text: the response text; with ``content`` given it only fixes the expected
                length (``content_length(text)`` rows).
            content: ``(Ls, 2 * hidden_dim)`` C^s, or ``None`` to compute it from ``text``.
            style: ``(2 * style_dim,)`` S^s, used as given; ``None`` reads the style of
                ``avatar.voice`` when that is a reference clip.
            avatar: its :meth:`~Avatar.seed` seeds the decoder's noise source, so the
                same inputs give the same waveform.

        Returns:
            24 kHz float32 samples: :data:`FRAME_SAMPLES` per predicted frame (each token
            lasts 1 to ``max_dur`` frames) less :data:`TAIL_TRIM`, with ``alignment``:
            the token (row of C^s) each sample renders, from the predicted durations.
            StyleTTS2 inserts no silence of its own (pauses are tokens), so no label
            is -1.
        """
        if content is None:
            content = self.content_features([text])[0]
        else:
            expected = (self.content_length(text), self.features.content_dim)
            if tuple(content.shape) != expected:
                raise ValueError(
                    f"StyleTTS2: content must be (content_length(text), {expected[1]}) = {expected}, "
                    f"got {tuple(content.shape)}"
                )
        if style is None:
            style = self.reference_style(avatar)
        if style.numel() != self.features.style_dim:
            raise ValueError(f"StyleTTS2: style must have {self.features.style_dim} values, got {tuple(style.shape)}")
        samples, alignment = self._decode(content, style.reshape(-1), avatar.seed())
        return Waveform(samples=samples, sample_rate=SAMPLE_RATE, alignment=alignment)

    @torch.no_grad()
    def _decode(self, content: torch.Tensor, style: torch.Tensor, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """``content (L, 2H)``, ``style (2S,)`` -> ``(T,)`` float32 samples and ``(T,)``
        int64 alignment (the token each sample renders), both on the CPU."""
        predictor, hidden = self.nets["predictor"], self.hidden_dim
        rows = content.to(self.device, torch.float32).T[None]  # (1, 2H, L)
        acoustic_text, prosodic_text = rows[:, :hidden], rows[:, hidden:]  # (1, H, L) each
        style = style.to(self.device, torch.float32)[None]  # (1, 2S)
        acoustic_style, prosodic_style = style[:, : self.style_dim], style[:, self.style_dim:]  # (1, S) each
        length = rows.shape[-1]
        lengths = torch.tensor([length], device=self.device)
        no_padding = torch.zeros(1, length, dtype=torch.bool, device=self.device)

        # Durations (frames of FRAME_SAMPLES per token) from the PL-BERT half and the
        # prosodic style.
        prosody = predictor.text_encoder(prosodic_text, prosodic_style, lengths, no_padding)  # (1, L, H + S)
        hidden_states, _ = predictor.lstm(prosody)  # (1, L, H)
        # duration_proj scores max_dur bins; their sigmoids add up to the frame count.
        frames = torch.sigmoid(predictor.duration_proj(hidden_states)).sum(-1)[0]  # (L,)
        frames = frames.round().clamp(min=1).long()

        # Token rows repeated over their frames (the hard alignment, without a matrix).
        prosody_frames = prosody.transpose(1, 2).repeat_interleave(frames, dim=-1)  # (1, H + S, F)
        text_frames = acoustic_text.repeat_interleave(frames, dim=-1)  # (1, H, F)
        frame_tokens = torch.arange(length).repeat_interleave(frames.cpu())  # (F,)
        if self.params["decoder"]["type"] == "hifigan":
            # The hifigan (LibriTTS) model was trained on alignments that run one frame
            # late; its official inference delays the aligned features by a frame too.
            prosody_frames = torch.cat([prosody_frames[..., :1], prosody_frames[..., :-1]], dim=-1)
            text_frames = torch.cat([text_frames[..., :1], text_frames[..., :-1]], dim=-1)
            frame_tokens = torch.cat([frame_tokens[:1], frame_tokens[:-1]])

        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            # The decoder's harmonic source draws phases and noise: seed them per avatar.
            torch.manual_seed(seed)
            f0, energy = predictor.F0Ntrain(prosody_frames, prosodic_style)  # (1, 2F) each
            wave = self.nets["decoder"](text_frames, f0, energy, acoustic_style)  # (1, 1, F * FRAME_SAMPLES)
        wave = wave.reshape(-1)
        alignment = frame_tokens.repeat_interleave(wave.shape[0] // frame_tokens.shape[0])
        if alignment.shape[0] != wave.shape[0]:
            raise RuntimeError(
                f"StyleTTS2: the decoder gave {wave.shape[0]} samples for {frame_tokens.shape[0]} frames, "
                f"not a whole number of samples per frame"
            )
        if wave.shape[0] > 2 * TAIL_TRIM:
            wave, alignment = wave[:-TAIL_TRIM], alignment[:-TAIL_TRIM]
        return wave.float().clamp(-1.0, 1.0).cpu(), alignment

    # ------------------------------------------------------------------ identity
    def fingerprint(self) -> str:
        """Hash of what the gold features depend on: the weights of the text encoder,
        PL-BERT, its projection and both style encoders, the phonemizer and the mel
        recipe. Two builds with the same weights agree; any other weights differ."""
        if self._fingerprint is None:
            digest = hashlib.sha256()
            digest.update(f"{self.phonemizer.version}|{sorted(_MEL.items())}|{_TRIM_TOP_DB}".encode())
            for name in ("text_encoder", "bert", "bert_encoder", "style_encoder", "predictor_encoder"):
                for key, tensor in sorted(self.nets[name].state_dict().items()):
                    digest.update(f"{name}.{key}{tuple(tensor.shape)}".encode())
                    digest.update(tensor.detach().float().cpu().contiguous().numpy().tobytes())
            self._fingerprint = f"StyleTTS2:{digest.hexdigest()[:16]}"
        return self._fingerprint
