"""LlamaIndex's own OpenAI-compatible classes (`OpenAILike`, `OpenAILikeEmbedding`), unchanged, against the
session server's frontend, as an application uses them: a chat model (complete, chat, their streams and async
forms) and a completion model answer what the official `openai` package gets for the same request; logprobs;
tools with a tool-result round trip; structured output of a nested model (its `$defs` under tool_choice
required); rag's sources on the raw answer; embeddings in batches."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from client_lib_models import City, Town, Weather
from server_helpers import assert_embeddings_as_direct, chat_prompt_tokens

pytestmark = pytest.mark.server
HELLO = "Hello, who are you?"
# LlamaIndex passes additional_kwargs to the openai client's create(): vLLM's keys go in extra_body.
GREEDY = {"temperature": 0.0, "max_tokens": 8, "additional_kwargs": {"seed": 1, "extra_body": {"ignore_eos": True}}}


@pytest.fixture(scope="module")
def llm(triton_server):
    """OpenAILike as pointed at any OpenAI-compatible server: model, api_base, api_key, what the model is."""
    from llama_index.llms.openai_like import OpenAILike

    def make(**kwargs):
        return OpenAILike(api_base=f"{triton_server.openai_url}/v1", api_key="unused", max_retries=0, timeout=120,
                          context_window=2048, **{"model": "llm", "is_chat_model": True, **kwargs})
    return make


def user(text: str):
    from llama_index.core.llms import ChatMessage

    return ChatMessage(role="user", content=text)


def test_a_chat_model_answers_as_the_openai_client(llm, client):
    direct = client.chat.completions.create(model="llm", messages=[{"role": "user", "content": HELLO}], max_tokens=8,
                                            temperature=0, seed=1, extra_body={"ignore_eos": True})
    text = direct.choices[0].message.content
    chat = llm(**GREEDY)
    completed = chat.complete(HELLO)
    assert completed.text == text and completed.additional_kwargs["completion_tokens"] == 8
    assert completed.additional_kwargs["prompt_tokens"] == direct.usage.prompt_tokens
    answer = chat.chat([user(HELLO)])
    assert answer.message.content == text and answer.raw.choices[0].finish_reason == "length"
    deltas = [r.delta for r in chat.stream_chat([user(HELLO)])]
    assert "".join(deltas) == text and len(deltas) > 1   # merged under load

    async def both():
        fresh = llm(**GREEDY)   # an async client per event loop
        streamed = [r.delta async for r in await fresh.astream_chat([user(HELLO)])]
        return (await fresh.acomplete(HELLO)).text, "".join(streamed)
    assert asyncio.run(both()) == (text, text)


def test_a_completion_model_answers_as_the_openai_client(llm, client):
    direct = client.completions.create(model="llm", prompt=HELLO, max_tokens=8, temperature=0, seed=1,
                                       extra_body={"ignore_eos": True})
    completion = llm(is_chat_model=False, **GREEDY)
    answer = completion.complete(HELLO)
    assert answer.text == direct.choices[0].text and answer.raw.usage.completion_tokens == 8
    assert "".join(r.delta for r in completion.stream_complete(HELLO)) == answer.text


def test_logprobs_of_each_token(llm):
    """Each token's most likely alternatives, from chat (a chat model's complete() drops them) and completions."""
    chat = llm(logprobs=True, top_logprobs=2, **GREEDY).chat([user(HELLO)])
    completion = llm(is_chat_model=False, logprobs=True, top_logprobs=2, **GREEDY).complete(HELLO)
    for answer in (chat, completion):
        assert len(answer.logprobs) == 8
        for alternatives in answer.logprobs:
            assert len(alternatives) == 2 and alternatives[0].logprob >= alternatives[1].logprob


def test_chat_with_tools_calls_a_tool_and_reads_its_result(llm, client):
    """A required tool's call, its arguments following the tool's schema; the result sent back as a tool
    message reaches the template (the prompt counts as the three messages do)."""
    from llama_index.core.llms import ChatMessage
    from llama_index.core.tools import FunctionTool

    tool = FunctionTool.from_defaults(fn=lambda city: "sunny", name="get_weather", description="Weather in a city",
                                      fn_schema=Weather)
    model = llm(is_function_calling_model=True, temperature=1.0, max_tokens=200, additional_kwargs={"seed": 1})
    question = user("What is the weather in Paris?")
    response = model.chat_with_tools([tool], chat_history=[question], tool_required=True)
    [call] = model.get_tool_calls_from_response(response, error_on_no_tool_call=True)
    assert call.tool_name == "get_weather" and call.tool_id.startswith("call_")
    Weather.model_validate(call.tool_kwargs)
    result = ChatMessage(role="tool", content=str(tool(**call.tool_kwargs)), additional_kwargs={"tool_call_id":
                                                                                                 call.tool_id})
    answered = llm(**GREEDY).chat([question, response.message, result])
    assert answered.message.content
    sent = [{"role": "user", "content": question.content},
            {"role": "assistant", "content": None, "tool_calls": [{"id": call.tool_id, "type": "function", "function": {
                "name": "get_weather", "arguments": json.dumps(call.tool_kwargs)}}]},
            {"role": "tool", "tool_call_id": call.tool_id, "content": "sunny"}]
    assert answered.raw.usage.prompt_tokens == chat_prompt_tokens(client, sent) > chat_prompt_tokens(client, sent[:2])


def test_structured_output_of_a_nested_model(llm):
    """as_structured_llm forces the model's tool (tool_choice required), whose parameters carry `$defs`."""
    from llama_index.core.prompts import PromptTemplate

    model = llm(is_function_calling_model=True, temperature=1.0, max_tokens=300, additional_kwargs={"seed": 2})
    town = model.as_structured_llm(Town).chat([user("Describe a town.")]).raw
    assert isinstance(town, Town)
    assert isinstance(model.structured_predict(City, PromptTemplate("A city named {name}"), name="Paris"), City)


def test_rag_sources_on_the_raw_answer(llm):
    rag = llm(model="rag", **GREEDY)
    question = [user("How does paged attention store the KV cache?")]
    answer = rag.chat(question)
    sources = answer.raw.choices[0].message.model_extra["sources"]
    assert answer.message.content and [s["n"] for s in sources] == list(range(1, len(sources) + 1))
    streamed = list(rag.stream_chat(question))
    assert streamed[0].raw.choices[0].delta.model_extra["sources"] == sources
    assert "".join(r.delta for r in streamed) == answer.message.content


def test_openai_like_embeddings_in_batches(triton_server, client):
    from llama_index.embeddings.openai_like import OpenAILikeEmbedding

    texts = [f"passage number {i}" for i in range(40)]
    embeddings = OpenAILikeEmbedding(model_name="embed", api_base=f"{triton_server.openai_url}/v1", api_key="unused",
                                     embed_batch_size=16, dimensions=384, max_retries=0)
    direct = np.array([d.embedding for d in client.embeddings.create(model="embed", input=texts).data])
    assert_embeddings_as_direct(direct, embeddings.get_text_embedding_batch(texts),
                                embeddings.get_query_embedding(texts[3]),
                                asyncio.run(embeddings.aget_text_embedding_batch(texts[:2])))
