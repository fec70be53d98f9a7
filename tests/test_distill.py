"""empatheia.data.distill: a model's replies, its chain held to the data's emotion, as
targets; ``empatheia data distill``; the targets without the replies that echo the
listener (``empatheia data drop-echoes``); the recipe's ``--stage1-data``."""

import json
from pathlib import Path

import pytest
import torch

from empatheia import Empatheia
from empatheia.config import EmpatheiaConfig
from empatheia.data.distill import distill_examples, distill_replies, drop_listener_echoes
from empatheia.data.readers import read_dataset
from empatheia.errors import DataError
from empatheia.logits_processors import emotion_step_tokens
from empatheia.modeling import GeneratedText
from empatheia.prompts import PromptMode, chain_is_complete

CONVERSATIONS = [
    {"conv_id": "hit:1_conv:1", "situation": "I won a prize in the school raffle.", "emotion": "joyful",
     "utterances": ["I won the raffle today!", "No way, congratulations!", "I never win anything.", "Lucky you!"]},
    {"conv_id": "hit:2_conv:4", "situation": "My grandmother passed away.", "emotion": "devastated",
     "utterances": ["My grandmother died last night.", "I am so sorry. Were you close?"]},
]
LABELS = ["joyful", "devastated", "sad"]


def _write(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _tiny(**overrides) -> Empatheia:
    config = EmpatheiaConfig.from_preset("tiny", {"language_model.chain_emotions": LABELS,
                                                  "language_model.choose_chain_emotion": True, **overrides})
    return Empatheia(config).eval()


def test_the_given_emotion_prior_leaves_only_the_given_label():
    model = _tiny()
    prior = torch.tensor([[0.1, 0.2, 0.3], [-1.0, -2.0, -3.0]])
    scores = model.given_emotion_prior(["Sad", None], prior)
    assert scores[0].tolist() == [float("-inf"), float("-inf"), 0.0]  # labels are matched as normalised
    assert torch.equal(scores[1], prior[1])  # None: the reading stands
    assert torch.equal(model.given_emotion_prior([None], None), torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"'proud' is not one of language_model.chain_emotions \(joyful, devastated, sad\)"):
        model.given_emotion_prior(["proud"], None)
    with pytest.raises(ValueError, match="2 given emotions for 1 dialogues"):
        model.given_emotion_prior(["sad", "sad"], prior[:1])
    with pytest.raises(ValueError, match="choose_chain_emotion"):
        Empatheia(EmpatheiaConfig.from_preset("tiny")).given_emotion_prior(["sad"], None)


@torch.no_grad()
def test_given_emotions_make_the_chain_write_them_whatever_the_model_reads(tmp_path, monkeypatch):
    model = _tiny().merge_adapter()
    items = distill_examples(_write(tmp_path / "ed.jsonl", CONVERSATIONS))[:1]
    free = model.generate_text(items, PromptMode.FULL, 12)
    # Random weights never write the emotion step's lead-in: let the third token the row
    # wrote stand for it, so the choice falls right after its first occurrence.
    lead = int(free.sequences[0, 2])
    _, spellings = emotion_step_tokens(model.tokenizer, LABELS)
    monkeypatch.setattr("empatheia.modeling.emotion_step_tokens", lambda tokenizer, names: ([lead], spellings))
    chosen = model.generate_text(items, PromptMode.FULL, 12, score_steps=12)
    row = chosen.sequences[0].tolist()
    at = row.index(lead) + 1
    firsts = torch.tensor([s[0] for s in spellings])
    likeliest = int(chosen.scores[at][0][firsts].argmax())
    for given in range(len(LABELS)):
        if given == likeliest:
            continue
        held = model.generate_text(items, PromptMode.FULL, 12, given_emotions=[LABELS[given]]).sequences[0].tolist()
        assert held[:at] == row[:at]  # nothing before the step changed
        assert held[at:at + len(spellings[given])] == spellings[given]


def _fake_generate(replies, seen):
    """``generate_text`` writing ``replies`` in turn (each as a chain and a response line),
    recording the emotions it was given."""
    queue = list(replies)

    def generate(items, mode, max_new_tokens=None, reserve_signals=True, given_emotions=None, **kwargs):
        assert max_new_tokens == 40  # as distill_replies was told
        seen.extend(given_emotions)
        texts = [queue.pop(0) for _ in items]
        return GeneratedText([], None, None, texts, None, None, None)

    return generate


def _line(reply: str) -> str:
    return ("Firstly, the event scenario of this conversation is: a raffle\n"
            f"Secondly, the emotion of the speaker is: joyful\nFinally, the response is: {reply}")


def test_distilling_writes_the_models_replies_as_targets_and_resumes(tmp_path, monkeypatch):
    source = _write(tmp_path / "ed.jsonl", CONVERSATIONS)
    dialogues = distill_examples(source)
    assert [d.id for d in dialogues] == ["hit:1_conv:1/1", "hit:1_conv:1/3", "hit:2_conv:4/1"]
    model, seen = _tiny(), []
    monkeypatch.setattr(model, "generate_text",
                        _fake_generate([_line("How exciting!"), "no response line at all", _line("Oh no.")], seen))
    out = tmp_path / "distilled.jsonl"
    report = distill_replies(model, dialogues[:2], out, batch_size=1, max_new_tokens=40, progress=False)
    assert seen == ["joyful", "joyful"]  # the chain held to each example's label
    assert (report.examples, report.written, report.kept_reference) == (2, 2, ["hit:1_conv:1/3"])
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["response"], r["reference"], r["source"]) for r in lines] == [
        ("How exciting!", "No way, congratulations!", "model"),
        ("Lucky you!", "Lucky you!", "reference"),  # unparsed text is no reply: nothing made up
    ]
    assert lines[0]["model_chain"] == {"event_scenario": "a raffle", "speaker_emotion": "joyful"}
    assert [r["emotion_held"] for r in lines] == [True, False]  # the unparsed text named no emotion
    # A run killed mid-line leaves half a line: the resumed run cuts it and goes on.
    with open(out, "a") as handle:
        handle.write('{"conv_id": "hit:2_conv:4", "cont')
    seen.clear()
    report = distill_replies(model, dialogues, out, batch_size=2, max_new_tokens=40, progress=False)
    assert (report.examples, report.written, seen) == (3, 1, ["devastated"])
    # The fake chain names "joyful" for the grieving speaker: not the emotion it was given.
    assert report.not_held == ["hit:2_conv:4/1"]
    # The file reads back as EmpatheticDialogues responses with the example ids, the model's
    # replies as the responses, and the four chain steps built from them.
    corpus = read_dataset(out)
    assert corpus.format == "ed-responses"
    assert [(d.id, d.response, d.emotion) for d in corpus] == [
        ("hit:1_conv:1/1", "How exciting!", "joyful"), ("hit:1_conv:1/3", "Lucky you!", "joyful"),
        ("hit:2_conv:4/1", "Oh no.", "devastated")]
    assert all(chain_is_complete(d.chain) for d in corpus)
    assert corpus[0].chain.goal_to_response == "Sharing the speaker's enthusiasm."
    assert corpus[2].chain.goal_to_response == "Expressing sympathy."


def test_distilling_refuses_files_it_cannot_write_back(tmp_path):
    avamerg = Path(__file__).resolve().parents[1] / "examples" / "dialogues.json"
    with pytest.raises(DataError, match="is avamerg; distilling writes EmpatheticDialogues lines"):
        distill_examples(avamerg)
    two_speakers = {**CONVERSATIONS[1], "utterances": ["Hi.", "Are you there?", "Yes."],
                    "roles": ["speaker", "speaker", "listener"]}
    with pytest.raises(DataError, match=r"two.jsonl, record hit:2_conv:4/2, field 'roles': its turns do not alternate"):
        distill_examples(_write(tmp_path / "two.jsonl", [two_speakers]))
    out = _write(tmp_path / "other.jsonl", [{"something": "else"}])
    with pytest.raises(DataError, match=r"other.jsonl.*line 1.*not a line this command wrote"):
        distill_replies(_tiny(), distill_examples(_write(tmp_path / "ed.jsonl", CONVERSATIONS)), out, progress=False)


def test_the_distill_command_writes_limit_lines_and_reports_them(tmp_path, capsys):
    from empatheia.cli import main

    source = _write(tmp_path / "ed.jsonl", CONVERSATIONS)
    out = tmp_path / "distilled.jsonl"
    main(["data", "distill", str(source), "--out", str(out), "--limit", "2", "--preset", "tiny",
          "--set", f"language_model.chain_emotions={json.dumps(LABELS)}", "language_model.choose_chain_emotion=true",
          "--max-new-tokens", "6"])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (summary["examples"], summary["written"]) == (2, 2)
    assert len(out.read_text().splitlines()) == 2
    with pytest.raises(SystemExit, match=r"error: .*nothing\.jsonl"):
        main(["data", "distill", str(tmp_path / "nothing.jsonl"), "--out", str(out), "--preset", "tiny"])


RESPONSE_LINES = [
    # A first turn: no listener turn to echo.
    {"conv_id": "hit:1_conv:1", "context": ["I won the raffle today!"], "response": "No way, congratulations!",
     "emotion": "joyful", "situation": "I won a prize at the café."},
    # Asks again what the listener asked one turn before ("were you close to her").
    {"conv_id": "hit:2_conv:4", "context": ["My grandmother died.", "I am so sorry. Were you close to her?",
                                            "We were."], "response": "Oh no. Were you close to her?",
     "emotion": "devastated", "situation": "My grandmother passed away."},
    # Shares three words with the listener's turn, not four.
    {"conv_id": "hit:3_conv:6", "context": ["I lost my keys.", "Oh no, where did you last see them?",
                                            "At the gym, I think."], "response": "Where did you go after the gym?",
     "emotion": "sad", "situation": "Keys lost."},
]


def test_drop_echoes_leaves_out_the_replies_that_repeat_the_listener_and_copies_the_rest(tmp_path):
    source = tmp_path / "distilled.jsonl"
    # Keys in another order and unicode kept as written: the kept lines are copied as they are.
    raw = [json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in RESPONSE_LINES]
    source.write_text("".join(raw) + "\n", encoding="utf-8")
    report = drop_listener_echoes(source, tmp_path / "kept.jsonl")
    assert (report.kept, report.dropped, report.with_listener_turn) == (2, ["hit:2_conv:4/3"], 2)
    assert (tmp_path / "kept.jsonl").read_text(encoding="utf-8") == raw[0] + raw[2]
    # Three shared words echo when the run is three.
    assert drop_listener_echoes(source, tmp_path / "kept3.jsonl", words=3).dropped == ["hit:2_conv:4/3", "hit:3_conv:6/3"]


def test_drop_echoes_names_what_it_cannot_filter(tmp_path, capsys):
    from empatheia.cli import main

    source = _write(tmp_path / "distilled.jsonl", RESPONSE_LINES)
    with pytest.raises(DataError, match="is also the input"):
        drop_listener_echoes(source, source)
    conversations = _write(tmp_path / "ed.jsonl", CONVERSATIONS)
    with pytest.raises(DataError, match="is ed-conversations; only ed-responses lines"):
        drop_listener_echoes(conversations, tmp_path / "out.jsonl")
    bad = _write(tmp_path / "bad.jsonl", [RESPONSE_LINES[0], {**RESPONSE_LINES[1], "context": "not a list"}])
    with pytest.raises(SystemExit, match=r"error: .*bad\.jsonl.*context"):
        main(["data", "drop-echoes", str(bad), "--out", str(tmp_path / "out.jsonl")])
    assert not (tmp_path / "out.jsonl").exists()
    main(["data", "drop-echoes", str(source), "--out", str(tmp_path / "out.jsonl")])
    summary = json.loads(capsys.readouterr().out)
    assert summary == {"file": str(tmp_path / "out.jsonl"), "kept": 2, "dropped": 1, "with_listener_turn": 2,
                       "dropped_ids": ["hit:2_conv:4/3"]}


def test_the_recipe_trains_stage_1_on_the_given_file(tmp_path, monkeypatch):
    from empatheia.recipes import small_preset

    source = _write(tmp_path / "ed.jsonl", CONVERSATIONS)
    distilled = _write(tmp_path / "distilled.jsonl", [])
    trained = []
    monkeypatch.setattr(small_preset, "run_stage",
                        lambda stage, out, data, steps, **kwargs: trained.append((stage, data)) or out / "stage1_coe")
    small_preset.main(["--ed", str(source), "--out", str(tmp_path / "run"), "--preset", "tiny", "--stages", "1",
                       "--stage1-data", str(distilled), "--in-process"])
    assert trained == [(1, distilled)]
    with pytest.raises(SystemExit):
        small_preset.main(["--ed", str(source), "--out", str(tmp_path / "run"), "--preset", "tiny", "--stages", "1",
                           "--stage1-data", str(tmp_path / "missing.jsonl")])
