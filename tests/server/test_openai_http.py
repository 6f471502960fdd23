"""The OpenAI frontend on the wire (httpx): SSE framing, error bodies and statuses, overload, and clients
that go away, whose llm requests end and free their KV blocks (read from the llm's metrics)."""
from __future__ import annotations

import asyncio
import json
import time

import httpx2 as httpx
import pytest

from server_metrics import wait_for_metric

pytestmark = pytest.mark.server
HELLO = [{"role": "user", "content": "Hello"}]
RUNNING, KV_USED = "triton_llm_num_requests_running", "triton_llm_kv_cache_blocks_used"


def post(server, path: str, body=None, content: bytes | None = None, headers: dict | None = None,
         **kw) -> httpx.Response:
    headers = {"Content-Type": "application/json", **(headers or {})}   # a raw body is sent as JSON too
    return httpx.post(f"{server.openai_url}{path}", json=body, content=content, headers=headers, timeout=60, **kw)


def sse(response: httpx.Response) -> list[str]:
    """The data of each event; events are `data: ...` lines, each followed by a blank line."""
    assert response.headers["content-type"].startswith("text/event-stream")
    events = response.text.split("\n\n")
    assert events[-1] == "", "the stream must end with a complete event"
    assert all(e.startswith("data: ") and "\n" not in e for e in events[:-1]), events
    return [e.removeprefix("data: ") for e in events[:-1]]


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"model": "llm", "messages": HELLO, "max_tokens": 5, "stream": True}),
    ("/v1/completions", {"model": "llm", "prompt": "Hello", "max_tokens": 5, "stream": True, "n": 2}),
    ("/v1/chat/completions", {"model": "rag", "messages": HELLO, "max_tokens": 3, "stream": True}),
], ids=["chat", "completions", "rag"])
def test_streams_are_sse_events_ending_with_done(triton_server, path, body):
    response = post(triton_server, path, body)
    assert response.status_code == 200
    data = sse(response)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert len({c["id"] for c in chunks}) == 1 and all(c["model"] == body["model"] for c in chunks)
    finished = [ch["index"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
    assert sorted(finished) == list(range(body.get("n", 1)))   # each choice ends once


def test_every_answer_carries_a_request_id(triton_server):
    """x-request-id, as OpenAI's answers (the SDKs' `_request_id`): the client's own when printable and at
    most 256 characters, else a new one; on streams, errors and refusals by the guard too."""
    chat = {"model": "llm", "messages": HELLO, "max_tokens": 2}
    minted = [post(triton_server, "/v1/chat/completions", chat),
              post(triton_server, "/v1/chat/completions", {**chat, "stream": True}),
              post(triton_server, "/v1/chat/completions", {**chat, "model": "nosuch"}),
              post(triton_server, "/v1/chat/completions", chat, headers={"X-Request-Id": "x" * 257}),
              post(triton_server, "/v1/chat/completions", chat, headers={"X-Request-Id": "a b"}),
              httpx.get(f"{triton_server.openai_url}/v1/nosuch", timeout=30)]
    assert [r.status_code for r in minted] == [200, 200, 404, 200, 200, 404]
    ids = [r.headers["x-request-id"] for r in minted]
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids) and len(set(ids)) == len(ids), ids
    for given in ("req-123", "y" * 256):
        answer = post(triton_server, "/v1/chat/completions", {**chat, "stream": True}, headers={"X-Request-Id": given})
        assert answer.status_code == 200 and answer.headers.get_list("x-request-id") == [given]


@pytest.mark.parametrize("path,body,status,param,words", [
    ("/v1/chat/completions", {"model": "llm", "messages": HELLO, "temperature": -1}, 400, "temperature",
     "temperature must be"),
    ("/v1/chat/completions", {"model": "llm", "messages": HELLO, "max_tokens": 10**6}, 400, "max_tokens",
     "max_model_len=2048"),
    ("/v1/chat/completions", {"model": "llm", "messages": HELLO, "logit_bias": {"1": 5, "99999": 1}}, 400,
     "logit_bias", "logit_bias token ids must be < vocab size"),
    ("/v1/chat/completions", {"model": "llm", "messages": HELLO, "logit_bias": {"1": 500}}, 400, "logit_bias",
     "must be a number in [-100, 100], got 500"),
    ("/v1/chat/completions", {"model": "llm", "messages": HELLO, "allowed_token_ids": [1, 99999]}, 400,
     "allowed_token_ids", "allowed_token_ids must be < vocab size"),
    ("/v1/completions", {"model": "llm", "prompt": "x", "logit_bias": {str(i): 1 for i in range(1025)}}, 400,
     "logit_bias", "logit_bias has 1025 token ids; the limit is 1024 (max_logit_bias)"),
    ("/v1/chat/completions", {"model": "llm", "messages": HELLO, "frobnicate": 1}, 400, "frobnicate",
     "unknown sampling parameter"),
    ("/v1/chat/completions", {"model": "llm", "messages": HELLO, "store": True}, 400, "store",
     "does not store completions"),
    ("/v1/chat/completions", {"model": "llm", "messages": HELLO, "modalities": ["text", "audio"]}, 400, "modalities",
     "text only, got ['text', 'audio']"),
    ("/v1/chat/completions", {"model": "rag", "messages": HELLO, "reasoning_effort": "low"}, 400, "reasoning_effort",
     "'reasoning_effort' is not supported by this server"),
    ("/v1/chat/completions", {"model": "llm", "messages": HELLO, "metadata": {"k": 1}}, 400, "metadata.k",
     "valid string"),
    ("/v1/chat/completions", {"model": "llm", "messages": [{"role": "wizard", "content": "x"}]}, 400,
     "messages[0].role", "messages[0].role: 'wizard' is not one of ['system', 'developer', 'user', 'assistant', "
                         "'tool']"),
    ("/v1/chat/completions", {"model": "llm", "messages": HELLO, "n": 65}, 400, "n", "the limit is 64 (max_choices)"),
    ("/v1/chat/completions", {"model": "llm", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
     400, "messages[0].content[1]", "only text parts are supported (this model is not multimodal), got type "
                                    "'image_url'"),
    ("/v1/chat/completions", {"model": "llm", "messages": HELLO, "stream": "yes"}, 400, "stream", "valid boolean"),
    ("/v1/chat/completions", {"model": "rag", "messages": [{"role": "user", "content": "q" * 2001}]}, 400,
     "messages[0].content", "messages[0].content: 2001 characters; the limit is 2000"),
    ("/v1/chat/completions", {"model": "rag", "messages": [{"role": "system", "content": "x"}]}, 400, "messages",
     "last user message"),
    ("/v1/chat/completions", {"model": "embed", "messages": HELLO}, 400, "model", "serves embeddings"),
    ("/v1/chat/completions", {"model": "no-such", "messages": HELLO}, 404, "model", "does not exist"),
    ("/v1/completions", {"model": "rag", "prompt": "x"}, 400, "model", "not completions"),
    ("/v1/completions", {"model": "llm", "prompt": [[1, 2], []]}, 400, "prompt", "none empty"),
    ("/v1/completions", {"model": "llm", "prompt": [[1, -2]]}, 400, "prompt", "token ids must be in [0, 2^31), got -2"),
    ("/v1/completions", {"model": "llm", "prompt": [1, 99999]}, 400, "prompt", "prompt token ids must be in [0, "),
    ("/v1/completions", {"model": "llm", "prompt": [505, 1]}, 400, "prompt",   # the embedding has 512 rows
     "prompt token ids must be in [0, 500), got min 1, max 505"),
    ("/v1/embeddings", {"model": "embed", "input": "x", "dimensions": 128}, 400, "dimensions", "384-dimensional"),
    ("/v1/embeddings", {"model": "embed", "input": ["ok", "  "]}, 400, "input[1]", "input[1] is empty"),
    ("/v1/embeddings", {"model": "embed", "input": "x", "encoding_format": "int8"}, 400, "encoding_format", "float"),
    ("/v1/rerank", {"model": "rerank", "query": "q", "documents": []}, 400, "documents", "at least one"),
    ("/v1/rerank", {"model": "rerank", "query": "q", "documents": ["a"], "top_n": "2"}, 400, "top_n", "valid integer"),
    ("/v1/rerank", {"model": "rerank", "query": "q", "documents": ["a", ""]}, 400, "documents[1]",
     "documents[1] is empty"),
    ("/v1/rerank", {"model": "rerank", "query": "q", "documents": ["a"], "return_urls": True}, 400, "return_urls",
     "'return_urls' is not supported by this endpoint"),
    ("/v1/chat/completions", {"model": "llm", "messages": HELLO, "stream": False, "stream_options": {
        "include_usage": True}}, 400, "stream_options", "stream_options is only allowed when stream is true"),
    ("/v1/completions", {"model": "llm", "prompt": ["a", ""]}, 400, "prompt[1]", "prompt[1] is empty"),
    ("/v1/completions", {"model": "llm", "prompt": "x", "best_of": 2}, 400, "best_of", "best_of: only 1 is supported"),
    ("/v1/chat/completions", {"model": "llm", "messages": HELLO, "chat_template": "{{ x }}"}, 400, "chat_template",
     "'chat_template' is not supported by this server (a request's own chat template"),
    ("/v1/chat/completions", {"model": "llm", "messages": [{"role": "user", "content": [{"type": "text"}]}]}, 400,
     "messages[0].content[0].text", "messages[0].content[0].text must be a string, got null"),
    ("/v1/chat/completions", {"model": "llm", "messages": [{"role": "user", "content": ["hi"]}]}, 400,
     "messages[0].content[0]", "must be an object with a string 'type'"),
    ("/v1/chat/completions", {"model": "llm", "messages": [{"role": "user", "content": []}]}, 400,
     "messages[0].content", "messages[0].content must hold at least one part"),
    ("/v1/chat/completions", {"model": "rag", "messages": HELLO, "guided_regex": "[a-z]+"}, 400, "guided_regex",
     "guided_regex is not available from model 'rag'"),
    ("/v1/chat/completions", {"model": "rag", "messages": HELLO, "max_tokens": 5000}, 400, "max_tokens",
     "This model's maximum context length is 2048 tokens: max_tokens: with the chat template the question takes"),
    ("/v1/chat/completions", {"model": "llm", "messages": HELLO, "stop": ["a" * 70_000]}, 400, "stop",
     "the sampling fields take 70"),
    ("/v1/chat/completions", {"model": "llm", "messages": HELLO, "truncate_prompt_tokens": 0}, 400,
     "truncate_prompt_tokens", "truncate_prompt_tokens must be"),
    ("/v1/chat/completions", {"model": "m" * 20_000, "messages": HELLO}, 404, "model", "does not exist"),
    ("/v1/chat/completions", {"model": "llm", "messages": HELLO, "logprobs": True, "top_logprobs": 21}, 400,
     "top_logprobs", "top_logprobs must be in [0, 20], got 21"),
    ("/v1/chat/completions", {"model": "llm", "messages": HELLO, "x": json.loads("[" * 20 + "]" * 20)}, 400, "x",
     "x nests 19 levels of lists and objects; the llm takes at most 14"),
    ("/detokenize", {"model": "llm", "tokens": [100, 99999]}, 400, "tokens", "input 'tokens' holds 99999 at index 1"),
    ("/v1/chat/completions", {"model": "llm", "messages": HELLO, "seed": 2**64}, 400, "seed",
     "seed must fit in 64 bits (-9223372036854775808 to 9223372036854775807), got 18446744073709551616"),
    ("/v1/completions", {"model": "llm", "prompt": "x", "seed": -2**63 - 1}, 400, "seed", "seed must fit in 64 bits"),
    ("/v1/chat/completions", {"model": "rag", "messages": HELLO, "seed": 2**70}, 400, "seed", "seed must fit"),
    ("/v1/chat/completions", {"model": "llm", "messages": HELLO, "max_completion_tokens": 0}, 400,
     "max_completion_tokens", "max_completion_tokens must be >= 1, got 0"),
    ("/v1/completions", {"model": "llm", "prompt": "x", "cache_salt": "s"}, 400, "cache_salt",
     "'cache_salt' is not supported by this server (prefix-cache isolation by salt)"),
    ("/v1/completions", {"model": "llm", "prompt": "x", "logits_processors": 0}, 400, "logits_processors",
     "'logits_processors' is not supported"),   # only JSON's false passes as not asked for
    ("/v1/chat/completions", {"model": "llm", "messages": HELLO, "foo-bar": 1}, 400, "foo-bar",
     "unknown sampling parameter(s) ['foo-bar']"),
])
def test_errors_are_openai_error_objects_naming_the_parameter(triton_server, path, body, status, param, words):
    generates = path in ("/v1/chat/completions", "/v1/completions")
    for sent in ({**body, "stream": body.get("stream", False)}, {**body, "stream": body.get("stream", True)}) \
            if generates else (body,):   # streamed, the refusal comes before the first event
        response = post(triton_server, path, sent)
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["param"] == param, error
        assert words in error["message"], error


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", b'{"model": "llm", "messages": [{"role": "user", "content": "hi \\ud800"}]}',
     "messages[0].content"),
    ("/v1/chat/completions", b'{"model": "llm", "messages": [{"role": "user", "content": "hi"}], "stream": true, '
                             b'"request_id": "\\udc00"}', "request_id"),
    ("/v1/completions", b'{"model": "llm", "prompt": ["ok", "x\\ud800"]}', "prompt[1]"),
    ("/v1/chat/completions", b'{"model": "\\ud800", "messages": []}', "model"),
])
def test_strings_of_a_lone_surrogate_are_refused_naming_the_field(triton_server, path, body, param):
    """JSON's \\ud800 escape is valid JSON, but decodes to no text: 400, where it was a 500 (or a stream cut
    after its 200)."""
    response = post(triton_server, path, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and f"{param} holds a lone surrogate escape" in error["message"], error


def test_fields_not_served_pass_at_false_and_are_not_sent_to_the_llm(triton_server):
    for path, body in (("/v1/chat/completions", {"model": "llm", "messages": HELLO}),
                       ("/v1/completions", {"model": "llm", "prompt": "x"})):
        response = post(triton_server, path, {**body, "max_tokens": 2, "return_token_ids": False})
        assert response.status_code == 200, response.text


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", None])
def test_a_body_not_sent_as_json_is_refused(triton_server, content_type):
    """What a browser sends to any origin without a preflight: no other web page drives an open server."""
    body = json.dumps({"model": "llm", "messages": HELLO, "max_tokens": 2}).encode()
    response = httpx.post(f"{triton_server.openai_url}/v1/chat/completions", content=body, timeout=60,
                          headers={"Content-Type": content_type} if content_type else {})
    assert response.status_code == 415, response.text
    error = response.json()["error"]
    assert error["code"] == "unsupported_media_type" and "must be sent as Content-Type application/json" in \
        error["message"]
    charset = post(triton_server, "/v1/chat/completions", content=body,
                   headers={"Content-Type": "Application/JSON; charset=utf-8"})
    assert charset.status_code == 200, charset.text


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", b'{"model": "llm", "messages": [{"role": "user", "content": "a\xed\xa0\x80"}]}'),
    ("/v1/embeddings", b'{"model": "embed", "input": "a\xed\xa0\x80"}'),
    ("/v1/rerank", b'{"model": "rerank", "query": "q", "documents": ["a\xed\xbf\xbf"]}'),
])
def test_utf8_encoded_surrogates_are_not_utf8(triton_server, path, body):
    """Python's json.loads takes bytes ED A0 80 as a lone surrogate; strict UTF-8 (RFC 3629) refuses them."""
    response = post(triton_server, path, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    assert "the request body is not UTF-8" in response.json()["error"]["message"]


def test_a_lone_surrogate_in_a_tool_calls_arguments_is_refused_naming_them(triton_server):
    """The arguments are JSON text inside the body's JSON: their escape reaches the frontend as text."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": "\\ud800"}'}}
    messages = [HELLO[0], {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "2"}]
    for path, body in (("/v1/chat/completions", {"model": "llm", "messages": messages, "max_tokens": 2}),
                       ("/tokenize", {"model": "llm", "messages": messages})):
        response = post(triton_server, path, body)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "messages[1].tool_calls[0].function.arguments.a"


@pytest.mark.parametrize("arguments,status,words", [
    ('{"a": ' + "[" * 9 + "]" * 9 + "}", 200, ""),   # 10 levels: the deepest the llm's messages input holds there
    ('{"a": ' + "[" * 10 + "]" * 10 + "}", 400, "function.arguments nests 11 levels deep; the limit there is 10"),
    ('{"a": ' + "[" * 3000 + "]" * 3000 + "}", 400, "nests 3001 levels deep"),   # was a RecursionError
    ('{"a": NaN}', 400, "function.arguments is not valid JSON: NaN is not a JSON number"),
    (json.loads('{"a": ' + "[" * 10 + "]" * 10 + "}"), 400, "nests 11 levels deep; the limit there is 10"),  # an object
])
def test_a_tool_calls_arguments_are_parsed_as_strictly_as_the_body(triton_server, arguments, status, words):
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    messages = [HELLO[0], {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "2"}]
    for path, body in (("/v1/chat/completions", {"model": "llm", "messages": messages, "max_tokens": 2}),
                       ("/tokenize", {"model": "llm", "messages": messages})):
        response = post(triton_server, path, body)
        assert response.status_code == status, response.text
        if status != 200:
            error = response.json()["error"]
            assert error["param"] == "messages[1].tool_calls[0].function.arguments" and words in error["message"]


def test_streamed_text_offsets_are_the_whole_answers_after_a_stop_strings_cut(triton_server):
    asked = {"model": "llm", "prompt": "The KV cache", "max_tokens": 12, "temperature": 0, "ignore_eos": True,
             "logprobs": 1}
    text = post(triton_server, "/v1/completions", asked).json()["choices"][0]["text"]
    for stop in (text[3:5], text[7:8]):   # likely inside a token: its cut keeps the token
        whole = post(triton_server, "/v1/completions", {**asked, "stop": [stop]}).json()["choices"][0]["logprobs"]
        events = sse(post(triton_server, "/v1/completions", {**asked, "stop": [stop], "stream": True}))
        chunks = [json.loads(e)["choices"] for e in events[:-1]]
        streamed = [c[0]["logprobs"] for c in chunks if c and c[0]["logprobs"]]
        assert [t for lp in streamed for t in lp["tokens"]] == whole["tokens"], stop
        assert [o for lp in streamed for o in lp["text_offset"]] == whole["text_offset"], stop


def test_nan_infinity_and_numbers_past_a_double_are_not_json(triton_server):
    for literal, words in ((b"NaN", "NaN is not a JSON number"), (b"Infinity", "Infinity is not a JSON number"),
                           (b"-Infinity", "Infinity is not a JSON number"),
                           (b"1e400", "1e400 is past a double's range")):
        response = post(triton_server, "/v1/chat/completions", headers={"Content-Type": "application/json"},
                        content=b'{"model": "llm", "messages": [{"role": "user", "content": "hi"}], "temperature": '
                                + literal + b"}")
        assert response.status_code == 400, response.text
        assert words in response.json()["error"]["message"]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-32-be"])
def test_json_in_another_encoding_than_utf8_is_refused(triton_server, encoding):
    """RFC 8259's rule; Python's parser would take it, and a \\ud800 in it past the surrogate check."""
    body = '{"model": "embed", "input": "hi \\ud800"}'.encode(encoding)
    response = post(triton_server, "/v1/embeddings", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and "must be JSON in UTF-8, got utf-" in response.json()["error"]["message"]


def test_bodies_past_the_limits_are_refused_before_parsing(triton_server):
    too_big = post(triton_server, "/v1/chat/completions", content=b" " * ((4 << 20) + 1),
                   headers={"Content-Type": "application/json"})
    assert too_big.status_code == 413 and "the limit is 4194304 (max_body_bytes)" in too_big.json()["error"]["message"]
    deep = post(triton_server, "/v1/embeddings", content=b"[" * 10_000 + b"]" * 10_000)
    assert deep.status_code == 400 and "the limit is 32 (max_json_depth)" in deep.json()["error"]["message"]
    for content in (b"{", b"\xff\xfe", b"[]", b"null"):
        assert post(triton_server, "/v1/completions", content=content).status_code == 400
    wrong_method = httpx.get(f"{triton_server.openai_url}/v1/chat/completions")
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["type"] == "invalid_request_error"
    assert post(triton_server, "/v2/models/llm/infer", {}).json()["error"]["code"] == "not_found"


def test_a_full_llm_queue_is_503_with_retry_after(triton_server):
    """llm_small_queue runs 2 sequences and lets 2 wait: of 8 requests at once, the overflow is refused."""
    async def main():
        async with httpx.AsyncClient(timeout=120) as client:
            body = {"model": "llm_small_queue", "messages": HELLO, "max_tokens": 40, "stream": True,
                    "ignore_eos": True}
            return await asyncio.gather(*(client.post(f"{triton_server.openai_url}/v1/chat/completions", json=body)
                                          for _ in range(8)))

    responses = asyncio.run(main())
    statuses = sorted(r.status_code for r in responses)
    assert 200 in statuses and 503 in statuses and set(statuses) == {200, 503}, statuses
    for refused in (r for r in responses if r.status_code == 503):
        assert refused.headers["retry-after"] == "1"
        assert "waiting queue is full (max_waiting=2)" in refused.json()["error"]["message"]


@pytest.mark.parametrize("model,stream", [("llm", True), ("llm", False), ("rag", True), ("rag", False)])
def test_a_client_that_goes_away_frees_its_llm_requests(triton_server, model, stream):
    """8 long generations, their clients gone once all run: within 1 s the llm runs none and its KV blocks
    are free, the gauges' staleness (metrics_interval_s, 0.25 s) included (uncancelled, these run about 4 s (rag) to 10 s (llm) here). `rag`: Triton 2.51's ensemble does
    not pass the cancellation on to rag_generate's running step; the frontend aborts the generation by its
    cancel key."""
    metrics = triton_server.metrics_url
    wait_for_metric(metrics, RUNNING, "llm", lambda v: v == 0)
    left_before = clients_gone(triton_server, model)
    body = {"model": model, "messages": [{"role": "user", "content": "How does paged attention store the KV cache?"}],
            "max_tokens": 450 if model == "rag" else 1500, "ignore_eos": True, "stream": stream}

    async def main():
        async with httpx.AsyncClient(timeout=120) as client:
            async def hold():
                async with client.stream("POST", f"{triton_server.openai_url}/v1/chat/completions", json=body):
                    await asyncio.sleep(120)

            holding = [asyncio.ensure_future(hold()) for _ in range(8)]
            await asyncio.to_thread(wait_for_metric, metrics, RUNNING, "llm", lambda v: v == 8, 60)
            for task in holding:
                task.cancel()
            await asyncio.gather(*holding, return_exceptions=True)

    asyncio.run(main())
    gone = time.monotonic()
    wait_for_metric(metrics, RUNNING, "llm", lambda v: v == 0, timeout_s=10)
    wait_for_metric(metrics, KV_USED, "llm", lambda v: v == 0, timeout_s=10)
    assert time.monotonic() - gone < 1.0
    deadline = time.monotonic() + 10   # counted as the frontend ends each answer
    while clients_gone(triton_server, model) < left_before + 8 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert clients_gone(triton_server, model) == left_before + 8   # mid-stream too: 499, not a success


def clients_gone(server, model: str) -> float:
    """The frontend's count of chat requests whose clients went away (ragstack_openai_errors_total, 499)."""
    text = httpx.get(f"{server.openai_url}/metrics", timeout=10).text
    line = f'ragstack_openai_errors_total{{endpoint="/v1/chat/completions",model="{model}",status="499"}} '
    return next((float(row.removeprefix(line)) for row in text.splitlines() if row.startswith(line)), 0.0)
