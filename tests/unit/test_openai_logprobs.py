"""The llm's logprobs JSON read into OpenAI's shapes: which entry is the sampled token, when it is among the
N most likely (nothing marks it) and when it is not (the last entry); a stop string cut from the text;
a response of thousands of tokens; the completions shape's offsets."""
from __future__ import annotations

import json

from ragstack.openai_frontend.logprobs import Matcher, chat_content, completion_logprobs


def entry(*tokens: tuple[int, str, float, int]) -> dict:
    """The llm's object for one token: (id, decoded_token, logprob, rank) of the top N in order, then the
    sampled one if it is outside them."""
    return {str(i): {"logprob": lp, "rank": rank, "decoded_token": text} for i, text, lp, rank in tokens}


def test_the_sampled_token_is_the_last_entry_or_the_one_the_text_spells():
    raw = json.dumps([
        entry((1, "ight", -1.2, 1), (2, "U", -1.8, 2), (3, "", -5.4, 29)),        # outside the top 2: the last
        entry((4, "hi", -1.6, 1), (5, "!", -1.8, 2)),                           # inside: the text says "!"
        entry((6, " a", -0.5, 1), (7, " ab", -0.9, 2)),                         # " ab" and " a"+"b" both start it
        entry((8, "b", -0.1, 1), (9, "c", -2.0, 2)),
    ])
    tokens = Matcher(2).add(raw, "! abc")
    assert [(t.token, t.logprob) for t in tokens] == [("", -5.4), ("!", -1.8), (" ab", -0.9), ("c", -2.0)]
    assert [[a.token for a in t.top] for t in tokens] == [["ight", "U"], ["hi", "!"], [" a", " ab"], ["b", "c"]]


def test_text_held_back_or_cut_at_a_stop_string_still_gives_every_token():
    matcher = Matcher(1)
    first = matcher.add(json.dumps([entry((1, "Hel", -0.1, 1)), entry((2, "lo", -0.2, 1))]), "Hel")   # "lo" held back
    later = matcher.add(json.dumps([entry((3, " wor", -0.3, 1), (4, "x", -4.0, 7))]), "lo x")
    assert [t.token for t in first + later] == ["Hel", "lo", "x"]
    cut = Matcher(0).add(json.dumps([entry((5, "STOP", -0.1, 1))]), "")   # the stop string is not in the text
    assert [t.token for t in cut] == ["STOP"] and cut[0].top == []


def test_a_long_response_is_matched_without_recursion():
    raw = json.dumps([entry((i % 7, "ab", -1.0, 1), (100 + i, "a", -2.0, 2)) for i in range(5000)])
    tokens = Matcher(2).add(raw, "a" * 5000)
    assert len(tokens) == 5000 and all(t.token == "a" for t in tokens)


def test_openai_shapes():
    tokens = Matcher(1).add(json.dumps([entry((1, "é", -0.5, 1)), entry((2, "t", -0.1, 1))]), "ét")
    assert chat_content(tokens)[0] == {"token": "é", "logprob": -0.5, "bytes": [195, 169],
                                       "top_logprobs": [{"token": "é", "logprob": -0.5, "bytes": [195, 169]}]}
    assert completion_logprobs(tokens, 3) == {"tokens": ["é", "t"], "token_logprobs": [-0.5, -0.1],
                                              "top_logprobs": [{"é": -0.5}, {"t": -0.1}], "text_offset": [3, 4]}
