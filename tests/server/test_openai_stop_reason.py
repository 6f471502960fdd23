"""vLLM's `stop_reason` and `include_stop_str_in_output` through the official `openai` package against the
session server's frontend: every chat and completions choice names the stop string or the stop token id that
ended it, null for max_tokens and the eos; streamed, on the chunk with the finish_reason (null on the others);
include_stop_str_in_output keeps the stop string; rag relays its llm's. The tiny demo llm is random: the stop
strings and tokens come from its greedy answers."""
from __future__ import annotations

import json

import pytest
from openai import BadRequestError

from llm_streams import StreamSession, llm_inputs
from server_helpers import TINY_LLM

pytestmark = pytest.mark.server
HELLO = [{"role": "user", "content": "Hello, who are you?"}]
PROMPT = "The capital of France is"
GREEDY = {"temperature": 0.0, "max_tokens": 12}
LONG = {"ignore_eos": True}   # the whole max_tokens, whatever the random model samples


def stop_string(text: str) -> str:
    """Two ASCII letters of a greedy answer, after its start."""
    at = next(i for i in range(1, len(text) - 1) if text[i:i + 2].isascii() and text[i:i + 2].isalpha())
    return text[at:at + 2]


def greedy_ids(triton_server, **prompt) -> list[int]:
    """The llm's greedy answer as token ids: its logprobs output names each sampled token."""
    session = StreamSession(triton_server.grpc_url)
    try:
        c = session.send("ids", llm_inputs(**prompt, stream=False, sampling={**GREEDY, **LONG, "logprobs": 0},
                                           extra={"return_logprobs": (True, "BOOL"),
                                                  "exclude_input_in_output": (True, "BOOL")}))
        session.wait_all(120)
    finally:
        session.close()
    return [int(list(entry)[-1]) for entry in json.loads(c.results[-1].as_numpy("logprobs")[0])]


def reasons(chunks) -> list:
    """Each chunk choice's (finish_reason, stop_reason), the stop_reason key required."""
    return [(c.choices[0].finish_reason, c.choices[0].model_extra["stop_reason"]) for c in chunks if c.choices]


def check_stream(chunks, finish_reason: str, stop_reason) -> None:
    """The chunk with the finish_reason carries the stop_reason; every other chunk null."""
    *before, last = reasons(chunks)
    assert last == (finish_reason, stop_reason) and all(pair == (None, None) for pair in before)


def chat(client, **kw):
    return client.chat.completions.create(model="llm", messages=HELLO, **{**GREEDY, **kw})


def complete(client, **kw):
    return client.completions.create(model="llm", prompt=PROMPT, **{**GREEDY, **kw})


def test_chat_names_the_stop_string_and_keeps_it_when_asked(client):
    full = chat(client, extra_body=LONG).choices[0]
    assert (full.finish_reason, full.model_extra["stop_reason"]) == ("length", None)
    text = full.message.content
    stop = stop_string(text)
    at = text.index(stop)
    for include, shown in ((False, text[:at]), (True, text[:at + len(stop)])):
        body = {**LONG, "include_stop_str_in_output": include}
        cut = chat(client, stop=[stop], extra_body=body).choices[0]
        assert (cut.message.content, cut.finish_reason, cut.model_extra["stop_reason"]) == (shown, "stop", stop)
        chunks = list(chat(client, stop=[stop], extra_body=body, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == shown
        check_stream(chunks, "stop", stop)
    check_stream(list(chat(client, extra_body=LONG, stream=True)), "length", None)


def test_completions_name_the_stop_string_and_keep_it_when_asked(client):
    full = complete(client, extra_body=LONG).choices[0]
    assert (full.finish_reason, full.model_extra["stop_reason"]) == ("length", None)
    stop = stop_string(full.text)
    at = full.text.index(stop)
    for include, shown in ((False, full.text[:at]), (True, full.text[:at + len(stop)])):
        body = {**LONG, "include_stop_str_in_output": include}
        cut = complete(client, stop=stop, extra_body=body).choices[0]
        assert (cut.text, cut.finish_reason, cut.model_extra["stop_reason"]) == (shown, "stop", stop)
        chunks = list(complete(client, stop=stop, extra_body=body, stream=True))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == shown
        check_stream(chunks, "stop", stop)
    check_stream(list(complete(client, extra_body=LONG, stream=True)), "length", None)


def test_a_stop_token_is_named_by_its_id(client, triton_server):
    for ids, create in ((greedy_ids(triton_server, messages=HELLO), chat),
                        (greedy_ids(triton_server, prompt=PROMPT), complete)):
        token = ids[2]
        body = {**LONG, "stop_token_ids": [token]}
        answer = create(client, extra_body=body)
        choice = answer.choices[0]
        assert (choice.finish_reason, choice.model_extra["stop_reason"]) == ("stop", token)
        assert answer.usage.completion_tokens == ids.index(token) + 1   # the stop token is the last
        check_stream(list(create(client, extra_body=body, stream=True)), "stop", token)


def test_the_eos_gives_null(client):
    """The eos, forced first by logit_bias, ends the answer with finish_reason stop and no stop_reason (vLLM's None)."""
    eos = json.loads((TINY_LLM / "generation_config.json").read_text())["eos_token_id"]
    choice = chat(client, logit_bias={str(eos): 100}).choices[0]
    assert (choice.message.content, choice.finish_reason, choice.model_extra["stop_reason"]) == ("", "stop", None)
    check_stream(list(complete(client, logit_bias={str(eos): 100}, stream=True)), "stop", None)


def test_include_stop_str_in_output_takes_a_bool_only(client):
    with pytest.raises(BadRequestError) as refused:
        chat(client, extra_body={"include_stop_str_in_output": "yes"})
    assert refused.value.body["param"] == "include_stop_str_in_output"


def test_rag_relays_its_llms_stop_reason(client):
    rag = {"model": "rag", "messages": [{"role": "user", "content": "How does paged attention store the KV cache?"}],
           **GREEDY}
    full = client.chat.completions.create(**rag, extra_body=LONG).choices[0]
    assert (full.finish_reason, full.model_extra["stop_reason"]) == ("length", None)
    stop = stop_string(full.message.content)
    cut = client.chat.completions.create(**rag, stop=[stop], extra_body=LONG).choices[0]
    assert (cut.finish_reason, cut.model_extra["stop_reason"]) == ("stop", stop)
    assert cut.message.content == full.message.content[:full.message.content.index(stop)]
    check_stream(list(client.chat.completions.create(**rag, stop=[stop], extra_body=LONG, stream=True)), "stop", stop)
