"""The reply's least length (``ReplyMinLength``, ``language_model.min_reply_tokens``): the
tokens that end the reply are withheld until it holds enough tokens."""

import pytest
import torch

from empatheia import Dialogue, Empatheia, Turn
from empatheia.config import EmpatheiaConfig
from empatheia.logits_processors import ReplyMinLength
from empatheia.prompts import PromptMode

MARKER = 9
STOPS = [0, 1]


def _withheld(processor, ids, vocab=12):
    scores = processor(torch.tensor(ids), torch.zeros(len(ids), vocab))
    return [torch.nonzero(row == float("-inf")).flatten().tolist() for row in scores]


def test_the_stops_are_withheld_only_in_rows_whose_reply_is_shorter_than_the_least_length():
    least = ReplyMinLength([[MARKER]], 2, STOPS)
    # Row 0 is in its chain; row 1 has just written the lead-in; row 2 holds one reply
    # token, row 3 two.
    ids = [[5, 6, 7, 8], [5, 6, 7, MARKER], [5, 6, MARKER, 3], [5, MARKER, 3, 4]]
    assert _withheld(least, ids) == [[], STOPS, STOPS, []]
    # Only the stops: every word stays open.
    scores = least(torch.tensor(ids), torch.zeros(4, 12))
    assert torch.isfinite(scores[:, 2:]).all()
    # A lead-in of several tokens counts from its end; without markers nothing is withheld.
    assert _withheld(ReplyMinLength([[MARKER, 4]], 1, STOPS), [[MARKER, 4], [MARKER, 3]]) == [STOPS, []]
    assert _withheld(ReplyMinLength([], 3, STOPS), [[MARKER, 3]]) == [[]]


def test_the_least_length_and_the_stops_are_checked():
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="tokens >= 1"):
            ReplyMinLength([[MARKER]], bad, STOPS)
    with pytest.raises(ValueError, match="token ids that end the reply"):
        ReplyMinLength([[MARKER]], 2, [])
    for bad in (-1, True, 2.0):
        with pytest.raises(ValueError, match="min_reply_tokens must be"):
            EmpatheiaConfig.from_preset("tiny", {"language_model.min_reply_tokens": bad})


def test_the_model_withholds_the_end_of_text_the_signal_tokens_and_line_breaks_from_a_short_reply():
    model = Empatheia(EmpatheiaConfig.from_preset("tiny", {"language_model.min_reply_tokens": 4})).eval()
    dialogue = Dialogue([Turn("speaker", "I lost my job last week.")])
    prompts = [model.processor.encode(dialogue, PromptMode.FULL)]
    least = [p for p in model._decoding_processors(PromptMode.FULL, None, None, prompts, [dialogue])
             if isinstance(p, ReplyMinLength)]
    assert len(least) == 1 and least[0].tokens == 4
    ids = model.token_ids
    stops = set(least[0].stops.tolist())
    assert {ids.eos, *ids.audio_signals, *ids.video_signals} <= stops
    # A reply is one line, so a line break ends it too; words stay open.
    assert set(model.tokenizer.encode("\n", add_special_tokens=False)) <= stops
    assert not set(model.tokenizer.encode(" sorry.", add_special_tokens=False)) & stops
    # Off by default, and in layouts without a reply.
    plain = Empatheia(EmpatheiaConfig.from_preset("tiny")).eval()
    assert not any(isinstance(p, ReplyMinLength) for p in plain._decoding_processors(PromptMode.FULL, None, None,
                                                                                       prompts, [dialogue]))
    style = [model.processor.encode(dialogue, PromptMode.STYLE)]
    assert not any(isinstance(p, ReplyMinLength) for p in model._decoding_processors(PromptMode.STYLE, None, None,
                                                                                       style, [dialogue]))


def test_a_run_records_the_least_length_and_the_listener_block_only_when_on():
    from empatheia.config import LanguageModelConfig
    from empatheia.evaluation.model_runs import RunOptions

    plain = RunOptions().run_info(LanguageModelConfig())["decoding"]
    assert "min_reply_tokens" not in plain and "no_repeat_listener_ngram_size" not in plain
    on = RunOptions().run_info(LanguageModelConfig(min_reply_tokens=12, no_repeat_listener_ngram_size=4))["decoding"]
    assert on["min_reply_tokens"] == 12 and on["no_repeat_listener_ngram_size"] == 4
