"""`empatheia eval` with speech and video: `--speak`/`--animate` model runs writing media
and style vectors, `--multimodal` scoring (empatheia.evaluation.multimodal: style
agreement, SSIM against reference clips...) and its report tables.

The end-to-end test runs the tiny preset on two examples with the packaged Whisper, FER
and MobileNetV2; the aggregation is checked by hand with stand-in models on synthetic
clips."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from empatheia.evaluation import model_runs, records
from empatheia.evaluation.consistency import character_similarity
from empatheia.evaluation.multimodal import MultimodalModels, score_multimodal
from empatheia.evaluation.report import write_report
from empatheia.evaluation.scoring import RecordFiles, ScoreOptions, score, score_files
from empatheia.config import EmpatheiaConfig
from empatheia.evaluation.speech import character_errors, style_agreement
from empatheia.evaluation.video import video_ssim
from empatheia.labels import EMOTION_LABELS

from .test_eval_cli import read_jsonl, run_cli, write_jsonl

ED = [
    {"conv_id": "c1", "situation": "I lost my job.", "emotion": "sad", "utterances": ["I lost my job today", "I am so sorry"]},
    {"conv_id": "c2", "situation": "I won a prize.", "emotion": "proud", "utterances": ["I won the science prize", "Congratulations"]},
]


# ---------------------------------------------------------------------- end to end
def test_animated_run_is_scored_and_resumes(tmp_path, capsys):
    data = write_jsonl(tmp_path / "ed.jsonl", ED)
    out = tmp_path / "run"
    argv = ["eval", "--preset", "tiny", "--data", str(data), "--out", str(out), "--max-new-tokens", "16",
            "--no-progress", "--animate", "--multimodal"]
    assert run_cli(argv) == 0

    predictions = read_jsonl(out / "predictions.jsonl")
    assert [p["id"] for p in predictions] == ["c1/1", "c2/1"]
    for p in predictions:
        assert p["audio"] == f"media/{model_runs.media_stem(p['id'])}.wav" and p["video"] == f"media/{model_runs.media_stem(p['id'])}.mp4"
        assert (out / p["audio"]).stat().st_size > 0 and (out / p["video"]).stat().st_size > 0
        assert isinstance(p["avatar"], str) and p["avatar"]
    assert not list((out / "media").glob(".*"))  # no temporary file left behind
    assert json.loads((out / "run.json").read_text())["animate"] is True
    # Requested styles and those the tiny preset's generators measure on the written files.
    widths = EmpatheiaConfig.from_preset("tiny").style_disentangler
    for p in predictions:
        assert len(p["speech_style"]) == len(p["speech_style_realised"]) == widths.speech_style_dim
        assert len(p["video_style"]) == len(p["video_style_realised"]) == widths.video_style_dim
        for name in records.STYLE_FIELDS:
            assert all(isinstance(v, float) and math.isfinite(v) for v in p[name])

    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["media"] == {"audio": 2, "video": 2, "scored": True}
    speech, video, consistency = metrics["speech"], metrics["video"], metrics["consistency"]
    assert speech["count"] == 2 and speech["silent_clips"] == 0
    for key in ("wer_mean", "cer_mean", "wer_corpus", "cer_corpus"):
        assert speech[key] >= 0.0
    assert 0.1 < speech["duration_mean_seconds"] < 30.0
    assert -70.0 <= speech["loudness_mean_dbfs"] <= 0.0
    assert video["count"] == 2 and 0.0 <= video["cpbd_mean"] <= 1.0
    assert video["lip_sync_count"] + video["lip_sync_unscored"] == 2 and video["lip_sync_count"] >= 1
    assert math.isfinite(video["lip_sync_confidence_mean"]) and 0.0 <= video["lip_sync_confidence_mean"] <= 2.0
    assert 0.0 <= video["lip_sync_in_sync_share"] <= 1.0 and 0.0 <= video["lip_sync_offset_abs_mean"] <= 15.0
    # ED's gold emotions (sad, proud -> happy) are both readable by FER.
    assert video["facial_emotion_scored"] == 2 and video["facial_emotion_excluded"] == 0
    assert video["facial_emotion_accuracy"] == video["facial_emotion_correct"] / 2
    # ED has no listener profiles: one default avatar speaks both responses.
    (avatar,) = {p["avatar"] for p in predictions}
    assert video["identity_avatars"] == 1 and video["identity_pairs"] == 1
    entry = video["identity_per_avatar"][avatar]
    assert entry["clips"] == 2 and -1.0 <= entry["mean_similarity"] <= 1.0 + 1e-6
    assert video["identity_consistency_mean"] == pytest.approx(entry["mean_similarity"])
    assert consistency["text_video_count"] + consistency["text_video_excluded"] == 2
    assert 0.0 <= consistency["text_video_emotion_agreement"] <= 1.0
    # Style agreement over both responses, as style_agreement gives it on the recorded vectors.
    for block, name in (("speech", "speech_style"), ("video", "video_style")):
        found = [style_agreement(p[name], p[f"{name}_realised"]) for p in predictions]
        assert metrics[block]["style_count"] == 2
        assert metrics[block]["style_cosine_mean"] == pytest.approx(np.mean([f.cosine for f in found]))
        assert metrics[block]["style_mse_mean"] == pytest.approx(np.mean([f.mse for f in found]))
        assert -1.0 - 1e-9 <= metrics[block]["style_cosine_mean"] <= 1.0 + 1e-9 and metrics[block]["style_mse_mean"] >= 0.0
    assert "ssim_mean" not in video  # ED has no gold clips
    # mean max(0, 1 - WER) >= max(0, 1 - mean WER) (convexity), equal when no WER exceeds 1
    assert 1.0 >= consistency["text_speech_word_agreement"] >= max(0.0, 1.0 - speech["wer_mean"]) - 1e-9
    assert 0.0 <= consistency["text_speech_char_similarity"] <= 1.0
    markdown = (out / "report.md").read_text()
    for heading in ("## Speech", "## Video", "## Identity consistency per avatar", "## Cross-modal consistency"):
        assert heading in markdown
    assert "| WER (mean over clips) |" in markdown and "<td>CPBD sharpness (mean)</td>" in (out / "report.html").read_text()
    assert "| Style agreement: cosine, requested vs realised S^s (mean) |" in markdown
    assert "| Style agreement: MSE, requested vs realised S^v (mean) |" in markdown
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["speech_style_cosine_mean"] == metrics["speech"]["style_cosine_mean"]
    assert printed["video_style_cosine_mean"] == metrics["video"]["style_cosine_mean"]

    # Resuming redoes nothing: no response, no media file rewritten, same scores.
    stamps = {f.name: (f.stat().st_mtime_ns, f.read_bytes()) for f in (out / "media").iterdir()}
    lines = (out / "predictions.jsonl").read_text()
    assert run_cli(argv) == 0
    assert "2 example(s): 2 predicted by an earlier run, 0 now" in capsys.readouterr().err
    assert (out / "predictions.jsonl").read_text() == lines
    assert {f.name: (f.stat().st_mtime_ns, f.read_bytes()) for f in (out / "media").iterdir()} == stamps
    assert json.loads((out / "metrics.json").read_text())["speech"] == speech

    # Without --animate it would be another run: refused, not mixed.
    with pytest.raises(SystemExit, match=r"another run \(animate: was True, now False\)"):
        run_cli([a for a in argv if a not in ("--animate", "--multimodal")] + ["--speak"])

    # Scoring the files: media relative to the predictions file's folder; without video (and its style), no video block.
    audio_only = write_jsonl(out / "audio_only.jsonl", [
        {k: v for k, v in p.items() if k not in ("video", "video_style", "video_style_realised")} for p in predictions])
    assert run_cli(["eval", "--predictions", str(audio_only), "--references", str(out / "references.jsonl"),
                    "--out", str(tmp_path / "files"), "--multimodal", "--no-progress"]) == 0
    scored = json.loads((tmp_path / "files" / "metrics.json").read_text())
    assert scored["speech"] == speech and "video" not in scored
    assert set(scored["consistency"]) == {"text_speech_word_agreement", "text_speech_char_similarity", "text_speech_count"}


def test_missing_media_names_the_file_and_the_id(tmp_path):
    references = write_jsonl(tmp_path / "ref.jsonl", [{"id": "a", "response": "Hi.", "emotion": "sad"},
                                                      {"id": "b/2", "response": "Oh.", "emotion": "happy"}])
    predictions = write_jsonl(tmp_path / "pred.jsonl", [
        {"id": "a", "text": "Hello.", "emotion": "sad"},
        {"id": "b/2", "text": "Oh.", "emotion": "happy", "audio": "media/b.wav"},
    ])
    argv = ["eval", "--predictions", str(predictions), "--references", str(references), "--out", str(tmp_path / "o")]
    expected = (rf"pred.jsonl, record id 'b/2', field 'audio': audio file not found: {tmp_path / 'media' / 'b.wav'} "
                rf"\(given as 'media/b.wav', relative to {tmp_path}\)")
    with pytest.raises(SystemExit, match=expected):
        run_cli(argv + ["--multimodal"])
    absolute = tmp_path / "elsewhere" / "b.mp4"
    write_jsonl(predictions, [{"id": "a", "text": "Hello.", "emotion": "sad", "video": str(absolute)}])
    with pytest.raises(SystemExit, match=rf"record id 'a', field 'video': video file not found: {absolute}$"):
        run_cli(argv + ["--multimodal", "--allow-missing"])
    (tmp_path / "media").mkdir()
    (tmp_path / "media" / "b.wav").write_bytes(b"not a wav file")
    write_jsonl(predictions, [{"id": "b/2", "text": "Oh.", "emotion": "happy", "audio": "media/b.wav"}])
    with pytest.raises(SystemExit, match=r"record id 'b/2', field 'audio': cannot read the audio file .*b\.wav"):
        run_cli(argv + ["--multimodal", "--allow-missing"])
    write_jsonl(predictions, [{"id": "a", "text": "Hello.", "emotion": "sad", "video": str(absolute)}])
    # Without --multimodal the media are counted, not opened.
    assert run_cli(argv + ["--allow-missing"]) == 0
    assert json.loads((tmp_path / "o" / "metrics.json").read_text())["media"] == {"audio": 0, "video": 1, "scored": False}


def test_media_options_belong_to_their_modes(tmp_path):
    predictions = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "text": "Hi.", "emotion": "sad"}])
    references = write_jsonl(tmp_path / "r.jsonl", [{"id": "a", "response": "Hi.", "emotion": "sad"}])
    with pytest.raises(SystemExit, match="--animate only apply with --checkpoint/--preset"):
        run_cli(["eval", "--predictions", str(predictions), "--references", str(references), "--out", str(tmp_path / "o"),
                 "--animate"])
    with pytest.raises(SystemExit, match="--multimodal scores the responses' speech and video: add --speak or --animate"):
        run_cli(["eval", "--preset", "tiny", "--data", str(predictions), "--out", str(tmp_path / "o"), "--multimodal"])
    with pytest.raises(SystemExit, match=r"p.jsonl: multimodal scoring needs predictions with an 'audio' or 'video' file"):
        run_cli(["eval", "--predictions", str(predictions), "--references", str(references), "--out", str(tmp_path / "o"),
                 "--multimodal"])


def test_media_stems_are_safe_and_distinct(tmp_path):
    ids = ["c1/3", "c1_3", "c1:3", "../x", "a" * 300, "é", ".", "plain-id_1.2"]
    stems = [model_runs.media_stem(i) for i in ids]
    assert len(set(stems)) == len(ids)
    assert stems[1] == "c1_3" and stems[-1] == "plain-id_1.2" and stems[0].startswith("c1_3-")
    for stem in stems:
        assert all(ch.isascii() and (ch.isalnum() or ch in "-_.") for ch in stem) and len(stem) <= 89
        assert not stem.startswith(".")
    # A run.json written before --speak/--animate existed reads as a run without them.
    (tmp_path / "predictions.jsonl").write_text('{"id": "a", "text": "x", "emotion": "sad"}\n')
    (tmp_path / "run.json").write_text(json.dumps({"model": "m", "max_new_tokens": 4}))
    model_runs.check_run_info(tmp_path, {"model": "m", "max_new_tokens": 4, "speak": False, "animate": False})
    with pytest.raises(model_runs.RunMismatchError, match=r"speak: was False, now True"):
        model_runs.check_run_info(tmp_path, {"model": "m", "max_new_tokens": 4, "speak": True, "animate": False})


# ---------------------------------------------------------------------- hand-checked aggregation
class NearestLevel:
    """Stand-in models keyed by a clip's mean grey level (the clips are flat colours)."""

    def __init__(self, table):
        self.table = table

    def __call__(self, frames) -> object:
        level = float(np.asarray(frames).mean())
        return self.table[min(self.table, key=lambda known: abs(known - level))]


class FakeExpression:
    labels = EMOTION_LABELS
    max_frames = 4

    def __init__(self, table):
        self.lookup = NearestLevel(table)

    def read(self, frames):
        return SimpleNamespace(emotion=self.lookup(frames))


class FakeIdentity:
    def __init__(self, table):
        self.lookup = NearestLevel(table)

    def embed(self, video):
        return np.asarray(self.lookup(video.frames), dtype=np.float64)


class FakeTranscriber:
    """Hears by duration: 0.5 s "hello there", 1 s "good evening"."""

    def transcribe_many(self, clips):
        return ["hello there" if c.samples.shape[0] / c.sample_rate < 0.75 else "good evening" for c in clips]


def test_blocks_hand_checked_with_stand_in_models(tmp_path):
    import soundfile

    from empatheia.media import write_mp4

    rate = 16000
    for name, seconds in (("a1", 0.5), ("a2", 1.0)):
        t = np.arange(int(seconds * rate)) / rate
        soundfile.write(str(tmp_path / f"{name}.wav"), 0.5 * np.sin(2 * np.pi * 440 * t), rate, subtype="FLOAT")
    for level in (40, 128, 220):  # 12 frames: 11 transitions, lip sync searches offsets -1..1
        write_mp4(tmp_path / f"v{level}.mp4", torch.full((12, 64, 64, 3), level, dtype=torch.uint8), 25.0)
    predictions = [
        {"id": "p1", "text": "Hello there!", "emotion": "happy", "chain_emotion": "Joyful", "audio": "a1.wav",
         "video": "v40.mp4", "avatar": "A",
         "speech_style": [1.0, 0.0, 2.0], "speech_style_realised": [1.0, 0.0, 2.0],
         "video_style": [1.0, 0.0], "video_style_realised": [0.0, 1.0]},
        {"id": "p2", "text": "Good morning, friend.", "emotion": "contempt", "chain_emotion": "devastated",
         "audio": "a2.wav", "video": "v128.mp4",
         "avatar": "A", "speech_style": [1.0, 0.0], "speech_style_realised": [0.0, 3.0]},
        {"id": "p3", "text": "Oh no.", "emotion": "fear", "video": str(tmp_path / "v220.mp4"), "avatar": "B",
         "speech_style": [5.0, 5.0]},  # nothing realised to compare with: left out
    ]
    references = [
        {"id": "p1", "response": "x", "emotion": "joyful", "video": "v40.mp4"},  # folds to happy; its own clip
        {"id": "p2", "response": "x", "emotion": "contempt"},  # FER has no contempt: left out; no gold clip
        {"id": "p3", "response": "x", "emotion": "sad", "video": str(tmp_path / "v128.mp4")},
    ]
    models = MultimodalModels(
        transcriber=FakeTranscriber(),
        expression=FakeExpression({40: "happy", 128: "sad", 220: "fear"}),
        identity=FakeIdentity({40: [1.0, 0.0], 128: [0.6, 0.8], 220: [0.0, 1.0]}),
    )
    metrics = score(predictions, references, ScoreOptions(multimodal=True, multimodal_models=models),
                    RecordFiles(predictions_media=tmp_path, references_media=tmp_path))
    speech, video, consistency = metrics["speech"], metrics["video"], metrics["consistency"]

    # WER: p1 "hello there" heard exactly (0); p2 "good morning friend" heard "good evening":
    # 1 substitution + 1 deletion of 3 words. Corpus: 2 errors / 5 words.
    cer2 = character_errors("Good morning, friend.", "good evening").rate
    assert speech["count"] == 2 and speech["silent_clips"] == 0
    assert speech["wer_mean"] == pytest.approx((0 + 2 / 3) / 2) and speech["wer_corpus"] == pytest.approx(2 / 5)
    assert speech["cer_mean"] == pytest.approx(cer2 / 2)
    assert speech["duration_mean_seconds"] == pytest.approx(0.75)
    assert speech["loudness_mean_dbfs"] == pytest.approx(20 * math.log10(0.5 / math.sqrt(2)), abs=0.05)  # -9.03

    assert video["count"] == 3 and video["cpbd_mean"] == 0.0  # flat frames have no edge to judge
    assert video["lip_sync_count"] == 2 and video["lip_sync_unscored"] == 0  # p3 has no audio
    assert 0.0 <= video["lip_sync_confidence_mean"] <= 2.0 and video["lip_sync_offset_abs_mean"] <= 1.0
    # happy vs happy right; contempt excluded; sad read as fear wrong.
    assert (video["facial_emotion_correct"], video["facial_emotion_scored"], video["facial_emotion_excluded"]) == (1, 2, 1)
    assert video["facial_emotion_accuracy"] == 0.5
    # Avatar A: cos([1, 0], [0.6, 0.8]) = 0.6; B has one clip.
    assert video["identity_per_avatar"] == {
        "A": {"clips": 2, "mean_similarity": pytest.approx(0.6), "min_similarity": pytest.approx(0.6)},
        "B": {"clips": 1, "mean_similarity": None, "min_similarity": None}}
    assert video["identity_consistency_mean"] == pytest.approx(0.6) and video["identity_pairs"] == 1
    assert video["identity_avatars"] == 1

    # Text vs face: happy/happy and fear/fear agree; p2's text emotion (contempt) is left out.
    assert consistency["text_video_emotion_agreement"] == 1.0
    assert (consistency["text_video_count"], consistency["text_video_excluded"]) == (2, 1)
    # Chain vs face: p1's chain (joyful -> happy) agrees, p2's (devastated -> sad) agrees
    # with its sad face although its text emotion is contempt; p3 has no chain.
    assert consistency["chain_video_emotion_agreement"] == 1.0
    assert (consistency["chain_video_count"], consistency["chain_video_excluded"]) == (2, 1)
    assert consistency["text_speech_word_agreement"] == pytest.approx((1 + 1 / 3) / 2)
    assert consistency["text_speech_char_similarity"] == pytest.approx(
        (1.0 + character_similarity("Good morning, friend.", "good evening")) / 2)
    assert consistency["text_speech_count"] == 2

    # Speech style: p1 identical (cos 1, mse 0); p2 [1, 0] vs [0, 3] orthogonal (cos 0, mse (1 + 9) / 2 = 5).
    assert (speech["style_count"], speech["style_cosine_mean"], speech["style_mse_mean"]) == (2, pytest.approx(0.5), 2.5)
    # Video style: only p1, [1, 0] vs [0, 1]: cos 0, mse (1 + 1) / 2.
    assert (video["style_count"], video["style_cosine_mean"], video["style_mse_mean"]) == (1, 0.0, 1.0)
    # SSIM: p1 against its own clip 1; p3 (flat 220) against flat 128, which for flat images is
    # (2ab + C1) / (a^2 + b^2 + C1) with a, b the levels (within what H.264 does to them).
    c1 = (0.01 * 255) ** 2
    flat = (2 * 220 * 128 + c1) / (220**2 + 128**2 + c1)
    other = video_ssim(tmp_path / "v220.mp4", tmp_path / "v128.mp4")
    assert other == pytest.approx(flat, abs=0.01)
    assert video["ssim_count"] == 2 and video["ssim_mean"] == pytest.approx((1.0 + other) / 2)

    # Same thing straight from score_multimodal, and the report's tables.
    direct = score_multimodal(predictions, ["happy", "contempt", "sad"], ["happy", "contempt", "fear"],
                              base_dir=tmp_path, models=models, references=references, references_dir=tmp_path)
    assert direct["speech"] == pytest.approx(speech) and direct["video"]["ssim_mean"] == pytest.approx(video["ssim_mean"])
    written = write_report(metrics, tmp_path / "report")
    markdown = written["report.md"].read_text()
    assert "| Facial-emotion accuracy (FER vs gold) | 0.5000 (50.00%) |" in markdown
    assert "| B | 1 | n/a | n/a |" in markdown and "| Duration (mean) | 0.75 s |" in markdown
    assert "2 response(s) have audio and 3 video; scored below." in markdown
    assert f"| SSIM against the gold clip (mean) | {video['ssim_mean']:.4f} |" in markdown
    assert "| Style agreement: responses scored | 2 |" in markdown


class NoModels(MultimodalModels):
    """Fails the test if anything loads a model."""

    @property
    def transcriber(self):
        raise AssertionError("no transcriber should be needed")

    @property
    def expression(self):
        raise AssertionError("no FER model should be needed")

    @property
    def identity(self):
        raise AssertionError("no identity model should be needed")


def test_style_agreement_needs_no_model_and_checks_lengths(tmp_path):
    references = [{"id": "a", "response": "Hi.", "emotion": "sad"}, {"id": "b", "response": "Oh.", "emotion": "happy"}]
    predictions = [
        {"id": "a", "text": "Hello.", "emotion": "sad", "video_style": [0.0, 0.0], "video_style_realised": [0.0, 0.0]},
        {"id": "b", "text": "Oh.", "emotion": "happy", "video_style": [3.0, 4.0], "video_style_realised": [6.0, 8.0]},
    ]
    metrics = score(predictions, references, ScoreOptions(multimodal=True, multimodal_models=NoModels()))
    # Two zero vectors agree (cos 1, mse 0); [3, 4] vs [6, 8] same direction: cos 1, mse (9 + 16) / 2.
    assert metrics["video"] == {"style_cosine_mean": 1.0, "style_mse_mean": 6.25, "style_count": 2}
    assert "speech" not in metrics and metrics["consistency"] == {}
    write_report(metrics, tmp_path / "report")  # a video block with style keys only renders
    assert "| Style agreement: responses scored | 2 |" in (tmp_path / "report" / "report.md").read_text()

    bad = [dict(predictions[0]), dict(predictions[1], speech_style=[1.0, 2.0], speech_style_realised=[1.0, 2.0, 3.0])]
    path = write_jsonl(tmp_path / "pred.jsonl", bad)
    with pytest.raises(SystemExit, match=r"pred.jsonl, record id 'b', field 'speech_style_realised': has 3 values but "
                                         r"speech_style has 2"):
        run_cli(["eval", "--predictions", str(path), "--references", str(write_jsonl(tmp_path / "ref.jsonl", references)),
                 "--out", str(tmp_path / "o"), "--multimodal"])


def test_reference_clips_are_read_beside_the_references_file(tmp_path):
    from empatheia.media import write_mp4

    rng = np.random.default_rng(5)
    frames = torch.from_numpy(rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8))
    write_mp4(tmp_path / "gen.mp4", frames, 25.0)
    predictions = write_jsonl(tmp_path / "pred.jsonl", [
        {"id": "a", "text": "Hello.", "emotion": "sad", "video": "gen.mp4"},
        {"id": "b", "text": "Oh.", "emotion": "happy"},  # no video: its reference clip is not opened
    ])
    (tmp_path / "refs").mkdir()
    references = write_jsonl(tmp_path / "refs" / "ref.jsonl", [
        {"id": "a", "response": "Hi.", "emotion": "sad", "video": "clips/gold.mp4"},
        {"id": "b", "response": "Oh.", "emotion": "happy", "video": "clips/absent.mp4"},
    ])
    gold = tmp_path / "refs" / "clips" / "gold.mp4"
    expected = (rf"ref.jsonl, record id 'a', field 'video': video file not found: {gold} "
                rf"\(given as 'clips/gold.mp4', relative to {tmp_path / 'refs'}\)")
    with pytest.raises(SystemExit, match=expected):
        run_cli(["eval", "--predictions", str(predictions), "--references", str(references), "--out", str(tmp_path / "o"),
                 "--multimodal"])

    gold.parent.mkdir()
    gold.write_bytes((tmp_path / "gen.mp4").read_bytes())  # the gold clip is the generated one: SSIM 1
    models = MultimodalModels(transcriber=None, expression=FakeExpression({0: "sad"}), identity=None)
    metrics = score_files(predictions, references, ScoreOptions(multimodal=True, multimodal_models=models))
    assert (metrics["video"]["ssim_count"], metrics["video"]["ssim_mean"]) == (1, 1.0)


class SpyStyleGenerator:
    """Measures a fixed style per file name and records each style_features call."""

    def __init__(self, styles):
        self.styles, self.calls = styles, []

    def style_features(self, paths):
        self.calls.append(list(paths))
        return [torch.tensor(self.styles[Path(p).name]) for p in paths]


def test_response_styles_measure_each_batch_in_one_call(tmp_path):
    responses = [
        SimpleNamespace(speech_style=torch.tensor([0.1234567891, -2.0]), video_style=torch.tensor([1.0, 0.0, 0.5])),
        SimpleNamespace(speech_style=torch.tensor([3.0, 4.0]), video_style=torch.tensor([0.0, 1.0, 0.0])),
        SimpleNamespace(speech_style=torch.tensor([1.0, 1.0]), video_style=torch.tensor([2.0, 2.0, 2.0])),
    ]
    media = [{"audio": "media/a.wav", "video": "media/a.mp4"}, {"audio": "media/b.wav", "video": "media/b.mp4"},
             {"audio": "media/c.wav"}]  # spoken, not animated
    speech = SpyStyleGenerator({"a.wav": [0.5, 0.25], "b.wav": [3.0, 4.0], "c.wav": [1e-7, 123456789.0]})
    head = SpyStyleGenerator({"a.mp4": [1.0, 0.0, 0.5], "b.mp4": [1.0, 0.0, 0.0]})
    styles = model_runs.response_styles((speech, head), tmp_path, responses, media)
    assert speech.calls == [[tmp_path / "media/a.wav", tmp_path / "media/b.wav", tmp_path / "media/c.wav"]]
    assert head.calls == [[tmp_path / "media/a.mp4", tmp_path / "media/b.mp4"]]
    # float32 0.1234567891 is 0.123456791..., kept to 6 significant digits.
    assert styles[0] == {"speech_style": [0.123457, -2.0], "speech_style_realised": [0.5, 0.25],
                         "video_style": [1.0, 0.0, 0.5], "video_style_realised": [1.0, 0.0, 0.5]}
    assert styles[1]["video_style_realised"] == [1.0, 0.0, 0.0]
    assert styles[2] == {"speech_style": [1.0, 1.0], "speech_style_realised": [1e-7, 123457000.0]}
    weighing = {"sad": 0.75, "lonely": 0.25}
    record = records.prediction_record(
        SimpleNamespace(id="x"), SimpleNamespace(text="Hi.", emotion=SimpleNamespace(label="sad", probabilities={}),
                                                 chain=SimpleNamespace(speaker_emotion=None),
                                                 chain_emotion=SimpleNamespace(probabilities=weighing)), media[2], styles[2])
    assert record["speech_style_realised"] == [1e-7, 123457000.0] and record["audio"] == "media/c.wav"
    assert record["chain_emotion_probabilities"] == weighing
    assert records.validate_record(json.loads(json.dumps(record)), records.PREDICTION_FIELDS, None, "line 1") == record
