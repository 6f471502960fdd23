"""A streamed answer whose reader fell behind: the pieces that queued up meanwhile come as one batch
(generation.merged), and each choice's pieces in it as one chunk (generation.coalesced) that says what
the pieces said: the text, the token counts, the logprobs, the finish reason, the sources; the pieces
themselves unchanged. The chunks on the wire are checked against the real server in
tests/server/test_openai_*.py."""
from __future__ import annotations

from ragstack.openai_frontend.generation import Piece, coalesced
from ragstack.openai_frontend.logprobs import TokenLogprob


def test_one_piece_per_choice_is_left_as_it_is():
    batch = [(0, Piece(text="a")), (1, Piece(text="b"))]
    assert coalesced(batch) == batch
    assert coalesced(batch[:1]) == batch[:1]


def test_a_choices_pieces_add_up_in_the_order_the_choices_came():
    first = Piece(text="Hel", prompt_tokens=7, completion_tokens=1, sources=[{"n": 1}])
    pieces = [(1, first), (0, Piece(text="x", completion_tokens=1)), (1, Piece(text="lo", completion_tokens=1)),
              (1, Piece(text="!", completion_tokens=1, finish_reason="stop"))]
    out = coalesced(pieces)
    assert [index for index, _ in out] == [1, 0]
    whole = out[0][1]
    assert (whole.text, whole.prompt_tokens, whole.completion_tokens, whole.finish_reason, whole.sources) == \
        ("Hello!", 7, 3, "stop", [{"n": 1}])
    assert out[1][1] is pieces[1][1]
    assert (first.text, first.completion_tokens, first.finish_reason) == ("Hel", 1, None)   # not changed


def test_logprobs_are_joined_in_order():
    a, b = TokenLogprob("a", -0.1, []), TokenLogprob("b", -0.2, [])
    out = coalesced([(0, Piece(text="a", logprobs=[a])), (0, Piece(text="b", logprobs=[b]))])
    assert out[0][1].logprobs == [a, b]
