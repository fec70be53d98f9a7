"""The chain's emotion fused with a text emotion reader (``language_model.chain_emotion_reader``):
the choice processor's arithmetic, the config's checks, generation on the tiny preset,
where the chosen label and the reported distribution are the product of the language
model's reading and the reader's, and the bench that fuses a run's recorded readings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from empatheia import Dialogue, Empatheia, EmpatheiaConfig, Turn
from empatheia.logits_processors import ChainEmotionChoice, emotion_step_tokens, fused_label_scores
from empatheia.prompts import PromptMode
from empatheia.variants.readers import TextEmotionReader

LABELS = ["sad", "happy", "apprehensive"]


def test_the_prior_is_added_to_the_labels_log_probabilities():
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    prior = torch.tensor([[0.0, 1.5, 0.0], [-1.0, 0.0, -1.0]])
    fused = fused_label_scores(logits, prior)
    assert torch.allclose(fused, logits.log_softmax(1) + prior)
    assert torch.equal(fused_label_scores(logits, None), logits.log_softmax(1))
    # Softmax of the fused scores = the two distributions multiplied and renormalised.
    product = logits.softmax(1) * prior.exp()
    assert torch.allclose(fused.softmax(1), product / product.sum(1, keepdim=True))


def test_the_choice_follows_the_fused_scores():
    # Lead-in 1 2; labels spelled [10], [11, 12] and [13]; both rows just wrote the lead-in.
    ids = torch.tensor([[4, 1, 2], [4, 1, 2]])
    scores = torch.zeros(2, 20)
    scores[:, 10], scores[:, 11], scores[:, 13] = 2.0, 1.0, 0.0
    alone = ChainEmotionChoice([1, 2], [[10], [11, 12], [13]])(ids, scores.clone())
    assert alone.argmax(1).tolist() == [10, 10]
    prior = torch.tensor([[0.0, 0.0, 0.0], [-5.0, 0.0, -5.0]])  # the second row's reader says label 1
    fused = ChainEmotionChoice([1, 2], [[10], [11, 12], [13]], prior)(ids, scores.clone())
    assert fused.argmax(1).tolist() == [10, 11]
    with pytest.raises(ValueError, match=r"prior must be \(B, 3\)"):
        ChainEmotionChoice([1, 2], [[10], [11, 12], [13]], torch.zeros(2, 4))


def test_config_checks_the_reader_settings():
    with pytest.raises(ValueError, match="chain_emotion_reader needs language_model.chain_emotions"):
        EmpatheiaConfig.from_preset("tiny", {"language_model.chain_emotion_reader": "/some/reader"})
    with pytest.raises(ValueError, match="chain_emotion_reader_weight must be 0 or more"):
        EmpatheiaConfig.from_preset("tiny", {"language_model.chain_emotion_reader_weight": -1.0})


def _reader(tmp_path, labels=LABELS):
    """A reader fitted so that "rain" reads as the first label, "party" the second and
    "exam" the third."""
    words = ["rain", "party", "exam"]
    texts = [f"{words[i]} today {n}" for i in range(len(labels)) for n in range(4)]
    reader = TextEmotionReader.fit(texts, [labels[i] for i in range(len(labels)) for _ in range(4)], min_count=1)
    return reader.save(tmp_path / "reader")


def _dialogue(speaker: str) -> Dialogue:
    return Dialogue([Turn("speaker", speaker), Turn("listener", "Oh?"), Turn("speaker", "yes")], id=speaker)


def _tiny(reader, weight):
    config = EmpatheiaConfig.from_preset("tiny", {
        "language_model.chain_emotions": LABELS,
        "language_model.choose_chain_emotion": True,
        "language_model.chain_emotion_reader": str(reader),
        "language_model.chain_emotion_reader_weight": weight,
    })
    return Empatheia(config).eval().merge_adapter()


def test_the_prior_is_the_readers_log_probabilities_times_the_weight(tmp_path):
    reader = _reader(tmp_path)
    model = _tiny(reader, 2.0)
    items = [_dialogue("rain today"), _dialogue("party today"), Dialogue([Turn("speaker", "", audio=np.zeros(1600, np.float32), sample_rate=16000)], id="voice only")]
    prior = model.chain_emotion_prior(items)
    read = TextEmotionReader.load(reader).fine_probabilities(["rain today yes", "party today yes"])
    columns = [TextEmotionReader.load(reader).labels.index(label) for label in LABELS]
    assert torch.allclose(prior[:2], 2.0 * read[:, columns].log(), atol=1e-5)
    assert prior[:2].argmax(1).tolist() == [0, 1]
    assert torch.equal(prior[2], torch.zeros(3))  # the speaker said nothing: no say
    assert _tiny(reader, 0.0).chain_emotion_prior(items) is None


def test_a_reader_without_the_chains_labels_is_an_error_naming_them(tmp_path):
    reader = _reader(tmp_path, ["sad", "happy", "afraid"])
    with pytest.raises(ValueError, match=r"lack \[.apprehensive.\]"):
        _tiny(reader, 1.0).chain_emotion_prior([_dialogue("rain")])


@torch.no_grad()
def test_generation_writes_and_reports_the_fused_emotion(tmp_path, monkeypatch):
    """With a heavy reader weight the chain writes the label the reader reads, and the
    response's ``chain_emotion`` is the fused distribution with that label on top."""
    reader = _reader(tmp_path)
    model = _tiny(reader, 50.0)
    items = [_dialogue("rain today"), _dialogue("party today"), _dialogue("exam today")]
    free = model.generate_text(items, PromptMode.FULL, 8)
    # Random weights never write the emotion step's lead-in: let the first token the rows
    # wrote stand for it, so the choice falls at the second.
    lead = int(free.sequences[0, 0])
    _, spellings = emotion_step_tokens(model.tokenizer, LABELS)
    monkeypatch.setattr("empatheia.modeling.emotion_step_tokens", lambda tokenizer, names: ([lead], spellings))
    chosen = model.generate_text(items, PromptMode.FULL, 8, score_steps=8)
    assert chosen.chain_emotion_prior.shape == (3, 3)
    firsts = torch.tensor([s[0] for s in spellings])
    tokens = chosen.sequences[0].tolist()
    at = tokens.index(lead) + 1
    assert tokens[:at] == free.sequences[0, :at].tolist()  # nothing before the lead-in changed
    assert tokens[at : at + len(spellings[0])] == spellings[0]  # "rain": the reader's label
    assert int(fused_label_scores(chosen.scores[at][:1, firsts], chosen.chain_emotion_prior[:1]).argmax()) == 0
    # Every row by its own reading, whatever the language model's scores say.
    scores = torch.randn(3, len(model.tokenizer), generator=torch.Generator().manual_seed(0))
    scores[:, firsts] = torch.tensor([3.0, 2.0, 1.0])  # the language model prefers "sad" everywhere
    for processor in model._decoding_processors(PromptMode.FULL, None, chosen.chain_emotion_prior):
        scores = processor(torch.tensor([[lead]] * 3), scores)
    assert scores.argmax(1).tolist() == firsts.tolist()
    # Reported: the same product, at the step the chain wrote it.
    logits = torch.randn(3, len(model.tokenizer))
    reported = model.label_predictions(logits, chosen.chain_emotion_prior)
    assert [p.label for p in reported] == ["sad", "happy", "apprehensive"]
    fused = fused_label_scores(logits[:, model._chain_emotion_ids], chosen.chain_emotion_prior).softmax(1)
    assert reported[1].probabilities["happy"] == pytest.approx(float(fused[1, 1]), abs=1e-6)


def test_the_fusion_bench_scores_the_core_alone_and_the_reader_heavy(tmp_path, capsys, monkeypatch):
    """bench/chain_emotion_fusion.py on three dialogues: the core reads all three as "sad"
    (right once); weighted heavily, the reader's reading (right on all three) decides."""
    import json

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "bench"))
    from chain_emotion_fusion import main

    reader = _reader(tmp_path)
    words = {"sad": "rain", "happy": "party", "apprehensive": "exam"}
    data = tmp_path / "ed.jsonl"
    data.write_text("".join(json.dumps({"conv_id": f"c{i}", "situation": "-", "emotion": label,
                                        "utterances": [f"{words[label]} today", "Oh?"]}) + "\n"
                            for i, label in enumerate(LABELS)))
    core = {"sad": 0.6, "happy": 0.3, "apprehensive": 0.1}
    predictions = tmp_path / "predictions.jsonl"
    predictions.write_text("".join(json.dumps({"id": f"c{i}/1", "text": "Oh.", "emotion": "sad",
                                               "chain_emotion_probabilities": core}) + "\n" for i in range(3)))
    main(["--data", str(data), "--predictions", str(predictions), "--reader", str(reader), "--weights", "0", "50"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert rows == [["0", "0.3333", "0.3333"], ["50", "1.0000", "1.0000"]]


@torch.no_grad()
def test_the_emotion_read_from_the_speakers_words_is_what_the_chain_writes(tmp_path, monkeypatch):
    """``chain_emotion_context: speaker``: the emotion is read at the emotion step of a
    chain whose event step is the speaker's first turn, in one teacher-forced pass, and the
    chain writes that label."""
    from empatheia.modeling import _to
    from empatheia.processing import Target
    from empatheia.prompts import ChainOfEmpathy

    reader = _reader(tmp_path)
    model = _tiny(reader, 1.0)
    model.config.language_model.chain_emotion_context = "speaker"
    items = [_dialogue("rain today"), _dialogue("party today")]
    prompts = [model.processor.encode(d, PromptMode.FULL) for d in items]
    media = (None, None)
    prior = model.chain_emotion_prior(items)
    reading = model.speaker_emotion_reading(items, prompts, media, prior)
    assert reading.shape == (2, 3) and bool(torch.isfinite(reading).all())
    # The same as reading the chain with that event step written out by hand.
    chains = [ChainOfEmpathy(event_scenario=d.turns[0].text, speaker_emotion=LABELS[0]) for d in items]
    batch = _to(model.processor.collate([model.processor.encode(d, PromptMode.FULL, Target(chain=c, eos=False))
                                         for d, c in zip(items, chains)]), model.device)
    by_hand = model.chain_emotion_scores(model.hidden_states(batch, media=media), batch["emotion_slot"], prior)
    assert torch.allclose(reading, by_hand, atol=1e-5)
    # Generation takes that label whatever the core reads after its own event step.
    free = model.generate_text(items, PromptMode.FULL, 8)
    lead = int(free.sequences[0, 0])
    _, spellings = emotion_step_tokens(model.tokenizer, LABELS)
    monkeypatch.setattr("empatheia.modeling.emotion_step_tokens", lambda tokenizer, names: ([lead], spellings))
    written = model.generate_text(items, PromptMode.FULL, 8)
    assert torch.allclose(written.chain_emotion_reading, reading, atol=1e-5)
    for row, label in enumerate(reading.argmax(1).tolist()):
        tokens = written.sequences[row].tolist()
        at = tokens.index(lead) + 1
        assert tokens[at:at + len(spellings[label])] == spellings[label]
    # Given emotions (distillation) still win, and the chain's own reading is the default.
    given = model.generate_text(items, PromptMode.FULL, 8, given_emotions=["sad", "sad"])
    assert given.chain_emotion_reading is None
    model.config.language_model.chain_emotion_context = "chain"
    assert model.generate_text(items, PromptMode.FULL, 8).chain_emotion_reading is None


def test_the_speaker_context_needs_the_emotion_choice():
    with pytest.raises(ValueError, match="chain_emotion_context 'speaker' needs language_model.choose_chain_emotion"):
        EmpatheiaConfig.from_preset("tiny", {"language_model.chain_emotion_context": "speaker"})
    with pytest.raises(ValueError, match="must be 'chain' or 'speaker'"):
        EmpatheiaConfig.from_preset("tiny", {"language_model.chain_emotion_context": "event"})


@torch.no_grad()
def test_the_response_reports_the_reading_from_the_speakers_words(tmp_path, monkeypatch):
    """The label the chain wrote is reported with the distribution it was chosen by, not
    the core's reading after its own event step."""
    from empatheia.prompts import ChainOfEmpathy

    # The core alone (no readers of words), so the two contexts' readings differ.
    model = _tiny(_reader(tmp_path), 0.0)
    model.config.language_model.chain_emotion_context = "speaker"
    item = _dialogue("rain today")
    # Random weights write no chain: parse every answer as one whose emotion step says "happy".
    monkeypatch.setattr("empatheia.modeling.parse_chain",
                        lambda text: (ChainOfEmpathy(event_scenario="It rained.", speaker_emotion="happy"), "Oh."))
    response = model.respond(item, max_new_tokens=4)
    prompt = model.processor.encode(item, PromptMode.FULL)
    reading = model.speaker_emotion_reading([item], [prompt], (None, None), model.chain_emotion_prior([item]))
    expected = reading.softmax(1)[0]
    assert response.chain_emotion.label == LABELS[int(expected.argmax())]
    for label, probability in zip(LABELS, expected.tolist()):
        assert response.chain_emotion.probabilities[label] == pytest.approx(probability, abs=1e-4)
    # Whatever the reading says is what is reported, not the core's reading after the
    # chain's own event step (which random weights make near uniform).
    chosen = torch.tensor([[0.1, 0.7, 0.2]]).log()
    monkeypatch.setattr(Empatheia, "speaker_emotion_reading", lambda self, *args: chosen.clone())
    reported = model.respond(item, max_new_tokens=4).chain_emotion
    assert reported.label == LABELS[1]
    assert [reported.probabilities[label] for label in LABELS] == pytest.approx([0.1, 0.7, 0.2], abs=1e-5)
    model.config.language_model.chain_emotion_context = "chain"
    own = model.respond(item, max_new_tokens=4).chain_emotion.probabilities
    assert max(own.values()) < 0.6
