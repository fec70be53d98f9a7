"""The media length policy (:class:`empatheia.config.MediaLimits`): an hour of audio or
video is refused or trimmed before it is decoded whole, by the readers, `data check`,
`respond` and the server's uploads alike."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile

from empatheia import Dialogue, Turn
from empatheia.config import EmpatheiaConfig, MediaLimits
from empatheia.errors import DataError
from empatheia.media import load_audio, load_video_frames
from empatheia.processing import Target
from empatheia.prompts import PromptMode
from empatheia.serve.uploads import UploadError, UploadLimits, decode_audio

from .conftest import shared_data

ROOT = Path(__file__).resolve().parents[1]
HOUR = 3600
SPEECH = "media/speech/angry1.wav"


def write_long_wav(path: Path, seconds: int, rate: int = 16000) -> Path:
    """``seconds`` of 16-bit noise, written one second at a time so that making an hour
    takes a second's worth of memory."""
    block = (np.random.default_rng(0).standard_normal(rate) * 0.1).astype(np.float32)
    with soundfile.SoundFile(str(path), "w", rate, 1, "PCM_16") as file:
        for _ in range(seconds):
            file.write(block)
    return path


def write_long_video(path: Path, seconds: int, container: str = None) -> Path:
    """One 32x32 frame a second: dark (grey level 4k at second k) for the first 30 s,
    bright (250) after, so a frame's brightness says whether it came from past 30 s."""
    with av.open(str(path), "w", format=container) as out:
        stream = out.add_stream("libx264", rate=1)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        for k in range(seconds):
            image = np.full((32, 32, 3), 4 * k if k < 30 else 250, np.uint8)
            out.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        out.mux(stream.encode())
    return path


def long_conversation(tmp_path: Path) -> tuple:
    """An AvaMERG conversation of one turn whose audio is an hour of noise and whose video
    an hour of frames: ``(conversation file, media folder, wav, mp4)``."""
    root = tmp_path / "media"
    root.mkdir()
    wav = write_long_wav(root / "dialongutt0_1.wav", HOUR)
    mp4 = write_long_video(root / "dialongutt0_1.mp4", HOUR)
    conversation = {
        "conversation_id": "long",
        "speaker_profile": {"ID": "1"},
        "listener_profile": {"ID": "2"},
        "turns": [{"turn_id": "0", "context": "a voice message",
                   "dialogue_history": [{"index": 0, "role": "speaker", "utterance": "Listen to this."}]}],
    }
    path = tmp_path / "conversation.json"
    path.write_text(json.dumps(conversation))
    return path, root, wav, mp4


# Runs the command in a child of a fresh interpreter, so that the peak resident memory read
# after it exits is that command's alone, not the test process's or an earlier child's.
_MEASURE = """
import resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
sys.stdout.write(done.stdout)
sys.stderr.write(done.stderr)
sys.stderr.write(f"\\nMAXRSS_KB {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}\\n")
sys.exit(done.returncode)
"""


def run_measured(*args: str) -> tuple:
    """``empatheia ARGS`` in a subprocess: ``(exit code, stdout, stderr, peak RSS in MiB)``."""
    done = subprocess.run([sys.executable, "-c", _MEASURE, sys.executable, "-m", "empatheia", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    rss_kb = int(done.stderr.rsplit("MAXRSS_KB", 1)[1])
    return done.returncode, done.stdout, done.stderr, rss_kb / 1024


# ====================================================================== end to end
@pytest.mark.skipif("libx264" not in av.codecs_available, reason="PyAV has no libx264 encoder")
def test_an_hour_of_media_is_trimmed_by_respond_and_reported_by_data_check(tmp_path):
    path, root, wav, mp4 = long_conversation(tmp_path)
    code, out, err, rss = run_measured("respond", str(path), "--media-root", str(root), "--preset", "tiny",
                                       "--max-new-tokens", "2", "--out", str(tmp_path / "out"))
    assert code == 0, err
    assert f"{wav}: audio is 3600.0 s long, over the 30 s limit: only its first 30 s are used" in err
    assert f"{mp4}: video is 3600.0 s long, over the 30 s limit: only its first 30 s are used" in err
    assert (tmp_path / "out" / "response.json").is_file()
    assert rss < 1536, f"respond peaked at {rss:.0f} MiB"

    code, out, err, rss = run_measured("data", "check", str(path), "--media-root", str(root), "--decode",
                                       "--no-face-check")
    assert code == 1
    assert f"problem: {wav}, record long/0, field 'turns[0].audio': audio is 3600.0 s long, over the 30 s limit" in out
    assert f"problem: {mp4}, record long/0, field 'turns[0].video': video is 3600.0 s long, over the 30 s limit" in out
    assert "problems: 2, missing media files: 0" in out
    assert rss < 1536, f"data check peaked at {rss:.0f} MiB"


# ====================================================================== the readers
def test_audio_over_the_limit_is_refused_or_trimmed(caplog):
    path = shared_data(SPEECH)
    whole = load_audio(path, 16000)
    assert 3.5 <= whole.shape[0] / 16000 <= 4.2  # within the 30 s default
    with pytest.raises(DataError, match=r"^" + str(path) + r", field 'audio': audio is \d\.\d s long, over the 2 s limit$"):
        load_audio(path, 16000, MediaLimits(max_seconds=2))
    with caplog.at_level(logging.WARNING, logger="empatheia.media"):
        cut = load_audio(path, 16000, MediaLimits(max_seconds=2, trim=True))
    assert cut.shape == (2 * 16000,)
    assert np.array_equal(cut.numpy(), whole[: 2 * 16000].numpy())  # the beginning, unchanged
    assert "only its first 2 s are used" in caplog.text and str(path) in caplog.text


@pytest.mark.skipif("libx264" not in av.codecs_available, reason="PyAV has no libx264 encoder")
@pytest.mark.parametrize("container, suffix", [(None, ".mp4"), ("h264", ".h264")], ids=["mp4", "raw-h264-no-duration"])
def test_a_long_video_is_refused_or_sampled_from_its_first_seconds(tmp_path, container, suffix):
    path = write_long_video(tmp_path / f"long{suffix}", 600, container)
    # Raw H.264 states no length: it is counted from the packets, and counting stops at the limit.
    length = "is 600.0 s long" if container is None else "is longer than"
    with pytest.raises(DataError, match=f"video {length}.* the 30 s limit$"):
        load_video_frames(path, max_frames=8, frame_rate=2)
    frames = load_video_frames(path, max_frames=8, frame_rate=2, limits=MediaLimits(trim=True))
    brightness = frames.float().mean(dim=(1, 2, 3))
    assert frames.shape == (8, 32, 32, 3)
    assert (brightness < 130).all(), brightness  # all from the dark first 30 s, spread over them
    assert brightness[-1] > 80


# ====================================================================== the model's processor
def test_the_processor_trims_when_answering_and_refuses_a_training_example(model, caplog):
    noise = (np.random.default_rng(1).standard_normal(16000 * 5) * 0.1).astype(np.float32)
    model.config.update({"media.max_seconds": 2})
    dialogue = Dialogue([Turn("speaker", "Listen.", audio=noise, sample_rate=16000)], id="voice-1", response="I hear you.")
    with caplog.at_level(logging.WARNING, logger="empatheia.media"):
        answered = model.processor.encode(dialogue, PromptMode.FULL)
    assert answered.audio[0].data.shape == (2 * 16000,)
    assert "audio is 5.0 s long, over the 2 s limit: only its first 2 s are used" in caplog.text
    with pytest.raises(DataError, match=r"^record voice-1, field 'turns\[0\]\.audio': audio is 5\.0 s long, over the 2 s limit"):
        model.processor.encode(dialogue, PromptMode.FULL, Target(response=dialogue.response))


def test_the_limit_is_a_model_config_key():
    assert EmpatheiaConfig.from_preset("tiny").media == MediaLimits(max_seconds=30.0, trim=False)
    config = EmpatheiaConfig.from_preset("tiny", {"media.max_seconds": 90, "media.trim": True})
    assert config.media == MediaLimits(max_seconds=90.0, trim=True)
    assert EmpatheiaConfig.from_dict(config.to_dict()).media == config.media


# ====================================================================== the server's uploads
def test_uploads_share_the_policy(tmp_path):
    assert isinstance(UploadLimits(), MediaLimits) and UploadLimits().max_seconds == MediaLimits().max_seconds
    wav = io.BytesIO(write_long_wav(tmp_path / "voice.wav", 8).read_bytes())
    with pytest.raises(UploadError, match="^audio: audio is 8.0 s long, over the 5 s limit$") as caught:
        decode_audio("audio", wav, 16000, UploadLimits(max_seconds=5))
    assert caught.value.status == 413
    kept = decode_audio("audio", wav, 16000, UploadLimits(max_seconds=5, trim=True))
    assert kept.samples.shape == (5 * 16000,)

