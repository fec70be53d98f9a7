"""Output folders: `respond` writes replace symbolic links planted in `--out` instead of
writing through them, and one process at a time writes a folder (`respond`'s `--out`,
an `eval` run folder), so concurrent runs neither interleave nor append twice."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from empatheia.cli import main
from empatheia.config import LanguageModelConfig
from empatheia.dialogue import Dialogue, Turn
from empatheia.evaluation.model_runs import run_model
from empatheia.generators.base import VideoFrames, Waveform
from empatheia.io import LOCK_NAME, FolderLockedError, folder_lock
from empatheia.labels import LabelSets
from empatheia.prompts import ChainOfEmpathy
from empatheia.response import EmpatheticResponse, LabelPrediction

from .test_eval_cli import REFERENCES, run_cli, write_jsonl

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "conversation.json"
MEDIA_NAMES = ("response.json", "index.html", "features.safetensors", "response.wav", "response.mp4")


def make_response(media: bool = True) -> EmpatheticResponse:
    audio = Waveform(torch.zeros(1600), 16000) if media else None
    video = VideoFrames(torch.zeros(2, 16, 16, 3, dtype=torch.uint8), 25.0) if media else None
    return EmpatheticResponse(
        text="I am sorry to hear that.", chain=ChainOfEmpathy(speaker_emotion="sad"),
        emotion=LabelPrediction("sad", {"sad": 0.9, "happy": 0.1}), profile={},
        speech_content=torch.zeros(3, 4), speech_style=torch.zeros(2), video_content=torch.zeros(3, 4),
        video_style=torch.zeros(2), dialogue_id="d/0", audio=audio, video=video,
    )


def plant_links(out: Path, outside: Path, names) -> dict:
    """A symbolic link at each output name in ``out``, to a file of ``outside``; returns
    the outside files' contents."""
    out.mkdir(parents=True)
    outside.mkdir()
    contents = {}
    for name in names:
        target = outside / name
        target.write_bytes(f"precious {name}".encode())
        (out / name).symlink_to(target)
        contents[name] = target.read_bytes()
    return contents


class LockHolder:
    """Another process holding ``folder``'s lock until it is told to go or is killed."""

    def __init__(self, folder: Path):
        code = ("import sys; from empatheia.io import folder_lock\n"
                "with folder_lock(sys.argv[1]):\n    print('locked', flush=True); sys.stdin.read()\n")
        self.process = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        assert self.process.stdout.readline().strip() == "locked"

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()

    def release(self) -> None:
        self.process.stdin.close()
        assert self.process.wait() == 0


# ---------------------------------------------------------------------- symlinks in --out
def test_save_replaces_links_at_every_output_name(tmp_path):
    out, outside = tmp_path / "out", tmp_path / "outside"
    before = plant_links(out, outside, MEDIA_NAMES + (LOCK_NAME,))
    make_response().save(out)
    assert {name: (outside / name).read_bytes() for name in before} == before
    for name in MEDIA_NAMES:
        assert not (out / name).is_symlink() and (out / name).stat().st_size > 0
    assert json.loads((out / "response.json").read_text())["text"] == "I am sorry to hear that."
    assert not list(out.glob(".tmp-*"))


def test_respond_command_does_not_follow_links_in_out(tmp_path, capsys):
    out, outside = tmp_path / "out", tmp_path / "outside"
    names = ("response.json", "index.html", "features.safetensors")
    before = plant_links(out, outside, names)
    assert main(["respond", str(EXAMPLE), "--preset", "tiny", "--out", str(out), "--max-new-tokens", "4"]) == 0
    assert {name: (outside / name).read_bytes() for name in names} == before
    assert json.loads((out / "response.json").read_text())["dialogue_id"] == "demo-001/0"
    assert not any((out / name).is_symlink() for name in names)


# ---------------------------------------------------------------------- one writer per folder
def test_save_into_a_folder_another_process_writes_is_refused(tmp_path):
    out = tmp_path / "out"
    holder = LockHolder(out)
    try:
        with pytest.raises(FolderLockedError, match=f"{out}.*being written by another run"):
            make_response(media=False).save(out)
        assert not (out / "response.json").exists()
    finally:
        holder.release()
    make_response(media=False).save(out)
    assert (out / "response.json").is_file()


def test_a_killed_writer_leaves_no_stale_lock(tmp_path):
    out = tmp_path / "out"
    LockHolder(out).kill()
    assert (out / LOCK_NAME).exists()  # the file stays; its lock went with the process
    make_response(media=False).save(out)
    assert (out / "response.json").is_file()


def test_folder_lock_is_shared_within_a_thread_but_not_between_threads(tmp_path):
    refused = []
    with folder_lock(tmp_path / "f"):
        with folder_lock(tmp_path / "f"):  # the scoring inside an eval run locks again
            pass

        def other_thread():
            try:
                with folder_lock(tmp_path / "f"):
                    refused.append(False)
            except FolderLockedError:
                refused.append(True)

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    assert refused == [True]
    with folder_lock(tmp_path / "f"):  # released by the outer block
        pass


class StoppableModel:
    """Answers instantly, except that its first ``respond`` call signals ``inside`` and
    waits for ``release``: a run caught between reading the predictions and appending."""

    def __init__(self):
        self.inside, self.release = threading.Event(), threading.Event()
        self.calls = 0
        # What a run records of the model's decoding defaults (run.json).
        self.config = SimpleNamespace(language_model=LanguageModelConfig())

    def respond(self, batch, **_):
        self.calls += 1
        if self.calls == 1:
            self.inside.set()
            assert self.release.wait(60)
        return [SimpleNamespace(text=f"answer to {d.id}", emotion=LabelPrediction("sad", {"sad": 1.0}),
                                chain=ChainOfEmpathy(speaker_emotion="sad"), chain_emotion=None) for d in batch]


def dialogues(n: int):
    return [Dialogue([Turn("speaker", f"turn {i}")], id=f"d{i}", response="I see.", emotion="sad") for i in range(n)]


def test_concurrent_runs_on_one_folder_leave_it_resumable(tmp_path):
    out, model = tmp_path / "run", StoppableModel()
    first_error = []

    def first_run():
        try:
            run_model(model, dialogues(3), out, labels=LabelSets())
        except Exception as error:  # reported by the assertion below
            first_error.append(error)

    thread = threading.Thread(target=first_run)
    thread.start()
    assert model.inside.wait(60)
    try:
        with pytest.raises(FolderLockedError, match="being written by another run"):
            run_model(model, dialogues(3), out, labels=LabelSets())
    finally:
        model.release.set()
        thread.join()
    assert first_error == []
    summary = run_model(model, dialogues(3), out, labels=LabelSets())  # resumes: nothing left to answer
    ids = [json.loads(line)["id"] for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert ids == ["d0", "d1", "d2"] and (summary.resumed, summary.generated) == (3, 0)


def test_eval_on_a_folder_another_run_writes_is_an_error(tmp_path):
    predictions = write_jsonl(tmp_path / "p.jsonl", [{"id": r["id"], "text": "ok", "emotion": "sad"} for r in REFERENCES])
    references = write_jsonl(tmp_path / "r.jsonl", REFERENCES)
    out = tmp_path / "out"
    argv = ["eval", "--predictions", str(predictions), "--references", str(references), "--out", str(out)]
    holder = LockHolder(out)
    try:
        with pytest.raises(SystemExit, match=f"error: {out} is being written by another run"):
            run_cli(argv)
        assert not (out / "metrics.json").exists()
    finally:
        holder.kill()
    assert run_cli(argv) == 0
    assert json.loads((out / "metrics.json").read_text())["count"] == len(REFERENCES)
