"""Gold feature extraction: sharded store, manifest, resuming after a kill, fingerprints,
bad samples."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from empatheia.errors import DataError
from empatheia.data.gold_features import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    FeatureSource,
    GoldFeatureExtractor,
    GoldFeatureStore,
    GoldFeatureStoreError,
    extract_gold_features,
)
from tests.conftest import shared_data
from tests.gold_feature_extractors import (
    DELAY_ENV,
    CharEmbedding,
    FrameStats,
    LogEnergyStats,
    default_extractors,
    make_sources,
    write_wav,
)

REPO_ROOT = Path(__file__).resolve().parents[1]


def read_manifest(directory: Path) -> dict:
    return json.loads((directory / MANIFEST_NAME).read_text(encoding="utf-8"))


def assert_same_store(a: GoldFeatureStore, b: GoldFeatureStore) -> None:
    assert a.keys() == b.keys()
    for key in a.keys():
        fa, fb = a.get(key), b.get(key)
        assert fa.keys() == fb.keys()
        for name in fa:
            assert fa[name].dtype == fb[name].dtype and fa[name].shape == fb[name].shape
            assert torch.equal(fa[name], fb[name]), (key, name)


def file_digests(directory: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.glob("features-*"))}


def test_extractors_follow_the_protocol():
    assert all(isinstance(e, GoldFeatureExtractor) for e in default_extractors())
    assert not isinstance(object(), GoldFeatureExtractor)


def test_uninterrupted_run_stores_every_feature(tmp_path, capsys):
    sources = make_sources(tmp_path / "media", 10)
    extractors = default_extractors()
    store = extract_gold_features(sources, extractors, tmp_path / "out", shard_size=4, batch_size=3, progress=True)

    assert "10/10" in capsys.readouterr().err  # the progress bar ran to the end
    assert store.complete and store.skipped == []
    assert store.keys() == [s.key for s in sources] and len(store) == 10
    assert sources[3].key in store and "nope" not in store
    assert store.feature_names == ("speech_content", "speech_style", "video_content")

    # One call per extractor per batch; batches never straddle a shard (4 -> 3 + 1).
    for extractor in extractors:
        assert [len(call) for call in extractor.calls] == [3, 1, 3, 1, 2]

    # Values equal calling the extractors directly, one input at a time; dtypes kept.
    fresh = default_extractors()
    for source in sources:
        features = store.get(source.key)
        assert set(features) == set(store.feature_names)
        for extractor in fresh:
            expected = extractor([getattr(source, extractor.input)])[0]
            assert features[extractor.name].dtype == expected.dtype
            assert torch.equal(features[extractor.name], expected), (source.key, extractor.name)
        assert features["speech_content"].shape == (len(source.text), 16)
        assert features["speech_style"].shape == (8,)
        assert features["video_content"].dtype == torch.float16 and features["video_content"].shape[1] == 6
    assert store[sources[0].key].keys() == store.get(sources[0].key).keys()

    manifest = read_manifest(tmp_path / "out")
    assert manifest["format_version"] == FORMAT_VERSION and manifest["complete"] is True
    assert manifest["shard_size"] == 4 and manifest["total_sources"] == 10 and manifest["num_shards"] == 3
    assert [(e["name"], e["input"], e["fingerprint"]) for e in manifest["extractors"]] == [
        (e.name, e.input, e.fingerprint()) for e in extractors
    ]
    assert [(s["file"], s["start"], s["stop"]) for s in manifest["shards"]] == [
        ("features-00000.safetensors", 0, 4),
        ("features-00001.safetensors", 4, 8),
        ("features-00002.safetensors", 8, 10),
    ]
    lengths = [len(s.text) for s in sources]
    assert manifest["features"]["speech_content"] == {
        "input": "text", "ndim": 2, "dim": 16, "dtype": "float32",
        "min_length": min(lengths), "max_length": max(lengths),
    }
    assert manifest["features"]["speech_style"]["ndim"] == 1 and manifest["features"]["speech_style"]["dim"] == 8
    assert manifest["features"]["video_content"]["dtype"] == "float16"
    for shard in manifest["shards"]:
        assert len(shard["keys"]) <= 4 and shard["keys"] == [s.key for s in sources[shard["start"] : shard["stop"]]]
        with safe_open(str(tmp_path / "out" / shard["file"]), "pt") as f:
            assert sorted(f.keys()) == sorted(f"{k}/{n}" for k in shard["keys"] for n in store.feature_names)
            assert json.loads(f.metadata()["empatheia.gold_features"]) == {
                "fingerprint": manifest["fingerprint"], "shard": shard["index"]
            }

    # The store survives pickling (DataLoader workers) and reads the same.
    clone = pickle.loads(pickle.dumps(store))
    assert torch.equal(clone.get(sources[9].key)["speech_style"], store.get(sources[9].key)["speech_style"])

    # Running again over a finished store computes nothing.
    again = default_extractors()
    extract_gold_features(sources, again, tmp_path / "out", shard_size=4, batch_size=3, progress=False)
    assert all(e.calls == [] for e in again)


def test_killed_extraction_resumes_to_the_same_result(tmp_path, capsys):
    media, killed, clean = tmp_path / "media", tmp_path / "killed", tmp_path / "clean"
    count, shard_size, batch_size = 18, 3, 2
    sources = make_sources(media, count)
    num_shards = count // shard_size

    env = dict(os.environ, **{DELAY_ENV: "0.04"})
    log = (tmp_path / "child.log").open("w")
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.gold_feature_extractors", str(killed), "--media-dir", str(media),
         "--count", str(count), "--shard-size", str(shard_size), "--batch-size", str(batch_size), "--no-progress"],
        cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert child.poll() is None, f"extraction ended before it could be killed:\n{(tmp_path / 'child.log').read_text()}"
            assert time.monotonic() < deadline, "no shard completed in time"
            if (killed / MANIFEST_NAME).exists() and 1 <= len(read_manifest(killed)["shards"]) < num_shards:
                break
            time.sleep(0.005)
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
        log.close()

    done = read_manifest(killed)["shards"]
    assert 1 <= len(done) < num_shards
    with pytest.raises(GoldFeatureStoreError, match=rf"incomplete: {len(done)} of {num_shards} shards"):
        GoldFeatureStore(killed)
    partial = GoldFeatureStore(killed, allow_partial=True)
    assert not partial.complete and len(partial) == len(done) * shard_size
    with pytest.raises(KeyError, match="incomplete"):
        partial.get(sources[-1].key)

    # What a kill in the middle of a write leaves behind.
    (killed / f".tmp-features-{len(done):05d}.safetensors.99999").write_bytes(b"half a shard")
    before = {s["file"]: (killed / s["file"]).stat() for s in done}

    extractors = default_extractors()
    store = extract_gold_features(sources, extractors, killed, shard_size=shard_size, batch_size=batch_size)
    assert f"{len(done) * shard_size}/{count}" in capsys.readouterr().err  # the bar starts where the run left off
    assert store.complete and not list(killed.glob(".tmp-*"))

    # Completed shards were neither recomputed nor rewritten.
    first_new = len(done) * shard_size
    for extractor in extractors:
        assert extractor.seen == [getattr(s, extractor.input) for s in sources[first_new:]]
    for name, stat in before.items():
        after = (killed / name).stat()
        assert (after.st_ino, after.st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)

    reference = extract_gold_features(
        sources, default_extractors(), clean, shard_size=shard_size, batch_size=batch_size, progress=False
    )
    assert_same_store(store, reference)
    assert read_manifest(killed) == read_manifest(clean)
    assert file_digests(killed) == file_digests(clean)


def test_different_extraction_in_the_same_directory_is_refused(tmp_path):
    sources = make_sources(tmp_path / "media", 5)
    out = tmp_path / "out"
    extract_gold_features(sources, default_extractors(), out, shard_size=2, progress=False)
    digests = file_digests(out)

    other_weights = [CharEmbedding(seed=1), LogEnergyStats(), FrameStats()]
    with pytest.raises(GoldFeatureStoreError, match="different extraction") as info:
        extract_gold_features(sources, other_weights, out, shard_size=2, progress=False)
    message = str(info.value)
    assert "'speech_content' fingerprint" in message and "new output directory" in message and "delete" in message

    changed = list(sources)
    changed[2] = FeatureSource(changed[2].key, "A different response.", changed[2].audio, changed[2].video)
    with pytest.raises(GoldFeatureStoreError, match="sources .* differ"):
        extract_gold_features(changed, default_extractors(), out, shard_size=2, progress=False)
    with pytest.raises(GoldFeatureStoreError, match="shard_size was 2, now 3"):
        extract_gold_features(sources, default_extractors(), out, shard_size=3, progress=False)
    with pytest.raises(GoldFeatureStoreError, match="5 sources before, 4 now"):
        extract_gold_features(sources[:4], default_extractors(), out, shard_size=2, progress=False)
    assert file_digests(out) == digests  # nothing was touched


def bad_sources(tmp_path: Path):
    """Eight sources, three of them bad in different ways."""
    sources = make_sources(tmp_path / "media", 8)
    short = write_wav(tmp_path / "media" / "short.wav", 0.01, seed=99)
    sources[1] = FeatureSource(sources[1].key, sources[1].text, short, sources[1].video)  # audio fails
    sources[4] = FeatureSource(sources[4].key, "Ça va aller.", sources[4].audio, sources[4].video)  # text fails
    sources[6] = FeatureSource(sources[6].key, sources[6].text, sources[6].audio, None)  # no video
    return sources, short


def test_on_error_raise_names_file_key_and_field(tmp_path):
    sources, short = bad_sources(tmp_path)
    with pytest.raises(DataError) as info:
        extract_gold_features(sources, default_extractors(), tmp_path / "out", shard_size=4, progress=False)
    error = info.value
    assert (error.file, error.record, error.field) == (str(short), sources[1].key, "audio")
    assert str(short) in str(error) and sources[1].key in str(error) and "'audio'" in str(error)
    assert "speech_style" in str(error) and "shorter than one" in str(error)

    with pytest.raises(DataError) as info:
        extract_gold_features(sources[4:5], default_extractors(), tmp_path / "text", progress=False)
    assert (info.value.file, info.value.record, info.value.field) == (None, sources[4].key, "text")
    assert "'Ç'" in str(info.value)


def test_on_error_skip_reports_and_keeps_skips(tmp_path, caplog):
    sources, short = bad_sources(tmp_path)
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING, logger="empatheia.data.gold_features"):
        store = extract_gold_features(
            sources, default_extractors(), out, shard_size=4, batch_size=4, on_error="skip", progress=False
        )
    bad = [sources[i].key for i in (1, 4, 6)]
    assert [s.record for s in store.skipped] == bad and len(store.skip_report) == 3
    assert [s.field for s in store.skipped] == ["audio", "text", "video"]
    assert store.skipped[0].file == str(short) and "shorter than one" in store.skipped[0].reason
    assert "outside the ASCII vocabulary" in store.skipped[1].reason
    assert "no gold response video" in store.skipped[2].reason
    assert "3 of 8 sample(s) skipped" in caplog.text and all(key in caplog.text for key in bad)

    assert store.complete and len(store) == 5
    for key in bad:
        assert key not in store
    with pytest.raises(KeyError, match=r"skipped .*shorter than one"):
        store.get(sources[1].key)
    # The whole sample goes: not even the features that did work are stored.
    with safe_open(str(out / "features-00001.safetensors"), "pt") as f:
        assert not [name for name in f.keys() if name.startswith(sources[4].key + "/")]
    manifest = read_manifest(out)
    assert manifest["shards"][0]["skipped"] == [
        {"key": sources[1].key, "reason": store.skipped[0].reason, "field": "audio", "file": str(short)}
    ]

    # A restart retries nothing and reports the same skips.
    again = default_extractors()
    restarted = extract_gold_features(sources, again, out, shard_size=4, batch_size=4, on_error="skip", progress=False)
    assert all(e.calls == [] for e in again)
    assert restarted.skipped == store.skipped
    # ... but will not pretend the store is whole if bad samples must raise.
    with pytest.raises(DataError, match="recorded as skipped") as info:
        extract_gold_features(sources, default_extractors(), out, shard_size=4, batch_size=4, progress=False)
    assert info.value.record == sources[1].key


def test_duplicate_keys_are_refused_before_any_work(tmp_path):
    sources = make_sources(tmp_path / "media", 4)
    sources[3] = FeatureSource(sources[1].key, "Again.", sources[3].audio, sources[3].video)
    extractors = default_extractors()
    with pytest.raises(DataError, match=rf"record {sources[1].key}.*duplicate key: sources 1 and 3"):
        extract_gold_features(sources, extractors, tmp_path / "out", progress=False)
    assert all(e.calls == [] for e in extractors) and not (tmp_path / "out" / MANIFEST_NAME).exists()


def test_missing_inputs(tmp_path):
    sources = make_sources(tmp_path / "media", 3)
    no_audio = [FeatureSource(sources[0].key, sources[0].text, None, sources[0].video)] + sources[1:]
    with pytest.raises(DataError) as info:
        extract_gold_features(no_audio, default_extractors(), tmp_path / "a", progress=False)
    assert (info.value.record, info.value.field) == (sources[0].key, "audio")

    gone = tmp_path / "media" / "gone.npy"
    no_file = sources[:2] + [FeatureSource(sources[2].key, sources[2].text, sources[2].audio, gone)]
    with pytest.raises(DataError, match="not found") as info:
        extract_gold_features(no_file, default_extractors(), tmp_path / "b", progress=False)
    assert (info.value.file, info.value.record, info.value.field) == (str(gone), sources[2].key, "video")

    # An extractor that does not need the missing field is not bothered by it.
    store = extract_gold_features(no_audio, [CharEmbedding()], tmp_path / "c", progress=False)
    assert len(store) == 3
    store = extract_gold_features(no_audio, default_extractors(), tmp_path / "d", on_error="skip", progress=False)
    assert [s.record for s in store.skipped] == [sources[0].key] and len(store) == 2


def test_bad_arguments_and_missing_store(tmp_path):
    sources = make_sources(tmp_path / "media", 2)
    with pytest.raises(ValueError, match="on_error"):
        extract_gold_features(sources, default_extractors(), tmp_path / "o", on_error="ignore")
    with pytest.raises(ValueError, match="shard_size"):
        extract_gold_features(sources, default_extractors(), tmp_path / "o", shard_size=0)
    with pytest.raises(ValueError, match="two extractors are named"):
        extract_gold_features(sources, [CharEmbedding(), CharEmbedding(seed=2)], tmp_path / "o")
    with pytest.raises(TypeError, match="not a GoldFeatureExtractor"):
        extract_gold_features(sources, [lambda inputs: inputs], tmp_path / "o")
    with pytest.raises(FileNotFoundError, match="no manifest.json"):
        GoldFeatureStore(tmp_path / "o")


def test_real_speech_file(tmp_path):
    wav = shared_data("media/speech/happy.wav")
    source = FeatureSource("real/0", text="I'm so happy for you!", audio=wav)
    store = extract_gold_features([source], [CharEmbedding(), LogEnergyStats()], tmp_path / "out", progress=False)
    style = store.get("real/0")["speech_style"]
    assert style.shape == (8,) and torch.isfinite(style).all() and style[-1] > 0.5  # seconds of speech
    assert torch.equal(style, LogEnergyStats()([wav])[0])


class Toy:
    """A text extractor whose output the test chooses, to break the contract on purpose."""

    input = "text"

    def __init__(self, name, make):
        self.name, self.make = name, make

    def fingerprint(self) -> str:
        return "toy"

    def __call__(self, inputs):
        return self.make(inputs)


def test_extractor_outputs_are_checked(tmp_path):
    sources = [FeatureSource(f"k{i}", text="x" * (i + 1)) for i in range(3)]
    with pytest.raises(TypeError, match="must return a list of 3 tensors, got 2"):
        extract_gold_features(sources, [Toy("f", lambda xs: [torch.zeros(2)] * 2)], tmp_path / "a", progress=False)
    with pytest.raises(TypeError, match=r"returned \(1, 2, 3\) for 'k0'"):
        extract_gold_features(sources, [Toy("f", lambda xs: [torch.zeros(1, 2, 3)] * len(xs))], tmp_path / "b", progress=False)
    with pytest.raises(ValueError, match="every sample of a feature must agree"):
        extract_gold_features(sources, [Toy("f", lambda xs: [torch.zeros(len(x)) for x in xs])], tmp_path / "c", progress=False)

    # NaN features are bad samples, not stored.
    nan_for_long = Toy("f", lambda xs: [torch.full((len(x), 2), float("nan") if len(x) == 2 else 1.0) for x in xs])
    store = extract_gold_features(sources, [nan_for_long], tmp_path / "d", on_error="skip", progress=False)
    assert store.keys() == ["k0", "k2"] and [(s.record, s.field) for s in store.skipped] == [("k1", "text")]
    assert "NaN" in store.skipped[0].reason
    assert store.features["f"] == {"input": "text", "ndim": 2, "dim": 2, "dtype": "float32", "min_length": 1, "max_length": 3}
