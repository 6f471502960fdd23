"""The llm's logprobs JSON read into OpenAI's shapes: which entry is the sampled token, when it is among the
N most likely (marked, or unmarked and found by the text) and when it is not (the last entry); a stop string
cut from the text;
a response of thousands of tokens; the completions shape's offsets; an echoed prompt's tokens."""
from __future__ import annotations

import json

from ragstack.openai_frontend.logprobs import (
    Matcher,
    chat_content,
    completion_logprobs,
    prompt_scores,
    vllm_prompt_logprobs,
)


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


def own(i: int, text: str, raw: list[int], lp: float, rank: int, sampled: bool = False) -> dict:
    """One token's entry as our llm sends it: its piece, its own bytes, and the mark on the sampled token's."""
    mark = {"sampled": True} if sampled else {}
    return {str(i): {"logprob": lp, "rank": rank, "decoded_token": text, "bytes": raw, **mark}}


def test_the_marked_entry_not_an_alternative_decoded_alone_to_the_same_piece():
    """SentencePiece's "▁a" decodes alone to "a", as the sampled "a" of "ba" does: the text cannot tell them apart,
    the mark does ("b" + " a" otherwise)."""
    raw = json.dumps([own(1, "b", [0x62], -0.1, 1, True),
                      {**own(2, "a", [0x20, 0x61], -0.3, 1), **own(3, "a", [0x61], -1.5, 2, True)}])
    chat = chat_content(Matcher(2).add(raw, "ba"))
    assert [(c["token"], c["bytes"], c["logprob"]) for c in chat] == [("b", [0x62], -0.1), ("a", [0x61], -1.5)]


def test_the_marked_entry_where_max_tokens_cuts_inside_a_character():
    """max_tokens 2 ends inside "가" (EA B0 80): the sampled partial byte reads U+FFFD, as its alternatives do."""
    raw = json.dumps([own(4, "", [0xea], -0.2, 1, True),
                      {**own(5, "\ufffd", [0xb1], -0.4, 1), **own(6, "\ufffd", [0xb0], -0.9, 2, True)}])
    chat = chat_content(Matcher(2).add(raw, "\ufffd"))
    assert [(c["token"], c["bytes"], c["logprob"]) for c in chat] == [("\\xea", [0xea], -0.2),
                                                                      ("\\xb0", [0xb0], -0.9)]


def test_the_marked_entry_not_a_skipped_special_token():
    """A special token that skip_special_tokens leaves out reads "", as a character's first byte does."""
    raw = json.dumps([{**own(7, "", [], -0.1, 1), **own(4, "", [0xea], -2.5, 2, True)},   # "</s>" first
                      own(8, "가", [0xb0, 0x80], -0.3, 1, True)])
    chat = chat_content(Matcher(2).add(raw, "가"))
    assert [(c["token"], c["bytes"], c["logprob"]) for c in chat] == [("\\xea", [0xea], -2.5),
                                                                      ("\\xb0\\x80", [0xb0, 0x80], -0.3)]
    assert bytes(b for c in chat for b in c["bytes"]).decode() == "가"


def test_marked_entries_keep_the_text_accounted_for_across_responses():
    """The marked pieces still take the text, so a later unmarked response (a vllm_backend model's way) is searched
    in what is left of it."""
    matcher = Matcher(2)
    first = matcher.add(json.dumps([{**own(1, "a", [0x20, 0x61], -0.3, 1), **own(2, "a", [0x61], -1.5, 2, True)}]),
                        "a")
    later = matcher.add(json.dumps([entry((3, "x", -0.2, 1), (4, "y", -1.0, 2))]), "y")
    assert [(t.token, t.raw) for t in first + later] == [("a", [0x61]), ("y", None)]


def test_unmarked_entries_are_still_found_by_the_text():
    """Without the mark (a vllm_backend model, an older llm) the text tells the sampled entry: "b" of rank 2."""
    raw = json.dumps([{**own(1, "a", [0x61], -0.3, 1), **own(2, "b", [0x62], -1.5, 2)}])
    chat = chat_content(Matcher(2).add(raw, "b"))
    assert [(c["token"], c["bytes"], c["logprob"]) for c in chat] == [("b", [0x62], -1.5)]


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


def test_chat_bytes_are_each_tokens_own_where_a_character_spans_tokens():
    """Our llm's `bytes`: "가" (EA B0 80) as two tokens, whose pieces are "" and the whole character. Each token's
    bytes are its own (they join into the text's), its token their text, escaped where no UTF-8, as OpenAI."""
    raw = json.dumps([{**own(7, "\ufffd", [0xea], -0.3, 1), **own(8, "", [0xea, 0xb0], -1.0, 2)},
                      {**own(9, "가", [0x80], -0.2, 1), **own(10, "!", [0x21], -2.0, 2)},
                      own(11, " é", [0x20, 0xc3, 0xa9], -0.1, 1),
                      own(12, "", [0xc3], -0.1, 1), own(13, "\ufffdab", [0x61, 0x62], -0.1, 1)])   # a broken "é"
    chat = chat_content(Matcher(2).add(raw, "가 é\ufffdab"))
    assert [(c["token"], c["bytes"]) for c in chat] == [
        ("\\xea\\xb0", [0xea, 0xb0]), ("\\x80", [0x80]), (" é", [0x20, 0xc3, 0xa9]), ("\\xc3", [0xc3]),
        ("ab", [0x61, 0x62])]
    assert [(a["token"], a["bytes"]) for a in chat[0]["top_logprobs"]] == [
        ("\\xea", [0xea]), ("\\xea\\xb0", [0xea, 0xb0])]
    assert bytes(b for c in chat for b in c["bytes"]).decode(errors="replace") == "가 é\ufffdab"
    prompt = [own(3, "가", [0xea, 0xb0, 0x80], None, None), own(4, "!", [0x21], -0.5, 1)]
    assert vllm_prompt_logprobs(prompt) == [None, {"4": {"logprob": -0.5, "rank": 1, "decoded_token": "!"}}]


def test_top_logprobs_as_openai_has_them():
    """logprob is the sampled token's own; chat's top_logprobs are the N most likely alone (the sampled token
    there only where it is one of them); completions' add the sampled token (up to N + 1 entries)."""
    raw = json.dumps([entry((1, "a", -0.2, 1), (2, "b", -1.9, 2), (3, "z", -6.0, 40)),   # sampled outside the top 2
                      entry((4, "c", -0.4, 1), (5, "d", -1.2, 2))])                    # sampled inside: "d"
    tokens = Matcher(2).add(raw, "zd")
    chat = chat_content(tokens)
    assert [(c["token"], c["logprob"]) for c in chat] == [("z", -6.0), ("d", -1.2)]
    assert [[(a["token"], a["logprob"]) for a in c["top_logprobs"]] for c in chat] == [
        [("a", -0.2), ("b", -1.9)], [("c", -0.4), ("d", -1.2)]]
    completion = completion_logprobs(tokens, 0)
    assert completion["token_logprobs"] == [-6.0, -1.2]
    assert completion["top_logprobs"] == [{"a": -0.2, "b": -1.9, "z": -6.0}, {"c": -0.4, "d": -1.2}]
    assert list(completion["top_logprobs"][0]) == ["a", "b", "z"]   # the N most likely first
    only = completion_logprobs(Matcher(0).add(json.dumps([entry((6, "q", -3.0, 9))]), "q"), 0)
    assert only["top_logprobs"] == [{"q": -3.0}]   # logprobs=0: the sampled token alone, as OpenAI


def test_completions_top_logprobs_keep_distinct_tokens_that_share_a_piece():
    """Partial bytes of characters all read U+FFFD: each keeps its entry, the likeliest under the piece, the rest
    under their bytes, most likely first; the sampled token keeps its piece, as `tokens` has it."""
    raw = json.dumps([{**own(1, "\ufffd", [0xe4], -1.0, 1), **own(2, "\ufffd", [0xea], -2.0, 2),
                       **own(3, "\ufffd", [0xeb], -3.0, 3), **own(4, "ab", [0x61, 0x62], -4.0, 4, True)},
                      {**own(5, "x", [0x78], -0.5, 1), **own(6, "\ufffd", [0xe4], -0.7, 2, True),
                       **own(7, "\ufffd", [0xea], -0.9, 3)}])
    tokens = Matcher(3).add(raw, "ab\ufffd")
    top = completion_logprobs(tokens, 0)["top_logprobs"]
    assert list(top[0].items()) == [("\ufffd", -1.0), ("bytes:\\xea", -2.0), ("bytes:\\xeb", -3.0), ("ab", -4.0)]
    assert list(top[1].items()) == [("x", -0.5), ("\ufffd", -0.7), ("bytes:\\xea", -0.9)]
    special = Matcher(2).add(json.dumps([{**own(8, "", [], -0.1, 1), **own(9, "", [], -0.2, 2),
                                          **own(10, "z", [0x7a], -3.0, 3, True)}]), "z")
    assert completion_logprobs(special, 0)["top_logprobs"] == [{"": -0.1, "z": -3.0}]   # nothing tells them apart
    prompt = [{"3": {"logprob": None, "rank": None, "decoded_token": "a", "bytes": [0x61]}},
              {**own(1, "\ufffd", [0xe4], -1.0, 1), **own(2, "\ufffd", [0xea], -2.0, 2),
               **own(5, "b", [0x62], -3.0, 3)}]
    echoed = completion_logprobs([], 2, prompt_scores(prompt, 3), "ab")["top_logprobs"]
    assert echoed == [None, {"\ufffd": -1.0, "bytes:\\xea": -2.0, "b": -3.0}]   # an echoed prompt's the same


def test_an_echoed_prompts_tokens_the_first_without_a_logprob():
    """The llm's prompt_logprobs: per token its top N by rank with its own entry last (in the top N or not); the
    first token's own entry alone, logprob and rank null. vLLM's field has None there."""
    first = {"3": {"logprob": None, "rank": None, "decoded_token": "The"}}
    entries = [first,
               entry((7, " cat", -3.0, 1), (8, " dog", -3.5, 2), (9, " KV", -6.0, 12)),
               entry((5, " is", -0.7, 1), (6, " cache", -1.1, 2))]   # its own entry, rank 2, last
    answer = Matcher(1).add(json.dumps([entry((4, "Hi", -0.2, 1)), entry((5, "\n", -0.3, 1))]), "Hi")  # "\n": a stop
    assert completion_logprobs(answer, 12, prompt_scores(entries, 2), "The KV cache") == {
        "tokens": ["The", " KV", " cache", "Hi", "\n"], "token_logprobs": [None, -6.0, -1.1, -0.2, -0.3],
        "top_logprobs": [None, {" cat": -3.0, " dog": -3.5, " KV": -6.0}, {" is": -0.7, " cache": -1.1},
                         {"Hi": -0.2}, {"\n": -0.3}],
        "text_offset": [0, 3, 6, 12, 14]}   # the answer's tokens from where its text starts, after the echo
    assert vllm_prompt_logprobs(entries) == [None, *entries[1:]]
    bos = {"1": {"logprob": None, "rank": None, "decoded_token": "<s>"}}   # added to the text prompt "The KV cache"
    with_bos = [bos, entry((3, "The", -2.0, 1)), *entries[1:]]
    assert completion_logprobs(answer, 12, prompt_scores(with_bos, 2), "The KV cache")["text_offset"] == [
        0, 0, 3, 6, 12, 14]   # the BOS where the text goes on
