"""LangChain's own OpenAI classes (`langchain-openai`: ChatOpenAI, OpenAI, OpenAIEmbeddings), unchanged, against
the session server's frontend, as an application uses them: invoke, stream, batch and their async forms answer
what the official `openai` package gets for the same request; sampling keys, n, logprobs, the context-length
error, tools with a tool-result round trip, structured output by JSON schema and by function calling, the rag
model, and embeddings in batches. Embeddings run with `check_embedding_ctx_length=False`, LangChain's setting
for servers that are not OpenAI (it would otherwise tokenize with tiktoken, whose encodings are downloaded)."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from client_lib_models import Town, Weather
from server_helpers import assert_embeddings_as_direct, chat_prompt_tokens

pytestmark = pytest.mark.server
HELLO = "Hello, who are you?"
GREEDY = {"temperature": 0.0, "max_tokens": 8, "seed": 1, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def chat(triton_server):
    """ChatOpenAI as pointed at any OpenAI-compatible server: base_url, api_key, model."""
    from langchain_openai import ChatOpenAI

    def make(**kwargs):
        return ChatOpenAI(base_url=f"{triton_server.openai_url}/v1", api_key="unused", max_retries=0, timeout=120,
                          **{"model": "llm", **kwargs})
    return make


def test_invoke_stream_and_batch_answer_as_the_openai_client(chat, client):
    """Greedy: one answer whichever way it is asked; usage as the frontend counts it."""
    direct = client.chat.completions.create(model="llm", messages=[{"role": "user", "content": HELLO}], **GREEDY)
    llm = chat(**GREEDY)
    answer = llm.invoke(HELLO)
    usage = answer.usage_metadata
    assert answer.content == direct.choices[0].message.content and answer.response_metadata["finish_reason"] == "length"
    assert usage["input_tokens"] == direct.usage.prompt_tokens
    assert usage["output_tokens"] == 8 and usage["total_tokens"] == direct.usage.total_tokens
    chunks = list(chat(**GREEDY, stream_usage=True).stream(HELLO))
    assert "".join(c.content for c in chunks) == answer.content and len(chunks) > 1   # merged under load
    whole = sum(chunks[1:], chunks[0])
    assert whole.usage_metadata == answer.usage_metadata and whole.response_metadata["finish_reason"] == "length"
    assert [m.content for m in llm.batch([HELLO, "Another question"])][0] == answer.content

    async def both():
        fresh = chat(**GREEDY)   # an async client per event loop
        return (await fresh.ainvoke(HELLO)).content, "".join([c.content async for c in fresh.astream(HELLO)])
    assert asyncio.run(both()) == (answer.content, answer.content)


def test_the_completions_class_answers_as_the_openai_client(triton_server, client):
    """langchain-openai's `OpenAI` (completions; it sends the prompts as a list, in batches of batch_size)."""
    from langchain_openai import OpenAI

    prompts = [HELLO, "The KV cache", "Paged attention"]
    direct = client.completions.create(model="llm", prompt=prompts, **GREEDY)
    llm = OpenAI(base_url=f"{triton_server.openai_url}/v1", api_key="unused", model="llm", max_retries=0,
                 batch_size=2, **GREEDY)
    result = llm.generate(prompts)
    assert [g[0].text for g in result.generations] == [c.text for c in direct.choices]
    assert result.llm_output["token_usage"]["completion_tokens"] == 24
    assert "".join(llm.stream(HELLO)) == direct.choices[0].text


def test_stop_seed_and_max_tokens_reach_the_llm(chat):
    long = chat(**{**GREEDY, "max_tokens": 12}).invoke(HELLO).content
    at = next(i for i in range(1, len(long) - 1) if long[i:i + 2].isascii() and long[i:i + 2].isalpha())
    cut = chat(**{**GREEDY, "max_tokens": 12}).invoke(HELLO, stop=[long[at:at + 2]])
    assert cut.content == long[:at] and cut.response_metadata["finish_reason"] == "stop"
    sampled = [chat(temperature=1.0, seed=seed, max_tokens=6).invoke(HELLO).content for seed in (3, 3, 4)]
    assert sampled[0] == sampled[1] != sampled[2]


def test_a_prompt_past_the_context_is_an_invalid_request_with_openais_code(chat):
    """LangChain's invalid-request error, OpenAI's code on it. (LangChain raises its ContextOverflowError when
    str(error) holds that code: openai 2's errors print the body, openai 3's only its message.)"""
    from langchain_core.exceptions import ModelInvalidRequestError

    llm = chat(max_tokens=4)
    for ask in (llm.invoke, lambda text: list(llm.stream(text))):
        with pytest.raises(ModelInvalidRequestError) as refused:
            ask("word " * 3000)
        assert refused.value.code == "context_length_exceeded"
        assert "maximum context length is 2048 tokens" in refused.value.message


def test_n_choices_and_logprobs(chat, client):
    from langchain_core.messages import HumanMessage

    sampling = {"temperature": 1.0, "seed": 7, "max_tokens": 6}
    [generations] = chat(n=2, **sampling).generate([[HumanMessage(HELLO)]]).generations
    direct = client.chat.completions.create(model="llm", messages=[{"role": "user", "content": HELLO}], n=2, **sampling)
    assert [g.text for g in generations] == [c.message.content for c in direct.choices]
    answer = chat(logprobs=True, top_logprobs=2, **sampling).invoke(HELLO)
    tokens = answer.response_metadata["logprobs"]["content"]
    assert len(tokens) == answer.usage_metadata["output_tokens"]
    assert bytes(b for t in tokens for b in t["bytes"]).decode(errors="replace") == answer.content
    assert all(t["logprob"] <= 0 and len(t["top_logprobs"]) == 2 for t in tokens)


def test_bind_tools_calls_a_tool_and_reads_its_result(chat, client):
    """A named tool (tool_choice forces the call: the model is random), its arguments following the tool's
    schema; the result sent back as a ToolMessage reaches the template (the prompt counts as the three
    messages do); `any` streamed gives one call."""
    from langchain_core.messages import HumanMessage, ToolMessage

    question = [HumanMessage("What is the weather in Paris?")]
    tooled = chat(temperature=1.0, seed=1, max_tokens=200).bind_tools([Weather], tool_choice="Weather")
    called = tooled.invoke(question)
    [call] = called.tool_calls
    assert call["name"] == "Weather" and call["id"].startswith("call_") and not called.invalid_tool_calls
    Weather.model_validate(call["args"])
    assert called.response_metadata["finish_reason"] == "stop"   # a named function's call, as OpenAI ends it
    history = [*question, called, ToolMessage("sunny, 21 degrees", tool_call_id=call["id"])]
    answered = chat(**GREEDY).invoke(history)
    assert answered.content and not answered.tool_calls
    sent = [{"role": "user", "content": question[0].content},
            {"role": "assistant", "content": None, "tool_calls": [{"id": call["id"], "type": "function", "function": {
                "name": "Weather", "arguments": json.dumps(call["args"])}}]},
            {"role": "tool", "tool_call_id": call["id"], "content": "sunny, 21 degrees"}]
    prompt = answered.usage_metadata["input_tokens"]
    assert prompt == chat_prompt_tokens(client, sent) > chat_prompt_tokens(client, sent[:2])
    streamed = chat(temperature=1.0, seed=2, max_tokens=200).bind_tools(
        [Weather], tool_choice="any", parallel_tool_calls=False).stream(question)
    chunks = list(streamed)
    [call] = sum(chunks[1:], chunks[0]).tool_calls
    assert call["name"] == "Weather" and len(chunks) > 1
    Weather.model_validate(call["args"])


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_with_structured_output_gives_the_model(chat, method):
    structured = chat(temperature=1.0, seed=3, max_tokens=300).with_structured_output(Town, method=method,
                                                                                         include_raw=True)
    answer = structured.invoke("Describe a town.")
    assert answer["parsing_error"] is None and isinstance(answer["parsed"], Town), answer["raw"]
    assert answer["raw"].response_metadata["finish_reason"] == "stop"   # function_calling names the function


def test_rag_answers_through_chat_openai(chat, client):
    """The answer and usage of rag come through; its sources do not: ChatOpenAI keeps OpenAI's fields only."""
    question = "How does paged attention store the KV cache?"
    direct = client.chat.completions.create(model="rag", messages=[{"role": "user", "content": question}],
                                            **{**GREEDY, "max_tokens": 6})
    answer = chat(model="rag", **{**GREEDY, "max_tokens": 6}).invoke(question)
    assert answer.content == direct.choices[0].message.content and direct.choices[0].message.model_extra["sources"]
    assert answer.usage_metadata["input_tokens"] == direct.usage.prompt_tokens > 50
    streamed = chat(model="rag", **{**GREEDY, "max_tokens": 6}).stream(question)
    assert "".join(c.content for c in streamed) == answer.content


def test_openai_embeddings_in_batches(triton_server, client):
    from langchain_openai import OpenAIEmbeddings

    texts = [f"passage number {i}" for i in range(40)]
    embeddings = OpenAIEmbeddings(model="embed", base_url=f"{triton_server.openai_url}/v1", api_key="unused",
                                  check_embedding_ctx_length=False, chunk_size=16, dimensions=384, max_retries=0)
    direct = np.array([d.embedding for d in client.embeddings.create(model="embed", input=texts).data])
    assert_embeddings_as_direct(direct, embeddings.embed_documents(texts), embeddings.embed_query(texts[3]),
                                asyncio.run(embeddings.aembed_documents(texts[:2])))
