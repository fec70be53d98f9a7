"""The reply does not repeat the listener's own earlier turns: the n-grams of a turn as a
reply spells them (``turn_ngrams``), the processor that blocks them in the reply
(``ListenerEchoBlock``) and its wiring (``language_model.no_repeat_listener_ngram_size``)."""

import pytest
import torch

from empatheia import Dialogue, Empatheia, Turn
from empatheia.config import EmpatheiaConfig
from empatheia.logits_processors import ListenerEchoBlock, ReplyRestart, reply_markers, turn_ngrams
from empatheia.prompts import PromptMode

MARKER = 9


def _blocked(processor, ids, vocab=20):
    scores = processor(torch.tensor(ids), torch.zeros(len(ids), vocab))
    return [torch.nonzero(row == float("-inf")).flatten().tolist() for row in scores]


def test_a_token_that_would_complete_a_listener_ngram_is_blocked_in_that_rows_reply():
    block = ListenerEchoBlock([[MARKER]], [torch.tensor([[1, 2, 3], [1, 2, 4]]), torch.zeros(0, 3, dtype=torch.long)])
    # Row 0 said "1 2 3" and "1 2 4" before; row 1 said nothing.
    assert _blocked(block, [[5, MARKER, 1, 2], [5, MARKER, 1, 2]]) == [[3, 4], []]
    assert _blocked(block, [[5, MARKER, 7, 2], [5, MARKER, 1, 2]]) == [[], []]  # another prefix
    # Before the reply (the chain, or a row that never writes the lead-in), nothing is blocked.
    assert _blocked(block, [[5, 6, 1, 2], [5, 6, 1, 2]]) == [[], []]
    # The tokens the next one follows must all be the reply's: the lead-in is not.
    marker_gram = ListenerEchoBlock([[MARKER]], [torch.tensor([[MARKER, 2, 3]])])
    assert _blocked(marker_gram, [[5, MARKER, 2]]) == [[]]
    # The end of text and the signal tokens stay open, so the row can always stop.
    protected = ListenerEchoBlock([[MARKER]], [torch.tensor([[1, 2, 3]])], protected=[3])
    assert _blocked(protected, [[MARKER, 1, 2]]) == [[]]


def test_rows_must_match_and_the_ngrams_have_one_length_of_at_least_two():
    block = ListenerEchoBlock([[MARKER]], [torch.tensor([[1, 2]])])
    with pytest.raises(ValueError, match="n-grams for 1 rows, got 2"):
        block(torch.tensor([[MARKER, 1], [MARKER, 1]]), torch.zeros(2, 20))
    with pytest.raises(ValueError, match="one length of at least 2"):
        ListenerEchoBlock([[MARKER]], [torch.tensor([[1, 2]]), torch.tensor([[1, 2, 3]])])
    with pytest.raises(ValueError, match="one length of at least 2"):
        ListenerEchoBlock([[MARKER]], [torch.tensor([[1]])])
    # Nobody said anything: every score passes.
    empty = ListenerEchoBlock([[MARKER]], [torch.zeros(0, 4, dtype=torch.long)])
    assert _blocked(empty, [[MARKER, 1, 2, 3]]) == [[]]


@pytest.fixture(scope="module")
def tiny():
    return Empatheia(EmpatheiaConfig.from_preset("tiny", {"language_model.no_repeat_listener_ngram_size": 3})).eval()


def test_turn_ngrams_hold_a_sentence_as_a_reply_spells_it_first_or_later(tiny):
    tokenizer = tiny.tokenizer

    def trigrams(text):
        ids = tokenizer.encode(text, add_special_tokens=False)
        return {tuple(ids[i:i + 3]) for i in range(len(ids) - 2)}

    grams = {tuple(g) for g in turn_ngrams(tokenizer, ["That's awful. How are you holding up?"], 3).tolist()}
    # The turn's second sentence as a reply opens with it and as one after another sentence.
    assert trigrams("How are you holding up?") <= grams
    assert trigrams(" How are you holding up?") <= grams
    assert trigrams("Oh no. How are you holding up?") & grams
    assert turn_ngrams(tokenizer, [], 3).shape == (0, 3)
    assert turn_ngrams(tokenizer, ["Hi"], 40).shape == (0, 40)


def test_the_model_blocks_in_the_reply_what_its_listener_said_in_the_kept_turns(tiny):
    dialogue = Dialogue([Turn("speaker", "I lost my job last week."),
                         Turn("listener", "That's awful. How are you holding up?"),
                         Turn("speaker", "Not great.")])
    alone = Dialogue([Turn("speaker", "Not great.")])
    items = [dialogue, alone]
    prompts = [tiny.processor.encode(d, PromptMode.FULL) for d in items]
    block = next(p for p in tiny._decoding_processors(PromptMode.FULL, None, None, prompts, items)
                 if isinstance(p, ListenerEchoBlock))
    tokenizer = tiny.tokenizer
    lead = reply_markers(tokenizer, PromptMode.FULL)[-1]
    said = tokenizer.encode(" How are you holding up?", add_special_tokens=False)
    ids = torch.tensor([lead + said[:2]] * 2)
    scores = block(ids, torch.zeros(2, tiny._hf_model().get_output_embeddings().weight.shape[0]))
    assert scores[0, said[2]] == float("-inf") and scores[1, said[2]] == 0  # only the row whose listener said it
    # A turn the prompt left out (first_turn) is not the listener's to repeat.
    later = tiny.processor.encode(dialogue, PromptMode.FULL, first_turn=2)
    grams = tiny._listener_ngrams([dialogue], [later])
    assert grams[0].shape == (0, 3)
    # Off by default; 1 would block every word the listener ever used.
    plain = Empatheia(EmpatheiaConfig.from_preset("tiny")).eval()
    assert not any(isinstance(p, ListenerEchoBlock) for p in plain._decoding_processors(PromptMode.FULL, None, None,
                                                                                           prompts, items))
    for bad in (1, -1, True, 2.0):
        with pytest.raises(ValueError, match="no_repeat_listener_ngram_size must be"):
            EmpatheiaConfig.from_preset("tiny", {"language_model.no_repeat_listener_ngram_size": bad})



def test_listener_echo_start_finds_where_the_first_shared_run_of_words_begins():
    from empatheia.evaluation.text import echoes_listener, listener_echo_start

    said = ["That's wonderful. How long have you guys been dating?"]
    assert listener_echo_start(said, "Wow. How long have you been together?") == 5
    # Case and punctuation do not count; the run may cross a sentence's end.
    assert listener_echo_start(said, "THAT'S WONDERFUL!  how long") == 0
    assert listener_echo_start(said, "That's wonderful. How nice.") is None  # 3 words only
    assert listener_echo_start([], "That's wonderful. How long have you") is None
    assert echoes_listener([said[0], "Five months."], ["listener", "speaker"], "So how long have you been?") is True


def _restart_processor_scores(processor, ids, vocab=12):
    return processor(torch.tensor(ids), torch.zeros(len(ids), vocab))


def test_reply_restart_holds_a_row_to_its_tokens_then_refuses_the_copys_first_token():
    restart = ReplyRestart([torch.tensor([4, 5]), None, torch.tensor([], dtype=torch.long)],
                           [torch.tensor([7, 8]), None, torch.tensor([3])])
    # Step 0: row 0 may only write 4; row 1 is free; row 2 restarts at once (3 refused).
    scores = _restart_processor_scores(restart, [[], [], []])
    assert torch.isfinite(scores[0]).nonzero().flatten().tolist() == [4]
    assert torch.isfinite(scores[1]).all()
    assert torch.isinf(scores[2]).nonzero().flatten().tolist() == [3]
    # Step 2: row 0 has written its tokens and may not write 7 or 8; row 2 is free again.
    scores = _restart_processor_scores(restart, [[4, 5], [1, 1], [9, 9]])
    assert torch.isinf(scores[0]).nonzero().flatten().tolist() == [7, 8]
    assert torch.isfinite(scores[1:]).all()
    with pytest.raises(ValueError, match="holds 3 rows, got 2"):
        _restart_processor_scores(restart, [[], []])
    with pytest.raises(ValueError, match="one banned set per forced row"):
        ReplyRestart([None], [])


def test_a_restart_in_generate_holds_the_tokens_and_takes_another_one_after_them(tiny):
    dialogue = Dialogue([Turn("speaker", "I lost my job last week.")])
    first = tiny.generate_text([dialogue], PromptMode.FULL, max_new_tokens=24, reserve_signals=False)
    written = first.sequences[0].tolist()
    held, refused = torch.tensor(written[:10]), written[10]
    again = tiny.generate_text([dialogue], PromptMode.FULL, max_new_tokens=24, reserve_signals=False,
                               restart=ReplyRestart([held], [torch.tensor([refused])]))
    assert again.sequences[0, :10].tolist() == written[:10]
    assert again.sequences[0, 10].item() != refused


def _row(tokenizer, reply):
    """Generated ids of a chain's end, the reply's lead-in and ``reply``."""
    return [5, 6] + reply_markers(tokenizer, PromptMode.FULL)[-1] + tokenizer.encode(reply, add_special_tokens=False)


def test_echoing_answers_are_written_again_from_the_copy_until_they_stop_or_the_tries_run_out(tiny):
    from empatheia.modeling import GeneratedText

    tokenizer = tiny.tokenizer
    asked = "How long have you been dating?"
    echoing = Dialogue([Turn("speaker", "My girlfriend said yes."), Turn("listener", "Wow! " + asked),
                        Turn("speaker", "Five months.")])
    first_turn = Dialogue([Turn("speaker", "How long have you been dating?")])  # nothing to echo
    items = [echoing, first_turn, echoing]
    prompts = [tiny.processor.encode(d, PromptMode.FULL) for d in items]
    replies = ["That's great. " + asked, " How long have you been dating?", "Nice."]
    rows = [_row(tokenizer, r) for r in replies]
    width = max(map(len, rows))
    pad = tiny.token_ids.pad
    sequences = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    start = len(_row(tokenizer, ""))
    seen = []

    def again(which, processor):
        seen.append((which, processor.forced.clone(), processor.lengths.clone(), processor.banned.clone()))
        if len(seen) == 1:  # the copy again from the same point, in lower case
            at = int(processor.lengths[0])
            lower = tokenizer.convert_tokens_to_ids(tokenizer.convert_ids_to_tokens(rows[0][at]).lower())
            row = rows[0][:at] + [lower] + rows[0][at + 1:]
        else:
            row = _row(tokenizer, "That's great. Congratulations!")
        return GeneratedText(None, (None, None), torch.tensor([row]), [tokenizer.decode(row)])

    tiny.config.language_model.listener_echo_restarts = 3
    try:
        out, texts = tiny._restart_listener_echoes(items, PromptMode.FULL, prompts, sequences, list(replies), again)
    finally:
        tiny.config.language_model.listener_echo_restarts = 0
    # Only the row whose answer copies its listener's turn is written again; twice, since
    # the first try copied from the same point, which then refuses both tokens tried there;
    # the second try copies nothing and stays.
    assert [w for w, *_ in seen] == [[0], [0]]
    # Held to the tokens before the copy's first word, that word's first token refused.
    copy_at = int(seen[0][2][0])
    assert seen[0][1][0, :copy_at].tolist() == rows[0][:copy_at]
    assert tokenizer.decode(rows[0][start:copy_at]).strip() == "That's great."
    how = rows[0][copy_at]
    assert tokenizer.decode([how]).strip().startswith("H") and seen[0][3][0].tolist() == [how]
    lower = tokenizer.convert_tokens_to_ids(tokenizer.convert_ids_to_tokens(how).lower())
    assert lower != how and lower != tokenizer.unk_token_id
    assert seen[1][2].tolist() == [copy_at] and set(seen[1][3][0].tolist()) == {how, lower}
    assert texts[1:] == replies[1:] and texts[0].endswith("That's great. Congratulations!")
    last = _row(tokenizer, "That's great. Congratulations!")
    assert out[0, :len(last)].tolist() == last
    assert out[1, :len(rows[1])].tolist() == rows[1] and out[2, :len(rows[2])].tolist() == rows[2]
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="listener_echo_restarts must be"):
            EmpatheiaConfig.from_preset("tiny", {"language_model.listener_echo_restarts": bad})


def test_speaker_words_keep_the_speakers_turns_as_one_and_leave_the_listener_out():
    from empatheia.dialogue import speaker_words

    dialogue = Dialogue([Turn("speaker", "They cancelled my project. "), Turn("listener", "Oh no. What did they say?"),
                         Turn("speaker", "Priorities changed.", audio="last.wav")], id="d1", context="work")
    told = speaker_words(dialogue)
    assert [(t.role, t.text, t.audio) for t in told.turns] == [("speaker", "They cancelled my project. Priorities changed.",
                                                                 "last.wav")]
    assert told.id == "d1" and told.context == "work" and len(dialogue.turns) == 3
    assert speaker_words(dialogue, first_turn=1).turns[0].text == "Priorities changed."
    with pytest.raises(ValueError, match="d1 has no speaker turn from turn 3 on"):
        speaker_words(dialogue, first_turn=3)


def test_an_echoing_reply_is_answered_again_from_the_speakers_words_with_its_chain_kept(tiny):
    from empatheia.dialogue import speaker_words
    from empatheia.modeling import GeneratedText

    tokenizer = tiny.tokenizer
    echoing = Dialogue([Turn("speaker", "My girlfriend said yes."),
                        Turn("listener", "Wow! How long have you been dating?"), Turn("speaker", "Five months.")])
    quiet = Dialogue([Turn("speaker", "My girlfriend said yes."), Turn("listener", "Wow!"),
                      Turn("speaker", "Five months.")])
    items = [quiet, echoing]
    prompts = [tiny.processor.encode(d, PromptMode.FULL) for d in items]
    replies = ["How long have you been dating?", "So how long have you been dating?"]
    rows = [_row(tokenizer, r) for r in replies]
    width = max(map(len, rows))
    sequences = torch.tensor([r + [tiny.token_ids.pad] * (width - len(r)) for r in rows])
    calls = []

    def again(which, processor, dialogues):
        calls.append((which, processor, dialogues))
        row = _row(tokenizer, "Five months is a good start.")
        return GeneratedText(None, (None, None), torch.tensor([row]), [tokenizer.decode(row)])

    out, texts = tiny._reanswer_listener_echoes(items, PromptMode.FULL, prompts, sequences, replies, again)
    (which, processor, dialogues), = calls
    assert which == [1] and dialogues == [speaker_words(echoing)]
    # Held to what it wrote before the reply (here a chain's end and the lead-in), the reply free.
    lead = len(_row(tokenizer, ""))
    assert processor.lengths.tolist() == [lead] and processor.forced[0, :lead].tolist() == rows[1][:lead]
    assert (processor.banned < 0).all()
    assert texts[0] == replies[0] and texts[1].endswith("Five months is a good start.")
    assert out[0, :len(rows[0])].tolist() == rows[0]
