"""A multimodal training set made from dialogue text with the offline generators, and the
fixed evaluation split of EmpatheticDialogues.

No multimodal empathetic-dialogue data can be had offline, so the ``small`` preset's
stages 2-4 train on EmpatheticDialogues conversations whose every utterance is spoken by
the packaged Piper voice and animated by the avatar renderer, in a style that follows the
emotion: the speaker shows the conversation's emotion; the listener shares it, softer
(:data:`LISTENER_EXPRESSION`). Avatars are drawn from fixed
pools keyed by the conversation, so each recurs across conversations with one voice and
one face, as AvaMERG's avatars do.
"""

from __future__ import annotations

import hashlib
import math
import shutil
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from tqdm.auto import tqdm

from ..chain_targets import complete_chain
from ..errors import DataError
from ..io import atomic_path, read_jsonl, remove_temporary_files, write_json, write_jsonl
from ..labels import fold_emotion
from ..prompts import CHAIN_STEPS
from .dataset import stable_fraction

PathLike = Union[str, Path]

# ---------------------------------------------------------------------- the split
EVAL_FRACTION = 0.1


def conversation_rank(conv_id: str) -> str:
    """The order the split follows: SHA-256 of the conversation id, independent of the file's
    order and of any random state."""
    return hashlib.sha256(conv_id.encode("utf-8")).hexdigest()


def split_conversations(conv_ids: Sequence[str], eval_fraction: float = EVAL_FRACTION) -> Tuple[List[str], List[str]]:
    """``(train, eval)`` ids: the ``ceil(eval_fraction × n)`` conversations with the smallest
    :func:`conversation_rank` are held out. Split by conversation, so no turn of a held-out
    conversation is trained on."""
    unique = sorted(set(conv_ids), key=conversation_rank)
    held = set(unique[: math.ceil(eval_fraction * len(unique))])
    return [c for c in conv_ids if c not in held], [c for c in conv_ids if c in held]


def split_ed_file(path: PathLike, out_dir: PathLike, eval_fraction: float = EVAL_FRACTION) -> Dict[str, Path]:
    """Write ``train.jsonl`` and ``eval.jsonl`` (whole conversation lines of an
    EmpatheticDialogues conversations file) and ``split.json`` listing the held-out ids."""
    path, out_dir = Path(path), Path(out_dir)
    records = _read_conversations(path)
    train_ids, eval_ids = split_conversations([r["conv_id"] for _, r in records], eval_fraction)
    held = set(eval_ids)
    files = {"train": out_dir / "train.jsonl", "eval": out_dir / "eval.jsonl"}
    for name, keep in (("train", lambda c: c not in held), ("eval", lambda c: c in held)):
        write_jsonl(files[name], [r for _, r in records if keep(r["conv_id"])])
    write_json(out_dir / "split.json", {"source": path.name, "eval_fraction": eval_fraction, "rule": "smallest sha256(conv_id)",
                                        "train": len(train_ids), "eval": len(eval_ids), "eval_ids": sorted(held)}, indent=1)
    return files


def _read_conversations(path: Path) -> List[Tuple[int, dict]]:
    """The ``(line number, conversation)`` pairs of an EmpatheticDialogues conversations
    file, each an object with a string ``conv_id``."""
    records = read_jsonl(path)
    for number, record in records:
        if not isinstance(record, dict) or not isinstance(record.get("conv_id"), str):
            raise DataError("expected an object with a string conv_id", file=path, record=f"line {number}", field="conv_id")
    return records


# ---------------------------------------------------------------------- styles
# Prosody z-scores (rate, pitch, pitch range, energy, pause ratio; the offline voice's
# layout, empatheia.generators.piper_speech) that read as each emotion at full intensity. The
# formant (dim 5) is the speaker's, not the emotion's: it comes from the profile.
EMOTION_PROSODY: Dict[str, Tuple[float, ...]] = {
    "sad": (-0.8, -0.6, -0.7, -0.8, 0.8),
    "happy": (0.5, 0.6, 0.8, 0.5, -0.4),
    "angry": (0.6, 0.2, 0.6, 1.0, -0.5),
    "fear": (0.7, 0.8, -0.2, -0.2, 0.4),
    "surprised": (0.3, 1.0, 1.0, 0.4, 0.0),
    "contempt": (-0.4, -0.4, -0.5, -0.2, 0.2),
    "disgusted": (-0.3, -0.3, 0.2, 0.2, 0.3),
}
# Gaze and head motion (gaze_x, gaze_y, head_motion; S^v dims 8-10 of
# empatheia.generators.avatar_renderer) of each emotion at full intensity: sorrow looks down with a
# small slow head, joy holds eye contact and nods, anger stares and pushes, fear looks
# away and freezes a little, surprise looks up, contempt looks aside, disgust turns away
# and down. Neutral is eye contact with gentle motion (NEUTRAL_HEAD_MOTION).
EMOTION_GAZE: Dict[str, Tuple[float, float, float]] = {
    "sad": (0.0, 0.8, 0.2),
    "happy": (0.0, 0.0, 1.2),
    "angry": (0.0, -0.1, 0.9),
    "fear": (0.7, -0.3, 0.3),
    "surprised": (0.0, -0.5, 0.8),
    "contempt": (-0.6, 0.1, 0.4),
    "disgusted": (-0.5, 0.4, 0.5),
}
NEUTRAL_HEAD_MOTION = 0.5
SPEAKER_INTENSITY = 0.8
INTENSITY_JITTER = 0.15
"""Each utterance's intensity is its role's times ``1 + uniform(-0.15, 0.15)``, seeded by
the conversation and turn (:func:`utterance_intensity`)."""
LISTENER_EXPRESSION: Dict[str, Tuple[str, float]] = {
    # What the listener shows for each speaker emotion: the same emotion, softer. An
    # empathetic listener's face tells the speaker their feeling was understood, so it
    # shares it (a worried face for fear, an indignant one for anger) at less than the
    # speaker's intensity (SPEAKER_INTENSITY) rather than answering with another emotion:
    # a warm smile at a frightened speaker reads as not listening. Intensities are where
    # the drawn face is still read as its emotion with a voice beside it
    # (bench/face_legibility.py --speech); joy is shared nearly in full.
    "sad": ("sad", 0.5),
    "happy": ("happy", 0.8),
    "angry": ("angry", 0.5),
    "fear": ("fear", 0.6),
    "surprised": ("surprised", 0.6),
    "contempt": ("contempt", 0.4),
    "disgusted": ("disgusted", 0.4),
}

AGES, GENDERS, TIMBRES = ("child", "young", "middle-aged", "elderly"), ("male", "female"), ("high", "mid", "low")
AVATARS_PER_ROLE = 12


def pooled_profile(conv_id: str, role: str) -> dict:
    """One of :data:`AVATARS_PER_ROLE` avatars per role, chosen by the conversation; each
    avatar's profile is fixed by its ID."""
    digest = int(hashlib.sha256(f"{role}:{conv_id}".encode()).hexdigest(), 16)
    index = digest % AVATARS_PER_ROLE
    traits = int(hashlib.sha256(f"{role}-avatar-{index}".encode()).hexdigest(), 16)
    return {
        "ID": f"ed-{role}-{index}",
        "age": AGES[1 + traits % 3],  # no children's voices in ED's adult conversations
        "gender": GENDERS[(traits // 3) % 2],
        "timbre": TIMBRES[(traits // 6) % 3],
    }


def utterance_intensity(base: float, conv_id: str, turn: int) -> float:
    """``base`` varied by up to :data:`INTENSITY_JITTER` (relative) per utterance, seeded by
    the conversation and the turn, clipped to [0, 1]: the same utterance always gets the
    same value, and the data is not a fixed function of the folded emotion."""
    unit = stable_fraction(f"intensity:{conv_id}:{turn}")
    return float(min(max(base * (1.0 + INTENSITY_JITTER * (2.0 * unit - 1.0)), 0.0), 1.0))


def speech_style(emotion: str, intensity: float, style_dim: int, profile: Optional[dict] = None) -> torch.Tensor:
    """``(style_dim,)`` S^s request (empatheia.generators.piper_speech layout): the emotion's prosody
    times ``intensity`` on top of the register of ``profile`` (pitch, rate and formant of
    its age, gender and timbre; none: the packaged voice's reference)."""
    from empatheia.generators.piper_speech import profile_style

    style = profile_style(profile or {}, style_dim)
    values = torch.tensor(EMOTION_PROSODY[emotion]) * intensity
    style[: values.numel()] += values
    return style


def video_style(emotion: str, intensity: float, style_dim: int) -> torch.Tensor:
    """``(style_dim,)`` S^v request (empatheia.generators.avatar_renderer layout): the emotion at
    ``intensity``, and its gaze and head motion (:data:`EMOTION_GAZE`) blended from the
    neutral ones by ``intensity``, where ``style_dim`` holds them."""
    return mixed_video_style({emotion: 1.0}, intensity, style_dim)


def mixed_video_style(mix: Dict[str, float], intensity: float, style_dim: int) -> torch.Tensor:
    """:func:`video_style` of a blend of emotions: ``mix`` (class -> weight, summing to 1)
    as the renderer's emotion mix, and gaze and head motion blended by the same weights."""
    from empatheia.generators.avatar_renderer import EMOTIONS, GAZE_X

    style = torch.zeros(style_dim)
    blended = [0.0, 0.0, 0.0]
    for emotion, weight in mix.items():
        style[EMOTIONS.index(emotion)] = weight
        for k, value in enumerate(EMOTION_GAZE[emotion]):
            blended[k] += weight * value
    style[len(EMOTIONS)] = intensity
    gaze_x, gaze_y, motion = blended
    wanted = (intensity * gaze_x, intensity * gaze_y, NEUTRAL_HEAD_MOTION + intensity * (motion - NEUTRAL_HEAD_MOTION))
    for offset, value in enumerate(wanted):
        if GAZE_X + offset < style_dim:
            style[GAZE_X + offset] = value
    return style


# ---------------------------------------------------------------------- real faces
FACE_CLIP_EMOTIONS = {"angry": "angry", "contempt": "contempt", "disgusted": "disgusted", "fear": "fear",
                      "happy": "happy", "sad": "sad", "surprised": "surprised", "neutral": "neutral"}
"""MEAD's emotion names -> the classes they show (the seven of AvaMERG, and neutral)."""


@dataclass(frozen=True)
class FaceClip:
    """A recorded face: ``actor`` showing ``emotion`` in the video file ``path``."""

    actor: str
    emotion: str
    path: Path


def read_face_clips(folder: PathLike) -> List[FaceClip]:
    """The clips of a MEAD-style folder, ``<actor>_<view>_<emotion>_level<N>_<take>.mp4``
    (e.g. ``W011_front_angry_level3_001.mp4``, as DreamTalk ships them), sorted by name.
    A name that does not follow the pattern, or an emotion outside
    :data:`FACE_CLIP_EMOTIONS`, is a :class:`DataError` naming the file."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError("face clip folder not found", file=folder)
    clips = []
    for path in sorted(folder.glob("*.mp4")):
        parts = path.stem.split("_")
        if len(parts) < 4 or not parts[3].startswith("level"):
            raise DataError("expected a name <actor>_<view>_<emotion>_level<N>_<take>.mp4", file=path)
        if parts[2] not in FACE_CLIP_EMOTIONS:
            raise DataError(f"unknown emotion {parts[2]!r}; expected one of {sorted(FACE_CLIP_EMOTIONS)}", file=path)
        clips.append(FaceClip(actor=parts[0], emotion=FACE_CLIP_EMOTIONS[parts[2]], path=path))
    if not clips:
        raise DataError("holds no .mp4 face clips", file=folder)
    return clips


def training_face_clips(folder: PathLike, hold_out: Optional[str] = None) -> Tuple[FaceClip, ...]:
    """The clips of ``folder`` (:func:`read_face_clips`) without those of actor
    ``hold_out``, kept for evaluating how the model reads a face it never saw. A
    ``hold_out`` that names no actor of the folder is a :class:`DataError`."""
    clips = read_face_clips(folder)
    actors = sorted({c.actor for c in clips})
    if hold_out is not None and hold_out not in actors:
        raise DataError(f"no clip of the held-out actor {hold_out!r}; actors here: {actors}", file=folder)
    return tuple(c for c in clips if c.actor != hold_out)


def pick_face_clip(clips: Sequence[FaceClip], emotion: str, key: str) -> Optional[FaceClip]:
    """One of ``clips`` showing ``emotion``, chosen by ``key`` (stable across runs), or
    ``None`` when none shows it."""
    matching = [c for c in clips if c.emotion == emotion]
    if not matching:
        return None
    return matching[int(hashlib.sha256(key.encode()).hexdigest(), 16) % len(matching)]


# ---------------------------------------------------------------------- rendering
@dataclass
class RenderSettings:
    speech_style_dim: int = 16
    video_style_dim: int = 16
    speech_content_dim: int = 64
    video_content_dim: int = 32
    face_clips: Tuple[FaceClip, ...] = ()
    """Recorded faces (:func:`read_face_clips`) that the speaker shows instead of the
    rendered avatar in a share of the conversations, so that the video encoder meets real
    faces in training, not only drawn ones."""
    real_face_share: float = 0.5
    """Share of the conversations (by a hash of their id) whose speaker turns show a
    recorded face of the conversation's emotion, when ``face_clips`` has one."""


_WORKER: dict = {}


def _init_worker(settings: RenderSettings) -> None:
    # One set of generators per worker process, built once.
    from empatheia.generators.avatar_renderer import AvatarRenderer
    from empatheia.generators.avatars import AvatarRegistry
    from empatheia.generators.piper_speech import PiperSpeech

    torch.set_num_threads(1)
    _WORKER["speech"] = PiperSpeech(content_dim=settings.speech_content_dim, style_dim=settings.speech_style_dim)
    _WORKER["head"] = AvatarRenderer(content_dim=settings.video_content_dim, style_dim=settings.video_style_dim)
    _WORKER["avatars"] = AvatarRegistry()
    _WORKER["settings"] = settings


def _render_conversation(task: Tuple[dict, str]) -> List[dict]:
    """Speak and animate every utterance of one ED conversation; return its examples as
    avatar JSONL records (media paths relative to the output folder)."""
    from empatheia.generators.base import alignment_path, alignment_runs

    from ..media import write_mp4, write_wav

    record, out_dir = task
    speech, head, avatars, settings = _WORKER["speech"], _WORKER["head"], _WORKER["avatars"], _WORKER["settings"]
    conv_id = record["conv_id"]
    emotion = fold_emotion(record["emotion"])
    utterances = record["utterances"]
    roles = record.get("roles") or ["speaker" if i % 2 == 0 else "listener" for i in range(len(utterances))]
    profiles = {role: pooled_profile(conv_id, role) for role in ("speaker", "listener")}
    folder = Path(out_dir) / "clips" / _safe(conv_id)
    folder.mkdir(parents=True, exist_ok=True)
    remove_temporary_files(folder)  # a killed run's; one worker renders a conversation at a time
    real_faces = stable_fraction(f"real-face:{conv_id}") < settings.real_face_share
    turns = []
    for index, (text, role) in enumerate(zip(utterances, roles)):
        shown, base = (emotion, SPEAKER_INTENSITY) if role == "speaker" else LISTENER_EXPRESSION[emotion]
        intensity = utterance_intensity(base, conv_id, index)
        avatar = avatars.for_profile(profiles[role])
        stem = folder / f"utt{index}"
        sidecar = alignment_path(stem.with_suffix(".wav"))
        if not all(path.is_file() for path in (stem.with_suffix(".mp4"), stem.with_suffix(".wav"), sidecar)):
            request = speech_style(shown, intensity, settings.speech_style_dim, profiles[role])
            wave = speech.synthesize(text, None, request, avatar)
            video = head.animate(wave, None, video_style(shown, intensity, settings.video_style_dim), avatar.portrait)
            # The alignment (which phoneme sounds at each sample) gives the gold per-unit
            # C^v its timing; kept as run-length rows [unit, start, end).
            if wave.alignment is None:
                raise RuntimeError(f"{type(speech).__name__} gives no alignment: the gold per-unit video content needs it")
            # All three are written under temporary names and renamed once all are whole,
            # so a run killed mid-write leaves no file a resumed run would take as finished.
            with atomic_path(sidecar) as align_tmp, atomic_path(stem.with_suffix(".wav")) as audio_tmp, \
                    atomic_path(stem.with_suffix(".mp4")) as video_tmp:
                np.save(align_tmp, alignment_runs(wave.alignment))
                write_wav(audio_tmp, wave.samples, wave.sample_rate)
                write_mp4(video_tmp, video.frames, video.fps, wave.samples, wave.sample_rate)
        relative = stem.relative_to(out_dir)
        turn = {"role": role, "text": text, "audio": f"{relative}.wav", "video": f"{relative}.mp4"}
        clip = pick_face_clip(settings.face_clips, emotion, f"{conv_id}/{index}") if role == "speaker" and real_faces else None
        if clip is not None:
            # The recorded face replaces the drawn one; the voice stays the rendered one.
            face = folder / f"utt{index}_face{clip.path.suffix}"
            if not face.is_file():
                with atomic_path(face) as temporary:
                    shutil.copyfile(clip.path, temporary)
            turn["video"] = str(face.relative_to(out_dir))
            turn["face_clip"] = clip.path.name
        turns.append(turn)
    examples = []
    for i in range(1, len(turns)):
        if turns[i]["role"] != "listener":
            continue
        examples.append(
            {
                "id": f"{conv_id}/{i}",
                "context": record.get("situation"),
                "speaker": profiles["speaker"],
                "listener": profiles["listener"],
                "emotion": record["emotion"],
                "history": [{k: v for k, v in t.items() if k != "face_clip"} for t in turns[:i]],
                "face_clips": sorted({t["face_clip"] for t in turns[:i] if "face_clip" in t}),
                "response": {k: turns[i][k] for k in ("text", "audio", "video")},
                # The chain is stage 1's ED chain, all four steps: a step missing here
                # teaches stage 4 to skip it (measured on `small` for the emotion step).
                "chain": _ed_chain_record(record, turns[:i], turns[i]["text"]),
            }
        )
    return examples


def _ed_chain_record(record: dict, turns: Sequence[dict], reply: str) -> Dict[str, Optional[str]]:
    """The four steps as the ED readers build them (:mod:`empatheia.chain_targets`)."""
    speaker = [t["text"] for t in turns if t["role"] == "speaker"]
    chain = complete_chain(None, record.get("situation"), speaker, record["emotion"], reply)
    return {name: getattr(chain, name) for name, _ in CHAIN_STEPS}


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


def render_ed_conversations(
    path: PathLike,
    out_dir: PathLike,
    settings: Optional[RenderSettings] = None,
    limit: Optional[int] = None,
    workers: int = 1,
    progress: bool = True,
) -> Path:
    """Render an EmpatheticDialogues conversations file into ``out_dir/train.jsonl``
    (avatar JSONL, one example per listener turn) with ``out_dir/clips/<conv>/uttN.wav``
    and ``.mp4``. Clips already on disk are kept, so an interrupted run resumes."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = settings or RenderSettings()
    records = [r for _, r in _read_conversations(Path(path))][:limit]
    tasks = [(r, str(out_dir)) for r in records]
    lines: List[dict] = []
    bar = tqdm(total=len(tasks), desc="rendering conversations", unit="conv", disable=not progress)
    if workers <= 1:
        _init_worker(settings)
        for task in tasks:
            lines += _render_conversation(task)
            bar.update(1)
    else:
        with ProcessPoolExecutor(workers, initializer=_init_worker, initargs=(settings,)) as pool:
            for examples in pool.map(_render_conversation, tasks, chunksize=4):
                lines += examples
                bar.update(1)
    bar.close()
    return write_jsonl(out_dir / "train.jsonl", lines)
