"""Property-based bad input to every endpoint of the OpenAI frontend: bodies wrong in one way (a field of
the wrong type or out of range, a bad message, an unknown key, a body that is no JSON object), streamed or
not. None gets a 5xx: each is answered with its 4xx and an OpenAI error object, or served; and the
frontend still serves a valid request after them."""
from __future__ import annotations

import json
import urllib.parse

import httpx2 as httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bad_generation_strategies import BAD_VALUES
from bad_input import CRASH_MARKS, TRIED, bounded

pytestmark = pytest.mark.server
HELLO = [{"role": "user", "content": "hi"}]
VALID = {
    "/v1/chat/completions": {"model": "llm", "messages": HELLO, "max_tokens": 2},
    "/v1/completions": {"model": "llm", "prompt": "hi", "max_tokens": 2},
    "/v1/embeddings": {"model": "embed", "input": ["hi"]},
    "/v1/rerank": {"model": "rerank", "query": "hi", "documents": ["a", "b"]},
    "/v1/score": {"model": "rerank", "text_1": ["hi", "yo"], "text_2": ["a", "b"]},
}
SERVED = {".", "..", "llm", "llm_small_queue", "llm_small_kv", "llm_in_stub", "llm_tp2", "rag", "embed", "rerank"}
EXAMPLES = {"/v1/chat/completions": 150, "/v1/completions": 60, "/v1/embeddings": 60, "/v1/rerank": 60,
            "/v1/score": 60}
# Leaves include what json.dumps writes but a strict JSON reader refuses (NaN, Infinity) and strings of a
# lone surrogate (JSON's "\\ud800" escape: valid JSON, not text).
JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(),
                              st.text(max_size=8), st.sampled_from(["\ud800", "x\udfff"])),
                    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner,
                                                                                         max_size=3)), max_leaves=6)
MODELS = st.one_of(JSON.filter(lambda v: not isinstance(v, str)), st.text(max_size=20),
                   st.sampled_from(["embed", "rerank", "rag", "llm", "retriever", "embedder", "echo", "llm_tp2"]))
MESSAGES = st.one_of(
    JSON, st.just([]),
    st.lists(st.fixed_dictionaries({"role": st.one_of(JSON, st.sampled_from(["user", "developer", "tool", "x"])),
                                    "content": st.one_of(JSON, st.lists(st.fixed_dictionaries(
                                        {"type": st.sampled_from(["text", "image_url", "x"]),
                                         "text": JSON}), max_size=2))}), min_size=1, max_size=3),
    st.lists(st.fixed_dictionaries({"role": st.sampled_from(["assistant", "tool"]), "content": st.text(max_size=5),
                                    "tool_calls": st.lists(st.one_of(JSON, st.fixed_dictionaries(
                                        {"id": JSON, "type": st.just("function"), "function": st.fixed_dictionaries(
                                            {"name": st.one_of(JSON, st.just("f")),
                                             "arguments": st.one_of(JSON, st.just("{}"), st.just("{x"))})})),
                                        min_size=1, max_size=2)},
                                   optional={"tool_call_id": JSON}), min_size=1, max_size=1))
TEXTS = st.one_of(JSON, st.lists(st.one_of(JSON, st.just(""), st.just(" ")), min_size=0, max_size=4),
                  st.lists(st.integers(0, 100), min_size=1, max_size=3),   # token ids
                  st.integers(16385, 20000).map(lambda n: "x" * n))          # past the tokenizers' max_text_bytes
# response_format and tools nearly right: one part of the shape wrong (or random).
RESPONSE_FORMATS = st.one_of(JSON.filter(lambda v: v is not None), st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "json_object", "json_schema", "xml"])},
    optional={"json_schema": st.one_of(JSON, st.fixed_dictionaries(
        {"name": st.one_of(JSON, st.just("x")), "schema": st.one_of(JSON, st.just({"type": "nonsense"}))},
        optional={"strict": JSON}))}))
TOOLS = st.one_of(JSON.filter(lambda v: v is not None), st.lists(st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "x"]), "function": st.one_of(JSON, st.fixed_dictionaries(
        {"name": st.one_of(JSON, st.sampled_from(["f", "g h", ""]))},
        optional={"parameters": st.one_of(JSON, st.just({"type": "nonsense"})), "strict": JSON}))}),
    max_size=2))
TOOL_CHOICES = st.one_of(JSON, st.sampled_from(["none", "auto", "required", "sometimes"]),
                         st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
                             {"name": st.one_of(JSON, st.just("f"))})}))
# The vendor fields embeddings and rerank declare, each only with values they refuse (null means the default).
NOT_INT = JSON.filter(lambda v: v is not None and (isinstance(v, bool) or not isinstance(v, int)))
NOT_TRUE = JSON.filter(lambda v: v is not None and v is not True)
POOLING = {"truncate_prompt_tokens": st.one_of(st.integers(-10**6, 0).filter(lambda v: v != -1), NOT_INT),
           "priority": st.one_of(st.integers(-5, 5).filter(bool), NOT_INT)}
# A side of the score's pairs that no request takes: anything but one or two texts (the other side holds two).
SIDES = st.one_of(
    JSON.filter(lambda v: not (isinstance(v, str) and v.strip()) and not (isinstance(v, list) and v and all(
        isinstance(t, str) and t.strip() for t in v))),
    st.lists(st.sampled_from(["", " \n"]), min_size=1, max_size=2), st.lists(st.just("t"), min_size=3, max_size=4),
    st.integers(16385, 20000).map("x".__mul__), st.lists(st.fixed_dictionaries({"content": JSON}), min_size=1,
                                                         max_size=2))
NOT_BOOL = JSON.filter(lambda v: v is not None and not isinstance(v, bool))
NOT_NULL = JSON.filter(lambda v: v is not None)
SHARED = {"model": MODELS, "stream": JSON, "stream_options": JSON, "n": st.one_of(JSON, st.integers(-5, 100)),
          "user": JSON, "response_format": RESPONSE_FORMATS, **BAD_VALUES}
FIELDS = {
    "/v1/chat/completions": {**SHARED, "messages": MESSAGES, "max_completion_tokens": BAD_VALUES["max_tokens"],
                             "logprobs": JSON, "top_logprobs": st.one_of(JSON, st.integers(-5, 50)),
                             "tools": TOOLS, "tool_choice": TOOL_CHOICES, "parallel_tool_calls": JSON},
    "/v1/completions": {**SHARED, "tools": TOOLS, "prompt": TEXTS, "echo": JSON, "suffix": JSON, "best_of": st.integers(-3, 5),
                        "logprobs": st.one_of(JSON, st.integers(-5, 50))},
    "/v1/embeddings": {"model": MODELS, "input": TEXTS, "encoding_format": JSON, "dimensions": JSON, "user": JSON,
                       **POOLING, "normalize": NOT_TRUE, "add_special_tokens": NOT_TRUE,
                       "request_id": JSON.filter(lambda v: v is not None and not isinstance(v, str))},
    "/v1/rerank": {"model": MODELS, "query": st.one_of(JSON, st.just(""), st.integers(16385, 20000).map("q".__mul__)),
                   "documents": st.one_of(TEXTS, st.lists(st.fixed_dictionaries({"text": JSON}), max_size=2)),
                   "top_n": JSON.filter(lambda v: v != 0), "return_documents": JSON.filter(lambda v: v is not None),
                   **POOLING, "user": JSON.filter(lambda v: v is not None and not isinstance(v, str)),
                   "max_tokens_per_doc": st.one_of(st.integers(-5, 0), NOT_INT),
                   "rank_fields": JSON.filter(lambda v: v not in (None, ["text"]))},
    "/v1/score": {"model": MODELS.filter(lambda m: m not in (None, "rerank")), "text_1": SIDES, "text_2": SIDES,
                  # the other names of the two sides: beside text_1 and text_2, any value but null mixes them
                  **dict.fromkeys(("data_1", "data_2", "queries", "documents", "items"), NOT_NULL), **POOLING,
                  "user": JSON.filter(lambda v: v is not None and not isinstance(v, str)),
                  "request_id": JSON.filter(lambda v: v is not None and not isinstance(v, str)),
                  "mm_processor_kwargs": JSON.filter(lambda v: v not in (None, {})),
                  **dict.fromkeys(("use_activation", "activation", "softmax"), NOT_BOOL)},
}


def bodies(path: str) -> st.SearchStrategy[bytes]:
    valid, fields = VALID[path], FIELDS[path]
    one_field = st.sampled_from(sorted(fields)).flatmap(lambda k: fields[k].map(lambda v: {**valid, k: v}))
    unknown_key = st.tuples(st.from_regex(r"\A[a-z][a-z_]{0,12}\Z").filter(lambda k: k not in fields), JSON).map(
        lambda kv: {**valid, kv[0]: kv[1]})
    missing = st.sampled_from(sorted(valid)).map(lambda k: {n: v for n, v in valid.items() if n != k})
    as_json = st.one_of(one_field, unknown_key, missing, JSON).map(lambda b: json.dumps(b).encode())
    return st.one_of(as_json, st.binary(max_size=40), st.integers(33, 2000).map(lambda d: b"[" * d + b"]" * d))


def check(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text[:500]
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"], error
        assert not any(mark in error["message"] for mark in CRASH_MARKS), error
    elif response.headers["content-type"].startswith("text/event-stream"):
        events = response.text.split("\n\n")
        assert events[-2] == "data: [DONE]", response.text[-300:]
        for event in events[:-2]:
            chunk = json.loads(event.removeprefix("data: "))
            assert "error" not in chunk or chunk["error"]["type"] != "server_error", chunk


@pytest.mark.parametrize("path", sorted(VALID))
def test_bad_bodies_are_4xx_openai_errors(triton_server, path):
    with httpx.Client(base_url=triton_server.openai_url, timeout=60) as client:
        @bounded(EXAMPLES[path])
        @given(body=bodies(path))
        def answered(body):
            TRIED[f"openai {path}"] += 1
            check(client.post(path, content=body, headers={"Content-Type": "application/json"}))

        answered()
        assert client.post(path, json=VALID[path]).status_code == 200


def test_model_names_and_admin_calls_are_4xx(triton_server):
    with httpx.Client(base_url=triton_server.openai_url, timeout=60) as client:
        @bounded(40)
        @given(name=st.text(min_size=1, max_size=300).filter(lambda n: n not in SERVED))
        def answered(name):
            TRIED["openai /v1/models"] += 1
            for method, suffix in (("GET", ""), ("POST", "/load"), ("POST", "/unload")):
                response = client.request(method, f"/v1/models/{urllib.parse.quote(name, safe='')}{suffix}")
                assert response.status_code in (403, 404) if suffix else response.status_code == 404, response.text
                check(response)

        answered()
