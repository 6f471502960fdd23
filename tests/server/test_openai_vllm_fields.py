"""What clients written for vLLM's and OpenAI's servers send beyond the basics, through the official
`openai` package and raw HTTP against the session server's frontend: explicit nulls, vLLM's chat-template
fields and fixed-value fields, continuous usage, history sent back with the answers' own keys, answers
as long as the context allows, the context-length error's code, echo with max_tokens 0 and of a cut prompt, the chunks a
streamed chat starts with, and vLLM's /ping and /version."""
from __future__ import annotations

import importlib.metadata
import json

import httpx2 as httpx
import pytest
from openai import BadRequestError

pytestmark = pytest.mark.server
HELLO = [{"role": "user", "content": "Hello, who are you?"}]
MAX_MODEL_LEN = 2048   # model_repository/llm/config.pbtxt


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.openai_url}{path}", json=body, timeout=120)


def events(response: httpx.Response) -> list[dict]:
    data = [e.removeprefix("data: ") for e in response.text.split("\n\n") if e]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def prompt_tokens(client, messages, **extra) -> int:
    return client.chat.completions.create(model="llm", messages=messages, max_tokens=1,
                                          extra_body=extra).usage.prompt_tokens


def test_a_chat_without_max_tokens_answers_up_to_the_context_s_end(client):
    """As OpenAI and vLLM: no max_tokens is the room the context leaves, not the llm's default of 16."""
    def words(n: int) -> list[dict]:
        return [{"role": "user", "content": "word " * n}]

    hundred = prompt_tokens(client, words(100))
    per_word = (prompt_tokens(client, words(200)) - hundred) / 100
    messages = words(100 + int((MAX_MODEL_LEN - 60 - hundred) / per_word))   # some 60 tokens left to answer
    used = prompt_tokens(client, messages)
    answer = client.chat.completions.create(model="llm", messages=messages, extra_body={"ignore_eos": True})
    assert answer.usage.completion_tokens == MAX_MODEL_LEN - used > 16
    assert answer.choices[0].finish_reason == "length"


def test_explicit_nulls_are_the_defaults(triton_server):
    for path, body in (("/v1/chat/completions", {"messages": HELLO, "logprobs": None, "top_logprobs": None}),
                       ("/v1/completions", {"prompt": "Hello", "echo": None, "logprobs": None})):
        response = post(triton_server, path, {"model": "llm", "max_tokens": 2, "n": None, "stream": None,
                                              "stream_options": None, "user": None, "seed": None, **body})
        assert response.status_code == 200, response.text
        assert len(response.json()["choices"]) == 1
    streamed = post(triton_server, "/v1/completions", {"model": "llm", "prompt": "Hello", "max_tokens": 2,
                                                       "stream": True, "stream_options": {"include_usage": None}})
    assert streamed.status_code == 200 and all("usage" not in chunk for chunk in events(streamed))


def test_vllm_s_chat_template_fields_reach_the_template(client):
    with_prompt = prompt_tokens(client, HELLO)
    without = prompt_tokens(client, HELLO, add_generation_prompt=False)
    assert without < with_prompt   # the assistant turn's opening is left out
    prefix = [*HELLO, {"role": "assistant", "content": "I am"}]
    continued = prompt_tokens(client, prefix, add_generation_prompt=False, continue_final_message=True)
    closed = prompt_tokens(client, prefix, add_generation_prompt=False)
    assert continued < closed   # the last message is left open: no end of turn after it
    assert prompt_tokens(client, prefix, continue_final_message=True) == continued   # no generation prompt then
    assert prompt_tokens(client, HELLO, chat_template_kwargs={"enable_thinking": False}) == with_prompt
    with pytest.raises(BadRequestError) as both:
        prompt_tokens(client, prefix, continue_final_message=True, add_generation_prompt=True)
    assert both.value.body["param"] == "continue_final_message" and "Cannot set both" in both.value.message


@pytest.mark.parametrize("field,value", [("priority", 1), ("add_special_tokens", True), ("echo", True),
                                         ("return_tokens_as_token_ids", True), ("cache_salt", "x")])
def test_vllm_s_fields_at_other_values_than_served_are_refused_by_name(client, field, value):
    with pytest.raises(BadRequestError) as refused:
        prompt_tokens(client, HELLO, **{field: value})
    assert refused.value.body["param"] == field and field in refused.value.message


def test_vllm_s_fields_at_their_defaults_and_request_id(client):
    answer = client.chat.completions.create(
        model="llm", messages=HELLO, max_tokens=2,
        extra_body={"priority": 0, "add_special_tokens": False, "echo": False, "request_id": "abc-1",
                    "include_stop_str_in_output": False, "spaces_between_special_tokens": True,
                    "use_beam_search": False, "length_penalty": 1.0})
    assert answer.id == "chatcmpl-abc-1" and answer.choices[0].message.content is not None
    completion = client.completions.create(model="llm", prompt="Hello", max_tokens=2,
                                           extra_body={"add_special_tokens": True, "request_id": "abc-2"})
    assert completion.id == "cmpl-abc-2"


def test_history_sent_back_with_the_answers_own_keys_is_taken(client):
    history = [*HELLO, {"role": "assistant", "content": "Hi.", "refusal": None, "audio": None,
                        "annotations": [], "reasoning_content": "greet"}, {"role": "user", "content": "And?"}]
    plain = [*HELLO, {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "And?"}]
    assert prompt_tokens(client, history) == prompt_tokens(client, plain)


def test_continuous_usage_stats_put_each_choices_usage_so_far_on_its_chunks(triton_server):
    """As vLLM: a choice's chunk carries that choice's output so far (0 on its role chunk), the last the sums."""
    for path, asked in (("/v1/chat/completions", {"messages": HELLO}), ("/v1/completions", {"prompt": "hi"})):
        response = post(triton_server, path, {
            "model": "llm", **asked, "max_tokens": 5, "n": 2, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True, "include_obfuscation": False}})
        chunks = events(response)
        prompt = chunks[-1]["usage"]["prompt_tokens"]
        assert not chunks[-1]["choices"] and chunks[-1]["usage"] == {
            "prompt_tokens": prompt, "completion_tokens": 10, "total_tokens": prompt + 10}
        for index in (0, 1):
            mine = [c for c in chunks[:-1] if c["choices"][0]["index"] == index]
            counts = [c["usage"]["completion_tokens"] for c in mine]
            assert counts == sorted(counts) and counts[-1] == 5, (path, counts)
            assert all(c["usage"]["prompt_tokens"] == prompt for c in mine)
            if path == "/v1/chat/completions":
                assert counts[0] == 0 and mine[0]["choices"][0]["delta"].get("role") == "assistant"


def test_a_streamed_chat_starts_each_choice_with_its_role_alone(triton_server):
    chunks = events(post(triton_server, "/v1/chat/completions",
                         {"model": "llm", "messages": HELLO, "max_tokens": 3, "n": 2, "stream": True}))
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""} and mine[0]["finish_reason"] is None
        assert all("role" not in c["delta"] for c in mine[1:]) and mine[-1]["finish_reason"] == "length"
    assert all(c["system_fingerprint"] is None and c["object"] == "chat.completion.chunk" for c in chunks)


def test_a_prompt_past_the_context_is_context_length_exceeded(client):
    for extra in ({"messages": [{"role": "user", "content": "word " * 3000}]},
                  {"messages": HELLO, "max_tokens": MAX_MODEL_LEN}):
        with pytest.raises(BadRequestError) as refused:
            client.chat.completions.create(model="llm", **extra)
        assert refused.value.code == "context_length_exceeded"
        assert f"maximum context length is {MAX_MODEL_LEN} tokens" in refused.value.message


def test_top_logprobs_0_without_logprobs_is_off(client):
    answer = client.chat.completions.create(model="llm", messages=HELLO, max_tokens=2, top_logprobs=0)
    assert answer.choices[0].logprobs is None


@pytest.mark.parametrize("stream", [False, True])
def test_echo_with_max_tokens_0_answers_the_prompt_with_its_scores(client, stream):
    prompt = "The capital of France is"
    scored = client.completions.create(model="llm", prompt=prompt, echo=True, logprobs=1, max_tokens=1)
    if stream:
        chunks = list(client.completions.create(model="llm", prompt=prompt, echo=True, logprobs=1, max_tokens=0,
                                                stream=True, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
        reason, usage = [c.choices[0].finish_reason for c in chunks if c.choices][-1], chunks[-1].usage
    else:
        answer = client.completions.create(model="llm", prompt=prompt, echo=True, logprobs=1, max_tokens=0)
        text, tokens = answer.choices[0].text, answer.choices[0].logprobs.tokens
        reason, usage = answer.choices[0].finish_reason, answer.usage
    assert text == prompt and reason == "length" and usage.completion_tokens == 0
    assert tokens == scored.choices[0].logprobs.tokens[:len(tokens)] and len(tokens) == usage.prompt_tokens


@pytest.mark.parametrize("logprobs", [None, 0])
def test_echo_of_a_prompt_cut_by_truncate_prompt_tokens_is_what_the_llm_read(client, logprobs):
    prompt = "Hello world this is a long prompt"
    answer = client.completions.create(model="llm", prompt=prompt, echo=True, logprobs=logprobs, max_tokens=2,
                                       temperature=0, extra_body={"truncate_prompt_tokens": 3})
    choice = answer.choices[0]
    assert answer.usage.prompt_tokens == 3
    kept = choice.text[:len(choice.text) - len(client.completions.create(
        model="llm", prompt=prompt, max_tokens=2, temperature=0,
        extra_body={"truncate_prompt_tokens": 3}).choices[0].text)]
    assert kept and prompt.endswith(kept) and kept != prompt
    if logprobs is not None:
        assert "".join(choice.logprobs.tokens) == choice.text
        assert choice.logprobs.text_offset == [sum(map(len, choice.logprobs.tokens[:i]))
                                               for i in range(len(choice.logprobs.tokens))]


def test_vllm_s_ping_and_version_answer_without_a_key(triton_server):
    assert httpx.get(f"{triton_server.openai_url}/version", timeout=10).json() == {
        "version": importlib.metadata.version("ragstack")}
    for method in ("GET", "POST"):
        assert httpx.request(method, f"{triton_server.openai_url}/ping", timeout=10).json() == {"status": "ok"}


def test_without_a_model_the_one_that_serves_the_endpoint_answers(triton_server, client):
    served = {m.id for m in client.models.list()}
    llms = sorted(name for name in served if name.startswith("llm"))
    response = post(triton_server, "/v1/completions", {"prompt": "Hello", "max_tokens": 2})
    if len(llms) == 1:
        assert response.status_code == 200 and response.json()["model"] == llms[0]
    else:   # several llms: none is guessed
        error = response.json()["error"]
        assert response.status_code == 400 and error["param"] == "model"
        assert f"{len(llms)} models serve completions" in error["message"] and all(n in error["message"] for n in llms)
    for unnamed in ({}, {"model": ""}):   # vLLM's rule takes an empty name as none
        embedded = post(triton_server, "/v1/embeddings", {"input": "Hello", **unnamed})
        assert embedded.status_code == 200 and embedded.json()["model"] == "embed"


def test_rag_takes_vllm_s_template_fields_at_their_defaults_and_names_any_other(triton_server):
    defaults = {"add_generation_prompt": True, "documents": [], "chat_template_kwargs": {}, "continue_final_message":
                False}
    body = {"model": "rag", "messages": [{"role": "user", "content": "What is paged attention?"}], "max_tokens": 2}
    assert post(triton_server, "/v1/chat/completions", {**body, **defaults}).status_code == 200
    for field, value in (("add_generation_prompt", False), ("documents", [{"text": "x"}]),
                         ("chat_template_kwargs", {"enable_thinking": False})):
        refused = post(triton_server, "/v1/chat/completions", {**body, field: value})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == field


def test_rag_names_a_blank_or_long_question_and_takes_a_text_response_format(triton_server):
    ask = {"model": "rag", "max_tokens": 2}
    for content, stream in (("   \n\t ", False), ("", True), ([{"type": "text", "text": " "}], False)):
        messages = [{"role": "user", "content": "What is paged attention?"}, {"role": "assistant", "content": "x"},
                    {"role": "user", "content": content}]
        refused = post(triton_server, "/v1/chat/completions", {**ask, "messages": messages, "stream": stream})
        error = refused.json()["error"]
        assert refused.status_code == 400 and error["param"] == "messages[2].content", error
        assert "messages[2].content is blank" in error["message"]
    for content, says in (("a " * 9000, "messages[1].content is 18000 bytes; the limit is 16384"),   # the embedder's
                          ("a" * 2001, "messages[1].content: 2001 characters; the limit is 2000")):   # max_query_chars
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": content}]
        long = post(triton_server, "/v1/chat/completions", {**ask, "messages": messages})
        error = long.json()["error"]
        assert long.status_code == 400 and error["param"] == "messages[1].content", long.text
        assert says in error["message"], error
    text = post(triton_server, "/v1/chat/completions", {**ask, "response_format": {"type": "text"},
                                                         "messages": [{"role": "user", "content": "What is FAISS?"}]})
    assert text.status_code == 200, text.text
    json_format = post(triton_server, "/v1/chat/completions", {**ask, "response_format": {"type": "json_object"},
                                                                "messages": [{"role": "user", "content": "Hi"}]})
    assert json_format.status_code == 400 and json_format.json()["error"]["param"] == "response_format"


def test_nulls_for_fields_not_served_are_not_given(triton_server):
    body = {"model": "llm", "messages": HELLO, "max_tokens": 2, "reasoning_effort": None, "cache_salt": None,
            "chat_template": None, "mm_processor_kwargs": None}
    assert post(triton_server, "/v1/chat/completions", body).status_code == 200


@pytest.mark.parametrize("extra,param,words", [
    ({"request_id": "x" * 257}, "request_id", "the limit is 256"),
    ({"continue_final_message": True}, "continue_final_message", "messages[0] is a 'user' message"),
    ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs", "'tools'"),
    ({"documents": [{"text": "x" * 70000}]}, "documents", "the limit is 65536"),
], ids=["request_id", "continue_final_message", "reserved", "documents"])
def test_template_and_id_refusals_name_the_field_sent(triton_server, extra, param, words):
    refused = post(triton_server, "/v1/chat/completions", {"model": "llm", "messages": HELLO, "max_tokens": 2, **extra})
    error = refused.json()["error"]
    assert refused.status_code == 400 and error["param"] == param and words in error["message"], error
