"""The reply does not repeat the listener's own earlier turns: the n-grams of a turn as a
reply spells them (``turn_ngrams``), the processor that blocks them in the reply
(``ListenerEchoBlock``) and its wiring (``language_model.no_repeat_listener_ngram_size``)."""

import pytest
import torch

from empatheia import Dialogue, Empatheia, Turn
from empatheia.config import EmpatheiaConfig
from empatheia.logits_processors import ListenerEchoBlock, reply_markers, turn_ngrams
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

