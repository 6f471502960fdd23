"""Echo of a completions prompt with vLLM's truncate_prompt_tokens k: the tokens the llm read where it cut the
prompt (its last k), the text as sent where it did not (fewer tokens than k, or k tokens of which the first are
the special tokens the tokenizer added)."""
from __future__ import annotations

import pytest

from ragstack.openai_frontend.completions import Answer
from ragstack.openai_frontend.generation import Piece
from ragstack.openai_frontend.usage import Usage


def prompt_logprobs(*pieces: str) -> list[dict]:
    """The llm's prompt_logprobs output for a prompt of these pieces: the first alone, the rest their own entries."""
    return [{"1": {"logprob": None, "rank": None, "decoded_token": pieces[0]}},
            *({str(i): {"logprob": -1.0, "rank": 1, "decoded_token": p}} for i, p in enumerate(pieces[1:], 2))]


@pytest.mark.parametrize("sent, pieces, shown", [
    ("Hello world this is long", (" is", " l", "ong"), " is long"),   # cut: the last 3
    ("Hello world", ("<s>", "Hello", " world"), "Hello world"),         # 3 with the BOS: nothing cut
    ("Hi", ("<s>", "Hi"), "Hi"),                                         # fewer than 3
])
def test_echo_shows_what_the_llm_read_only_where_it_cut(sent, pieces, shown):
    answer = Answer("cmpl-1", 0, "llm", [sent], Usage(True, prompts=1, n=1), False, cut_to=3)
    choice = Piece(text=" ok", finish_reason="length", prompt_tokens=len(pieces), completion_tokens=1,
                   prompt_logprobs=prompt_logprobs(*pieces))
    assert answer.whole([choice])["choices"][0]["text"] == shown + " ok"
