"""Data pipeline timings: reading a dataset, decoding media, face cropping, and a stage-4
example with and without the encoder cache.

    python bench/bench_data.py [--ed FILE] [--speech WAV] [--video MP4] [--repeat N]

Defaults read the project's shared real data (../shared/data).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def timed(fn, repeat):
    fn()  # warm-up (imports, OpenCV cascade)
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ed", type=Path, default=SHARED / "ed" / "ed_valid_conversations.jsonl")
    parser.add_argument("--speech", type=Path, default=SHARED / "media" / "speech" / "sad.wav")
    parser.add_argument("--video", type=Path, default=SHARED / "media" / "mead_faces" / "video" / "W009_front_sad_level3_001.mp4")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    from empatheia import Dialogue, Empatheia, Turn
    from empatheia.config import VideoEncoderConfig
    from empatheia.data import MediaFeatureCache, read_dataset
    from empatheia.faces import FaceCropper
    from empatheia.media import load_audio, load_video_frames
    from empatheia.processing import Target
    from empatheia.prompts import PromptMode

    start = time.perf_counter()
    corpus = read_dataset(args.ed)
    seconds = time.perf_counter() - start
    print(f"read {args.ed.name}: {len(corpus)} examples from {corpus.conversations} conversations in {seconds:.2f} s "
          f"({len(corpus) / seconds:,.0f} examples/s)")

    audio_s = timed(lambda: load_audio(args.speech, 16000), args.repeat)
    print(f"audio {args.speech.name}: {audio_s * 1000:.1f} ms per file (read + resample to 16 kHz)")
    cfg = VideoEncoderConfig()
    video_s = timed(lambda: load_video_frames(args.video, cfg.num_frames, cfg.frame_rate), args.repeat)
    frames = load_video_frames(args.video, cfg.num_frames, cfg.frame_rate)
    cropper = FaceCropper()
    crop_s = timed(lambda: cropper.crop(frames), args.repeat)
    print(f"video {args.video.name}: {video_s * 1000:.1f} ms to decode and take {len(frames)} frames at "
          f"{cfg.frame_rate} fps; face box + crop {crop_s * 1000:.1f} ms")

    model = Empatheia.from_preset("tiny", overrides={"video_encoder.face_crop": True})
    with tempfile.TemporaryDirectory() as tmp:
        media = []
        for i in range(4):
            shutil.copy(args.speech, Path(tmp) / f"{i}.wav")
            shutil.copy(args.video, Path(tmp) / f"{i}.mp4")
            media.append((Path(tmp) / f"{i}.wav", Path(tmp) / f"{i}.mp4"))
        turns = [Turn("speaker" if i % 2 == 0 else "listener", "Some words.", audio=a, video=v) for i, (a, v) in enumerate(media)]
        dialogue = Dialogue(turns, id="bench", response="A reply.")
        target = Target(response="A reply.", signals=True)
        cache = MediaFeatureCache(Path(tmp) / "cache", model.config)
        encode = lambda c: model.processor.encode(dialogue, PromptMode.FULL, target, media_cache=c)
        cold = timed(lambda: encode(None), args.repeat)
        cache.complete(model.processor.collate([encode(cache)]), model)
        warm = timed(lambda: encode(cache), args.repeat)
        print(f"stage-4 example with 4 turns (4 wav + 4 mp4): {cold * 1000:.0f} ms from media, "
              f"{warm * 1000:.1f} ms from the encoder cache ({cold / warm:.0f}x)")


if __name__ == "__main__":
    main()
