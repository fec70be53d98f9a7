"""A new user's own avatar dataset, as docs/training.md's fine-tuning section starts from:
avatar JSONL with real speech and face clips (copied from the project's shared data), three
classes of their own (calm, stressed, upbeat) reached partly through an emotion fold, and a
profile attribute of their own (``accent``) in place of AvaMERG's age and timbre."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional

import av
import soundfile

from tests.conftest import shared_data

# (id, speaker says, listener answers, free-text emotion, speech clip, face clip). The
# emotions are the user's own classes, their fold's words, and ED labels that reach a
# class only through the built-in fold (anxious -> fear -> stressed, joyful -> happy ->
# upbeat). clinic-7/2 is the dialogue docs/training.md answers with `respond --conversation`.
DIALOGUES = [
    ("clinic-7/2", "The doctor still has not called back.", "Waiting is the hardest part; call them tomorrow morning.",
     "worried", "fearful", "W009_front_fear_level3_001"),
    ("exam-3/1", "The exam is tomorrow and I have not slept.", "Try to rest a little; you know more than you think.",
     "anxious", "fearful", "M030_front_fear_level3_001"),
    ("garden-1/1", "I finally finished the garden this weekend.", "That sounds lovely, you must be proud of it.",
     "happy", "happy", "M030_front_happy_level3_001"),
    ("lake-2/1", "I just sat by the lake all afternoon.", "What a peaceful way to spend a day.",
     "relaxed", "sad", "W011_front_neutral_level1_001"),
    ("match-4/1", "We won the match in the last minute!", "What a finish, congratulations to the whole team!",
     "upbeat", "happy", "W009_front_happy_level3_001"),
    ("book-5/1", "Nothing much happened today, just reading.", "A quiet day with a book sounds nice.",
     "calm", "sad", "M030_front_neutral_level1_001"),
    ("report-6/1", "My boss wants the report in an hour.", "That is a tight deadline; start with the main points.",
     "stressed", "angry1", "W011_front_fear_level3_001"),
    ("visit-8/1", "My sister is coming to visit next week!", "How exciting, you must have plans already.",
     "excited", "happy", "W011_front_happy_level3_001"),
    ("noise-9/1", "I heard a strange noise downstairs last night.", "That sounds scary; did you check the locks?",
     "afraid", "fearful", "W009_front_surprised_level3_001"),
    ("yoga-10/1", "I spent the morning doing yoga.", "That sounds like a calm start to the day.",
     "relaxed", "disgust", "W009_front_neutral_level1_001"),
    ("flight-11/1", "My flight got cancelled an hour before boarding.", "That is so frustrating; let us find another way home.",
     "terrified", "angry2", "M030_front_sad_level3_001"),
    ("job-12/1", "I got the job I applied for!", "Congratulations, you worked so hard for this!",
     "joyful", "happy", "M030_front_surprised_level3_001"),
]


def _copy_clip(source: Path, target: Path, seconds: Optional[float]) -> None:
    """``source`` as ``target``, only its first ``seconds`` where given (decoding and
    re-encoding the frames, so it stays a real recording, just shorter)."""
    if source.suffix == ".wav":
        wave, rate = soundfile.read(source, dtype="float32")
        soundfile.write(target, wave[: int(rate * seconds)] if seconds else wave, rate)
        return
    with av.open(str(source)) as clip, av.open(str(target), "w") as out:
        video = clip.streams.video[0]
        rate = int(round(video.average_rate or 25))
        stream = out.add_stream("mpeg4", rate=rate)
        stream.width, stream.height, stream.pix_fmt = video.width, video.height, "yuv420p"
        for index, frame in enumerate(clip.decode(video)):
            if seconds and index >= seconds * rate:
                break
            out.mux(stream.encode(av.VideoFrame.from_ndarray(frame.to_ndarray(format="rgb24"), format="rgb24")))
        out.mux(stream.encode())


def write_real_avatar_dataset(root: Path, train: int = 12, val: int = 4, seconds: Optional[float] = None) -> Dict[str, Path]:
    """Write ``root/train.jsonl`` (the first ``train`` dialogues) and ``root/val.jsonl`` (the
    first ``val`` of them, ``clinic-7/2`` among them); the clips go to ``root/clips``, cut
    to their first ``seconds`` where given. Returns the paths by name."""
    speech, faces = shared_data("media/speech"), shared_data("media/mead_faces/video")
    clips = root / "clips"
    clips.mkdir(parents=True, exist_ok=True)
    lines: List[dict] = []
    for i, (example_id, said, answer, emotion, voice, face) in enumerate(DIALOGUES[: max(train, val)]):
        for source in (speech / f"{voice}.wav", faces / f"{face}.mp4"):
            if not (clips / source.name).exists():
                _copy_clip(source, clips / source.name, seconds)
        media = {"audio": f"clips/{voice}.wav", "video": f"clips/{face}.mp4"}
        lines.append({
            "id": example_id,
            "context": "A friend tells the avatar about their day.",
            "speaker": {"gender": "male" if i % 2 else "female"},
            "listener": {"gender": "female" if i % 2 else "male", "accent": "uk" if i % 3 else "us", "ID": f"avatar-{i % 2}"},
            "history": [{"role": "speaker", "text": said, **media}],
            # The avatar answers in the clips of the turn: what a user records for their own avatar.
            "response": {"text": answer, **media},
            "emotion": emotion,
            "chain": {"event_scenario": said, "emotion_cause": "What happened today.", "goal_to_response": "Respond warmly."},
        })
    paths = {"train": root / "train.jsonl", "val": root / "val.jsonl"}
    paths["train"].write_text("".join(json.dumps(line) + "\n" for line in lines[:train]))
    paths["val"].write_text("".join(json.dumps(line) + "\n" for line in lines[:val]))
    return paths
