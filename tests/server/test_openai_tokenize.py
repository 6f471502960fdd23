"""vLLM's /tokenize and /detokenize through the session server's frontend, raw HTTP: the counts are those a
generation request of the same prompt or chat reports, the pieces and the decoded text give the prompt back,
and bad ids and fields are refused by name."""
from __future__ import annotations

import httpx2 as httpx
import pytest

pytestmark = pytest.mark.server
TEXT = "The engineers measured the latency of every request."
HELLO = [{"role": "user", "content": "Hello, who are you?"}]
MAX_MODEL_LEN = 2048   # model_repository/llm/config.pbtxt


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.openai_url}{path}", json=body, timeout=120)


def tokenize(server, **body) -> dict:
    response = post(server, "/tokenize", {"model": "llm", **body})
    assert response.status_code == 200, response.text
    return response.json()


def usage(server, path: str, **body) -> int:
    response = post(server, path, {"model": "llm", "max_tokens": 1, **body})
    assert response.status_code == 200, response.text
    return response.json()["usage"]["prompt_tokens"]


def test_a_prompt_counts_as_a_completion_counts_it(triton_server):
    got = tokenize(triton_server, prompt=TEXT)
    assert got["count"] == len(got["tokens"]) == usage(triton_server, "/v1/completions", prompt=TEXT)
    assert got["max_model_len"] == MAX_MODEL_LEN and got["token_strs"] is None
    assert post(triton_server, "/v1/tokenize", {"model": "llm", "prompt": TEXT}).json() == got


def test_an_empty_prompt_is_no_tokens(triton_server):
    """vLLM's answer for "": its special tokens alone (the demo tokenizer adds none; a BOS one: unit tests)."""
    assert tokenize(triton_server, prompt="") == {"count": 0, "max_model_len": MAX_MODEL_LEN, "tokens": [],
                                                  "token_strs": None}
    assert tokenize(triton_server, prompt="", return_token_strs=True)["token_strs"] == []


def test_messages_count_as_a_chat_counts_them(triton_server):
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    for extra in ({}, {"add_generation_prompt": False}, {"tools": tools},
                  {"chat_template_kwargs": {"enable_thinking": False}}):
        got = tokenize(triton_server, messages=HELLO, **extra)
        assert got["count"] == usage(triton_server, "/v1/chat/completions", messages=HELLO, **extra), extra
    assert tokenize(triton_server, messages=HELLO, add_generation_prompt=False)["count"] < \
        tokenize(triton_server, messages=HELLO)["count"]


def test_messages_of_text_beyond_ascii_go_as_utf8_within_the_llms_limit(triton_server):
    """600 KB of CJK as a message: as JSON escapes it would be 1.2 MB, past the llm's 1 MiB messages input."""
    wide = [{"role": "user", "content": "日" * 200_000}]
    assert tokenize(triton_server, messages=wide)["count"] > 1000


def test_token_strs_are_the_prompt_s_pieces(triton_server):
    got = tokenize(triton_server, prompt=TEXT, return_token_strs=True)
    assert len(got["token_strs"]) == got["count"]
    assert "".join(got["token_strs"]).replace("\u0120", " ") == TEXT   # byte-level pieces: a space is Ġ


def test_detokenize_gives_the_text_back(triton_server):
    tokens = tokenize(triton_server, prompt=TEXT)["tokens"]
    for path in ("/detokenize", "/v1/detokenize"):
        response = post(triton_server, path, {"model": "llm", "tokens": tokens})
        assert response.status_code == 200, response.text
        assert response.json() == {"prompt": TEXT}
    assert post(triton_server, "/detokenize", {"model": "llm", "tokens": []}).json() == {"prompt": ""}


@pytest.mark.parametrize("path, body, param, words", [
    ("/detokenize", {"tokens": [1, 2, 10**9]}, "tokens", "holds 1000000000 at index 2; the vocabulary has"),
    ("/detokenize", {"tokens": [1, -3]}, "tokens[1]", "tokens[1] is -3"),
    ("/detokenize", {"tokens": ["a"]}, "tokens[0]", "valid integer"),
    ("/tokenize", {"prompt": TEXT, "messages": HELLO}, "messages", "give either prompt"),
    ("/tokenize", {}, "prompt", "give either prompt"),
    ("/tokenize", {"prompt": TEXT, "add_generation_prompt": True}, "add_generation_prompt", "is for messages"),
    ("/tokenize", {"prompt": TEXT, "echo": True}, "echo", "Extra inputs"),
    ("/tokenize", {"prompt": 5}, "prompt", "valid string"),
    ("/tokenize", {"messages": []}, "messages", "at least one message"),
    ("/tokenize", {"messages": HELLO, "tools": [{"type": "x"}]}, "tools[0]", "tools[0] must be"),
    ("/tokenize", {"messages": HELLO, "continue_final_message": True}, "continue_final_message", "assistant"),
    ("/tokenize", {"model": "embed", "prompt": TEXT}, "model", "not tokenize"),
])
def test_bad_requests_are_refused_naming_the_field(triton_server, path, body, param, words):
    response = post(triton_server, path, {"model": "llm", **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error
