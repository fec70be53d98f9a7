"""The fixed EmpatheticDialogues evaluation split and the rendered multimodal set."""

from __future__ import annotations

import functools
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from empatheia.cli import main
from empatheia.data import read_dataset
from empatheia.data.render import (
    LISTENER_EXPRESSION,
    conversation_rank,
    pooled_profile,
    render_ed_conversations,
    split_conversations,
    split_ed_file,
)

CONVERSATIONS = [
    {"conv_id": "hit:1_conv:1", "situation": "I won a prize in the school raffle.", "emotion": "joyful",
     "utterances": ["I won the raffle today!", "No way, congratulations!", "I never win anything."]},
    {"conv_id": "hit:2_conv:4", "situation": "My grandmother passed away.", "emotion": "devastated",
     "utterances": ["My grandmother died last night.", "I am so sorry. Were you close?"]},
]


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_split_holds_out_an_exact_share_by_conversation(tmp_path):
    ids = [f"hit:{i}_conv:{i * 2}" for i in range(95)]
    train, held = split_conversations(ids + ids[:5])  # repeated ids stay on one side
    assert len(set(held)) == 10 and not set(train) & set(held)
    assert set(held) == set(sorted(set(ids), key=conversation_rank)[:10])
    assert split_conversations(list(reversed(ids)))[1] == sorted(set(held), key=ids[::-1].index)  # order-free

    source = _write(tmp_path / "ed.jsonl", [{**CONVERSATIONS[0], "conv_id": c} for c in ids])
    assert main(["data", "split", str(source), "--out", str(tmp_path / "split")]) == 0
    summary = json.loads((tmp_path / "split" / "split.json").read_text())
    assert (summary["train"], summary["eval"]) == (85, 10) and summary["eval_ids"] == sorted(set(held))
    evaluated = [json.loads(line)["conv_id"] for line in (tmp_path / "split" / "eval.jsonl").read_text().splitlines()]
    assert sorted(evaluated) == sorted(set(held))
    assert split_ed_file(source, tmp_path / "again")["eval"].read_text() == (tmp_path / "split" / "eval.jsonl").read_text()


def test_rendered_conversations_read_as_a_multimodal_avatar_dataset(tmp_path):
    from empatheia.generators.avatar_renderer import EMOTIONS, AvatarRenderer

    source = _write(tmp_path / "ed.jsonl", CONVERSATIONS)
    path = render_ed_conversations(source, tmp_path / "rendered", progress=False)
    corpus = read_dataset(path)
    assert [d.id for d in corpus] == ["hit:1_conv:1/1", "hit:2_conv:4/1"]
    first = corpus[0]
    assert first.turns[0].audio.is_file() and first.turns[0].video.is_file()
    assert first.response_audio.is_file() and first.response_video.is_file()
    assert first.listener_profile == pooled_profile("hit:1_conv:1", "listener")
    assert first.listener_profile["ID"].startswith("ed-listener-")
    # The chain is stage 1's ED chain, all four steps built from the situation, the emotion
    # and the reply, so the joint stage's targets keep every step of the Chain of Empathy.
    assert (first.chain.event_scenario, first.chain.speaker_emotion) == ("The speaker won a prize in the school raffle.",
                                                                         "joyful")
    # The goal says what the reply does ("Congratulations! ...").
    assert first.chain.goal_to_response == "Congratulating the speaker." and first.chain.emotion_cause
    assert corpus[1].chain.speaker_emotion == corpus[1].emotion == "devastated"

    # The listener answers joy with joy and grief softly: the rendered faces say so.
    renderer = AvatarRenderer()
    joyful, grieving = renderer.style_features([corpus[0].response_video, corpus[1].response_video])
    assert EMOTIONS[int(torch.argmax(joyful[:7]))] == LISTENER_EXPRESSION["happy"][0] == "happy"
    assert EMOTIONS[int(torch.argmax(grieving[:7]))] == LISTENER_EXPRESSION["sad"][0] == "sad"
    assert joyful[7] > grieving[7]  # the listener's joy is stronger than its sorrow

    # Every clip has its alignment beside it: the timing of the gold per-unit C^v.
    import numpy as np
    import soundfile

    from empatheia.generators.base import alignment_path
    from empatheia.generators.piper_speech import PiperSpeech

    runs = np.load(alignment_path(first.response_audio))
    units = PiperSpeech().content_length(first.response)
    spoken = runs[runs[:, 0] >= 0]
    assert np.array_equal(np.unique(spoken[:, 0]), np.arange(units))
    assert (np.diff(spoken[:, 0]) >= 0).all() and runs[-1, 2] == soundfile.info(str(first.response_audio)).frames

    # A second run keeps the clips it finds (an interrupted run resumes).
    stamp = first.turns[0].audio.stat().st_mtime_ns
    render_ed_conversations(source, tmp_path / "rendered", progress=False)
    assert first.turns[0].audio.stat().st_mtime_ns == stamp


def test_a_render_stopped_mid_write_leaves_no_clip_a_resumed_run_would_keep(tmp_path, monkeypatch):
    """A kill while a clip is written must not leave a partial file under the clip's name:
    the resumed run would keep it and training would fail on it later."""
    from empatheia import media
    from empatheia.media import load_video_frames

    source = _write(tmp_path / "ed.jsonl", CONVERSATIONS[:1])
    real_write_mp4 = media.write_mp4

    def dies_mid_write(path, *args, **kwargs):
        Path(path).write_bytes(b"\x00\x00\x00\x18ftypisom")  # what a killed writer leaves
        raise KeyboardInterrupt

    monkeypatch.setattr(media, "write_mp4", dies_mid_write)
    with pytest.raises(KeyboardInterrupt):
        render_ed_conversations(source, tmp_path / "rendered", progress=False)
    clips = tmp_path / "rendered" / "clips"
    assert not list(clips.rglob("utt*.mp4")) and not list(clips.rglob("utt*.wav"))

    monkeypatch.setattr(media, "write_mp4", real_write_mp4)
    corpus = read_dataset(render_ed_conversations(source, tmp_path / "rendered", progress=False))
    assert load_video_frames(corpus[0].turns[0].video).shape[0] > 0


def test_the_example_dialogues_come_with_their_media():
    from empatheia.data.check import check_dataset

    examples = Path(__file__).resolve().parents[1] / "examples"
    corpus = read_dataset(examples / "dialogues.json", media_root=examples / "media")
    assert [d.id for d in corpus] == ["00001/0", "00002/0", "00003/0"]
    for dialogue in corpus:
        assert all(turn.audio is not None and turn.video is not None for turn in dialogue.turns)
        assert not dialogue.missing_media
    # OpenCV's Haar detector does not find the renderer's drawn faces: decode without it.
    from empatheia.config import VideoEncoderConfig

    report = check_dataset(examples / "dialogues.json", media_root=examples / "media", decode_media=True,
                           video=VideoEncoderConfig(face_crop=False), progress=False)
    assert report.ok and report.decoded == 18 and report.media_found


def test_the_small_preset_pipeline_runs_end_to_end_on_tiny(tmp_path):
    """training/small_preset.py: split, stage 1, render, gold features, stages 2-4, the
    style refit."""
    from empatheia.recipes import small_preset

    records = [{**CONVERSATIONS[i % 2], "conv_id": f"hit:{i}_conv:{i}"} for i in range(12)]
    source = _write(tmp_path / "ed.jsonl", records)
    # In this process: a stage's own process is exercised by the --stage1-init test below.
    small_preset.main(["--ed", str(source), "--out", str(tmp_path / "run"), "--preset", "tiny", "--stage1-steps", "2",
                       "--render", "3", "--media-steps", "2", "--workers", "1", "--in-process",
                       "--style-refit-steps", "3", "--text-dialogues", "4", "--content-refit-steps", "2",
                       "--export-weights", str(tmp_path / "weights"), "--export-stage", "3",
                       "--export-metrics", str(tmp_path / "metrics"),
                       "--set", "mixed_precision=no", "--set", "model.overrides={loss.chain_emotion_weight: 0.5}"])
    final = tmp_path / "run" / "stage4_joint" / "final"
    assert (final / "empatheia.safetensors").is_file()
    # The exported weights are stage 3's final ones in half precision, in one file, and load
    # into the preset.
    from safetensors.torch import load_file

    from empatheia import Empatheia
    from empatheia.modeling import load_trained_state

    stage3 = tmp_path / "run" / "stage3_sac" / "final"
    full, half = load_trained_state(stage3), load_file(str(tmp_path / "weights" / "empatheia.safetensors"))
    assert full.keys() == half.keys()
    # Weights in half precision; the signal standardisers' running statistics stay float32.
    kept = {k for k in full if k.endswith((".running_mean", ".running_var"))}
    assert kept and all(half[k].dtype == torch.float32 and torch.equal(half[k], full[k]) for k in kept)
    assert all(torch.equal(half[k], full[k].half() if full[k].is_floating_point() else full[k]) for k in full if k not in kept)
    # ... and not stage 4's, which trained further (so --export-stage chose).
    stage4 = load_trained_state(final)
    assert any(not torch.equal(half[k], stage4[k].half()) for k in stage4 if stage4[k].is_floating_point())
    model = Empatheia.from_preset("tiny", trained=False)
    model.load_trained_state_dict(half, source="exported")
    for key, value in model.trained_state_dict().items():
        torch.testing.assert_close(value, full[key], rtol=1e-3, atol=1e-3)
    assert sorted(p.name for p in (tmp_path / "metrics").iterdir()) == [
        "content_refit", "stage1_coe", "stage2_ccl", "stage3_sac", "stage4_joint", "style_refit", "summary.md"]
    summary = (tmp_path / "metrics" / "summary.md").read_text().splitlines()
    stage4 = [json.loads(r) for r in (final.parent / "metrics.jsonl").read_text().splitlines()]
    assert len(summary) == 8 and summary[-3].startswith(f"| stage4_joint | 2 | {stage4[-1]['examples']} | {stage4[0]['loss']:.4f} |")
    # The style refit changed the Style Disentangler of stage 4's model and nothing else,
    # on the 3 rendered dialogues with and without media and 4 more as text.
    refit = load_trained_state(tmp_path / "run" / "style_refit" / "final")
    changed = {k.split(".")[0] for k in refit if not torch.equal(refit[k], load_trained_state(final)[k])}
    assert changed == {"style_disentangler"}
    ran = yaml.safe_load((tmp_path / "run" / "style_refit" / "train_config.yaml").read_text())
    assert (ran["examples"], ran["text_dialogues"], ran["steps"]) == (10, 4, 3)
    # The content refit, after it, changed the Content Synchronizer alone, on the 3
    # rendered dialogues with and without their media.
    content = load_trained_state(tmp_path / "run" / "content_refit" / "final")
    changed = {k.split(".")[0] for k in content if not torch.equal(content[k], refit[k])}
    assert changed == {"content_synchronizer"}
    ran = yaml.safe_load((tmp_path / "run" / "content_refit" / "train_config.yaml").read_text())
    assert (ran["examples"], ran["steps"]) == (6, 2)
    # The collected states are kept for a refit with other settings, and only for the
    # same examples of the same weights: fewer text dialogues collect them again.
    from empatheia.training.style_refit import SignalStates

    run = tmp_path / "run"
    kept = run / "style_refit" / small_preset.STATES_NAME
    assert len(SignalStates.load(kept)) == 10
    shutil.rmtree(run / "style_refit" / "final")
    before = kept.stat().st_mtime_ns
    refit_again = functools.partial(small_preset.style_refit, run, final.parent, run / "rendered" / "train.jsonl",
                                    run / "gold", run / "ed" / "train.jsonl", steps=1)
    refit_again(text_dialogues=4)
    assert kept.stat().st_mtime_ns == before
    shutil.rmtree(run / "style_refit" / "final")
    refit_again(text_dialogues=2)
    assert len(SignalStates.load(kept)) == 8
    assert (tmp_path / "metrics" / "stage4_joint" / "metrics.jsonl").read_text() == (final.parent / "metrics.jsonl").read_text()
    split = json.loads((tmp_path / "run" / "ed" / "split.json").read_text())
    assert (split["train"], split["eval"]) == (10, 2)
    assert len((tmp_path / "run" / "rendered" / "train.jsonl").read_text().splitlines()) == 3
    # Each stage started from the previous one, logged its own steps and ran with --set.
    for stage in ("stage1_coe", "stage2_ccl", "stage3_sac", "stage4_joint"):
        rows = (tmp_path / "run" / stage / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(r)["step"] for r in rows][-1] == 2
        ran = yaml.safe_load((tmp_path / "run" / stage / "train_config.yaml").read_text())
        assert ran["mixed_precision"] == "no" and ran["model"]["overrides"] == {"loss.chain_emotion_weight": 0.5}
    assert yaml.safe_load((final / "config.yaml").read_text())["loss"]["chain_emotion_weight"] == 0.5
    assert "loss_chain_emotion" in json.loads(rows[-1])  # stage 4 trained with it


def test_the_small_preset_refits_start_from_given_weights(tmp_path):
    """--refit-from: no stage runs; the style refit of the style parts alone keeps every
    classifier, the content refit follows it, and both start from the given weights."""
    from empatheia import Empatheia
    from empatheia.modeling import load_trained_state
    from empatheia.recipes import small_preset
    from empatheia.training.style_refit import STYLE_PARTS

    torch.manual_seed(0)
    start = tmp_path / "start"
    Empatheia.from_preset("tiny").save_pretrained(start / "final")
    records = [{**CONVERSATIONS[i % 2], "conv_id": f"hit:{i}_conv:{i}"} for i in range(6)]
    source = _write(tmp_path / "ed.jsonl", records)
    small_preset.main(["--ed", str(source), "--out", str(tmp_path / "run"), "--preset", "tiny", "--render", "2",
                       "--workers", "1", "--refit-from", str(start), "--style-refit-steps", "3",
                       "--style-refit-parts", "style", "--text-dialogues", "0", "--content-refit-steps", "2"])
    assert not any((tmp_path / "run" / name).exists() for name in ("stage1_coe", "stage2_ccl", "stage4_joint"))
    before = load_trained_state(start / "final")
    styled = load_trained_state(tmp_path / "run" / "style_refit" / "final")
    changed = {k for k in styled if not torch.equal(styled[k], before[k])}
    assert changed and all(k.startswith(tuple("style_disentangler." + p for p in STYLE_PARTS)) for k in changed)
    content = load_trained_state(tmp_path / "run" / "content_refit" / "final")
    changed = {k.split(".")[0] for k in content if not torch.equal(content[k], styled[k])}
    assert changed == {"content_synchronizer"}
    with pytest.raises(SystemExit):
        small_preset.main(["--ed", str(source), "--out", str(tmp_path / "other"), "--preset", "tiny",
                           "--refit-from", str(tmp_path / "nothing")])


def test_the_small_preset_continues_stage_1_from_given_weights(tmp_path, capsys):
    """--stages 1 --stage1-init: stage 1, in a process of its own, trains the given model's
    language core further and keeps every other part; the export is that stage's."""
    from safetensors.torch import load_file

    from empatheia import Empatheia
    from empatheia.modeling import load_trained_state
    from empatheia.recipes import small_preset

    torch.manual_seed(0)
    start = tmp_path / "start"
    Empatheia.from_preset("tiny").save_pretrained(start)
    records = [{**CONVERSATIONS[i % 2], "conv_id": f"hit:{i}_conv:{i}"} for i in range(6)]
    source = _write(tmp_path / "ed.jsonl", records)
    small_preset.main(["--ed", str(source), "--out", str(tmp_path / "run"), "--preset", "tiny", "--stages", "1",
                       "--stage1-init", str(start), "--stage1-steps", "2",
                       "--export-weights", str(tmp_path / "weights"), "--export-metrics", str(tmp_path / "metrics"),
                       "--set", "mixed_precision=no"])
    stage_preload = {**os.environ, **small_preset.allocator_environment("auto")}.get("LD_PRELOAD", "")
    allocator = "jemalloc" if "jemalloc" in stage_preload else "the system allocator"
    assert f"[small] stage processes allocate with {allocator}" in capsys.readouterr().out
    assert not (tmp_path / "run" / "rendered").exists()  # no media stage ran
    before, after = load_trained_state(start), load_file(str(tmp_path / "weights" / "empatheia.safetensors"))
    changed = {k.split(".")[0] for k in before if not torch.equal(after[k], before[k].half()
                                                                  if before[k].is_floating_point()
                                                                  and not k.endswith(("running_mean", "running_var"))
                                                                  else before[k])}
    assert changed == {"language_model"}
    assert (tmp_path / "metrics" / "stage1_coe" / "metrics.jsonl").is_file()
    with pytest.raises(SystemExit):
        small_preset.main(["--ed", str(source), "--out", str(tmp_path / "other"), "--preset", "tiny",
                           "--stage1-init", str(tmp_path / "nothing")])


def test_a_small_preset_stage_that_fails_in_its_process_names_itself(tmp_path, capfd):
    """Each stage runs in a spawned process; its failure must not pass for success."""
    from empatheia.recipes import small_preset

    with pytest.raises(RuntimeError, match=r"stage 1 \(stage1_coe\) failed: its process exited with 1"):
        small_preset.run_stage(1, tmp_path, tmp_path / "missing.jsonl", steps=1, preset="tiny")
    assert "missing.jsonl" in capfd.readouterr().err  # the child's own error reached the console
    assert not (tmp_path / "stage1_coe" / "final").exists()


MEAD = Path(__file__).resolve().parents[2] / "shared" / "data" / "media" / "mead_faces" / "video"


@pytest.mark.skipif(not MEAD.is_dir(), reason="needs ../shared/data (real MEAD face clips)")
def test_speakers_show_recorded_faces_of_the_conversations_emotion(tmp_path):
    from empatheia.data.render import RenderSettings, read_face_clips

    clips = [c for c in read_face_clips(MEAD) if c.actor != "W011"]  # one actor held out
    assert {c.emotion for c in clips} == {"sad", "happy", "angry", "fear", "surprised", "contempt", "disgusted", "neutral"}
    settings = RenderSettings(speech_style_dim=16, video_style_dim=16, face_clips=tuple(clips), real_face_share=1.0)
    path = render_ed_conversations(_write(tmp_path / "ed.jsonl", CONVERSATIONS[1:]), tmp_path / "rendered",
                                   settings, progress=False)
    record = json.loads(path.read_text().splitlines()[0])
    shown = record["face_clips"]
    assert len(shown) == 1 and "_sad_" in shown[0] and not shown[0].startswith("W011")  # devastated -> sad
    speaker = record["history"][0]
    assert speaker["video"].endswith("_face.mp4") and speaker["audio"].endswith(".wav")
    copied = tmp_path / "rendered" / speaker["video"]
    assert copied.read_bytes() == (MEAD / shown[0]).read_bytes()
    assert record["response"]["video"].endswith("utt1.mp4")  # the listener stays the rendered avatar
    corpus = read_dataset(path)
    assert corpus[0].turns[0].video == copied


def test_face_clip_names_that_do_not_parse_name_the_file(tmp_path):
    from empatheia.data.render import read_face_clips
    from empatheia.errors import DataError

    (tmp_path / "W001_front_bored_level3_001.mp4").write_bytes(b"")
    with pytest.raises(DataError, match="W001_front_bored_level3_001.mp4.*unknown emotion 'bored'"):
        read_face_clips(tmp_path)
    (tmp_path / "W001_front_bored_level3_001.mp4").unlink()
    (tmp_path / "clip.mp4").write_bytes(b"")
    with pytest.raises(DataError, match="clip.mp4"):
        read_face_clips(tmp_path)


def test_stage_one_can_stand_on_a_trained_language_core(tmp_path):
    from empatheia import Empatheia
    from empatheia.modeling import load_trained_state
    from empatheia.recipes.small_preset import export_metrics, language_core_from

    donor = Empatheia.from_preset("tiny")
    with torch.no_grad():
        for _, param in donor.parameter_groups()["lora"]:
            param.add_(0.5)
    weights = donor.save_pretrained(tmp_path / "donor") / "empatheia.safetensors"
    stage1 = language_core_from(weights, tmp_path / "run" / "stage1_coe", preset="tiny")
    saved = load_trained_state(stage1 / "final")
    donated = load_trained_state(weights)
    fresh = Empatheia.from_preset("tiny", trained=False).trained_state_dict()
    for key, value in saved.items():
        # The language core is the donor's; projectors and heads start fresh.
        expected = donated[key] if key.startswith("language_model.") else fresh[key]
        assert torch.equal(value, expected), key
    summary = export_metrics({"stage1_coe": stage1}, tmp_path / "metrics").read_text()
    assert "not trained in this run: the language core of empatheia.safetensors" in summary
