"""The sentence reader of the speaker's words (a logistic regression over the packaged
MiniLM's embedding), the folder of text readers ``small``'s chain is fused with, and the
recipe that fits the sentence reader by cross-validation on the training split."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from empatheia import Dialogue, Turn
from empatheia.labels import EMOTION_LABELS
from empatheia.variants.readers import (
    EmotionReader,
    SentenceEmotionReader,
    TextEmotionReader,
    load_text_readers,
    small_readers_folder,
    text_log_probabilities,
)

REPO = Path(__file__).resolve().parents[1]

TEXTS = {
    "joyful": ["I am so happy today", "what a wonderful sunny day", "we won the cup and we are thrilled",
               "my best friend threw me a lovely party"],
    "sad": ["my old dog died last night", "I miss my grandmother so much", "I cried all evening",
            "nobody came to my birthday"],
    "furious": ["my landlord kept my deposit for no reason", "he keyed my car and laughed",
                "they cut me off and then yelled at me", "I am livid at the airline"],
    "terrified": ["there was a stranger in my garden at midnight", "the plane shook and dropped",
                  "I heard footsteps in the empty house", "a huge spider crawled on my face"],
}


def spoken(text: str) -> Dialogue:
    return Dialogue([Turn("speaker", text), Turn("listener", "I see, tell me more.")])


@pytest.fixture(scope="module")
def sentence_reader() -> SentenceEmotionReader:
    texts = [t for label in TEXTS for t in TEXTS[label]]
    labels = [label for label in TEXTS for _ in TEXTS[label]]
    try:
        return SentenceEmotionReader.fit(texts, labels, l2=1e-4)
    except FileNotFoundError as missing:  # the MiniLM package is not installed
        pytest.skip(str(missing))


def test_the_sentence_reader_reads_its_training_texts_back(sentence_reader):
    assert isinstance(sentence_reader, EmotionReader) and sentence_reader.name == "sentence"
    assert sentence_reader.labels == sorted(TEXTS)
    assert sentence_reader.weights.shape == (384 + 1, 4)  # MiniLM's 384-d embedding and the bias
    for label, texts in TEXTS.items():
        fine = sentence_reader.fine_probabilities(texts)  # (4, 4)
        assert torch.allclose(fine.sum(1), torch.ones(len(texts)), atol=1e-5)
        assert fine.argmax(1).tolist() == [sentence_reader.labels.index(label)] * len(texts), label
    folded = sentence_reader.read(spoken(TEXTS["terrified"][0]))
    assert list(folded) == list(EMOTION_LABELS) and max(folded, key=folded.get) == "fear"


def test_the_embedding_is_unit_length_and_does_not_depend_on_the_batch(sentence_reader):
    texts = ["a short one", "a much longer sentence about the rain that would not stop all week"]
    together = sentence_reader.embed(texts)  # (2, 384)
    assert together.shape == (2, 384)
    assert torch.allclose(together.norm(dim=1), torch.ones(2), atol=1e-5)
    alone = torch.cat([sentence_reader.embed([text]) for text in texts])
    assert torch.allclose(together, alone, atol=1e-5)  # padding changes nothing


def test_the_sentence_reader_survives_save_and_load(sentence_reader, tmp_path):
    texts = ["my cat ran away", "I got the job!"]
    sentence_reader.save(tmp_path / "exact", torch.float32)
    loaded = SentenceEmotionReader.load(tmp_path / "exact")
    assert loaded.labels == sentence_reader.labels and loaded.encoder == sentence_reader.encoder
    assert torch.allclose(loaded.fine_probabilities(texts), sentence_reader.fine_probabilities(texts), atol=1e-6)
    sentence_reader.save(tmp_path / "half")  # half precision by default
    half = SentenceEmotionReader.load(tmp_path / "half")
    assert torch.allclose(half.fine_probabilities(texts), sentence_reader.fine_probabilities(texts), atol=2e-3)
    meta = json.loads((tmp_path / "half" / "sentence.json").read_text())
    del meta["encoder"]
    (tmp_path / "half" / "sentence.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"sentence\.json: no field 'encoder'"):
        SentenceEmotionReader.load(tmp_path / "half")


def test_a_folder_of_text_readers_multiplies_their_readings(sentence_reader, tmp_path):
    texts = [t for label in TEXTS for t in TEXTS[label]]
    labels = [label for label in TEXTS for _ in TEXTS[label]]
    with pytest.raises(FileNotFoundError, match="no text emotion reader in it.*text.json, sentence.json"):
        load_text_readers(tmp_path)
    TextEmotionReader.fit(texts, labels, min_count=1).save(tmp_path)
    assert [reader.name for reader in load_text_readers(tmp_path)] == ["text"]
    sentence_reader.save(tmp_path)
    readers = load_text_readers(tmp_path)
    assert [reader.name for reader in readers] == ["text", "sentence"]
    voice_only = Dialogue([Turn("speaker", "", audio="hello.wav"), Turn("listener", "I see.")])
    dialogues = [spoken("my old dog died"), voice_only]  # the second speaker said nothing in words
    wanted = ["sad", "terrified"]
    summed = text_log_probabilities(readers, dialogues, wanted)  # (2, 2)
    each = [reader.log_probabilities(dialogues, wanted) for reader in readers]
    assert torch.allclose(summed, each[0] + each[1])
    assert torch.equal(summed[1], torch.zeros(2))  # no say without words
    with pytest.raises(ValueError, match=r"the sentence reader's labels lack \['proud'\]"):
        readers[1].log_probabilities(dialogues, ["sad", "proud"])


def test_the_shipped_sentence_reader_reads_ed_labels():
    """The reader ``small`` ships, fitted on the ED training split: all 32 labels, and a
    speaker whose dog died is read as sad or devastated."""
    folder = small_readers_folder()
    if not folder.joinpath("sentence.json").is_file():
        pytest.skip("the shipped sentence reader is not fitted")
    readers = load_text_readers(folder)
    assert [reader.name for reader in readers] == ["text", "sentence"]
    sentence = readers[1]
    assert len(sentence.labels) == 32 and sentence.encoder == SentenceEmotionReader.DEFAULT_ENCODER
    fine = sentence.read_fine(spoken("My dog died this morning. I had him for fourteen years."))
    assert max(fine, key=fine.get) in {"sad", "devastated"}


def test_the_recipe_fits_the_readers_of_words_by_cross_validation(tmp_path):
    """fit_emotion_readers --readers text sentence on a small ED-style split: each reader's
    L2 weight and use of the situations are chosen by the 5 folds of the training split
    (the sentence reader by its own accuracy, the bag-of-words reader by the two readers'
    product), both readers are fitted with what was chosen and written, and the report
    says what was chosen and scored."""
    conversations = []
    for index in range(10):
        for label, texts in TEXTS.items():
            text = texts[index % len(texts)]
            conversations.append({"conv_id": f"{label}:{index}", "situation": f"{text}, it was {label}",
                                  "emotion": label, "utterances": [f"{text} ({index})", "Oh no, how so?"]})
    train, held = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    train.write_text("".join(json.dumps(c) + "\n" for c in conversations))
    held.write_text("".join(json.dumps(c) + "\n" for c in conversations[:8]))
    out = tmp_path / "readers"
    result = subprocess.run(
        [sys.executable, "-m", "empatheia.recipes.fit_emotion_readers", "--ed-train", str(train), "--ed-eval",
         str(held), "--out", str(out), "--readers", "text", "sentence", "--json", str(tmp_path / "report.json")],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert set(report) == {"cross_validation", "text", "sentence", "shipped_bytes"}
    cross_validation = report["cross_validation"]
    assert cross_validation["folds"] == 5
    assert len(cross_validation["sentence"]) == 8
    assert set(cross_validation["bag_of_words"]) == set(cross_validation["product"])
    assert len(cross_validation["bag_of_words"]) == 6
    # The product reads with the sentence reader: on this split it scores otherwise than
    # the bag-of-words reader alone for the settings without the situations.
    assert cross_validation["product"] != cross_validation["bag_of_words"]
    chosen = cross_validation["chosen"]
    for reader, table in (("sentence", cross_validation["sentence"]), ("text", cross_validation["product"])):
        assert table[chosen[reader]]["accuracy_32"] == max(score["accuracy_32"] for score in table.values())
        assert report[reader]["settings"] == chosen[reader]
        assert report[reader]["fitted_on"] == (80 if "with situations" in chosen[reader] else 40)
        assert report[reader]["train_examples"] == 40
    assert report["sentence"]["situations"] == 40
    assert 0.0 <= report["sentence"]["accuracy_32"] <= 1.0
    assert 0.0 <= report["sentence"]["with_bag_of_words_accuracy_7"] <= 1.0
    saved = load_text_readers(out)
    assert [reader.name for reader in saved] == ["text", "sentence"]
    assert saved[0].model.l2 == float(chosen["text"].split(",")[0].removeprefix("l2 "))
    # Only the situations say "it was": the saved reader knows the bigram exactly when it
    # was fitted on them.
    assert ("it was" in saved[0].model.vocabulary) == ("with situations" in chosen["text"])


def test_the_recipe_names_what_a_reader_needs(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "empatheia.recipes.fit_emotion_readers", "--ed-train", "a.jsonl", "--ed-eval",
         "b.jsonl", "--out", str(tmp_path), "--readers", "prosody"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2 and "--readers prosody needs --rendered" in result.stderr
