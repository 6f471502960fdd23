"""The OpenAI API through the official `openai` package (sync and async, streamed and not) against the
session server's frontend: chat, completions, rag with sources, embeddings, rerank, models. What it
answers is what Triton's own doors answer for the same request (RagClient over gRPC)."""
from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest
from openai import AsyncOpenAI, BadRequestError, NotFoundError

from server_helpers import tiny_llm_ids

pytestmark = pytest.mark.server
HELLO = [{"role": "user", "content": "Hello, who are you?"}]
GREEDY = {"temperature": 0.0, "max_tokens": 8}
QUESTION = "How does paged attention store the KV cache?"


def streamed_text(chunks) -> tuple[str, list]:
    chunks = list(chunks)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks


def test_chat_answers_as_the_llm_does_over_grpc(client, triton):
    """Greedy: the same tokens as the llm given the same messages directly; usage as the llm counts."""
    answer = client.chat.completions.create(model="llm", messages=HELLO, **GREEDY, extra_body={"ignore_eos": True})
    direct = triton.generate(messages=HELLO, sampling_parameters={**GREEDY, "ignore_eos": True}, stream=False).collect()
    [choice] = answer.choices
    assert choice.message.role == "assistant" and choice.message.content == direct.text
    assert choice.finish_reason == "length" and answer.object == "chat.completion" and answer.id.startswith("chatcmpl-")
    assert answer.usage.completion_tokens == 8 and answer.usage.prompt_tokens > 4
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + 8


def test_a_streamed_chat_is_the_same_answer_in_chunks(client):
    whole = client.chat.completions.create(model="llm", messages=HELLO, **GREEDY).choices[0]
    text, chunks = streamed_text(client.chat.completions.create(
        model="llm", messages=HELLO, **GREEDY, stream=True, stream_options={"include_usage": True}))
    assert text == whole.message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.finish_reason
    assert not chunks[-1].choices and chunks[-1].usage.completion_tokens > 0   # include_usage: the last chunk
    assert all(c.usage is None for c in chunks[:-1])


def test_n_choices_fan_out_with_seeds_seed_plus_i(client):
    sampling = {"temperature": 1.0, "max_tokens": 6, "seed": 7, "messages": HELLO, "model": "llm"}
    three = client.chat.completions.create(n=3, **sampling)
    assert [c.index for c in three.choices] == [0, 1, 2]
    for i, choice in enumerate(three.choices):
        alone = client.chat.completions.create(**{**sampling, "seed": 7 + i}).choices[0]
        assert choice.message.content == alone.message.content
    assert three.usage.completion_tokens == sum(
        client.chat.completions.create(**{**sampling, "seed": 7 + i}).usage.completion_tokens for i in range(3))
    text, chunks = streamed_text(client.chat.completions.create(n=3, stream=True, **sampling))
    by_choice = {i: "".join(c.choices[0].delta.content or "" for c in chunks if c.choices[0].index == i)
                 for i in range(3)}
    assert by_choice == {i: c.message.content for i, c in enumerate(three.choices)}


def test_sampling_keys_reach_the_llm(client):
    """max_completion_tokens, stop, and vLLM's extra keys through extra_body: accepted and applied."""
    long = client.chat.completions.create(model="llm", messages=HELLO, temperature=0, max_completion_tokens=12,
                                          extra_body={"ignore_eos": True}).choices[0].message.content
    at = next(i for i in range(1, len(long) - 1) if long[i:i + 2].isascii() and long[i:i + 2].isalpha())
    stop = long[at:at + 2]
    cut = client.chat.completions.create(model="llm", messages=HELLO, temperature=0, max_tokens=12, stop=[stop],
                                         extra_body={"ignore_eos": True}).choices[0]
    assert cut.finish_reason == "stop" and cut.message.content == long[:long.index(stop)]
    answer = client.chat.completions.create(
        model="llm", messages=HELLO, max_tokens=4, top_p=0.9, presence_penalty=0.5, frequency_penalty=0.5, seed=1,
        extra_body={"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.1, "min_tokens": 4, "skip_special_tokens": True,
                    "ignore_eos": True})
    assert answer.usage.completion_tokens == 4


def test_completions_take_prompts_of_token_ids(client):
    """OpenAI's four prompt forms: the token ids of a text answer as the text does."""
    texts = ["Hello there", "The capital of France is"]
    ids = [tiny_llm_ids(t) for t in texts]
    as_text = [c.text for c in client.completions.create(model="llm", prompt=texts, **GREEDY).choices]
    assert [c.text for c in client.completions.create(model="llm", prompt=ids, **GREEDY).choices] == as_text
    one = client.completions.create(model="llm", prompt=ids[0], **GREEDY)
    assert one.choices[0].text == as_text[0] and one.usage.prompt_tokens == len(ids[0])
    streamed = client.completions.create(model="llm", prompt=ids[1], stream=True, **GREEDY)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == as_text[1]


def test_openai_fields_that_change_nothing_here_are_accepted(client):
    """What frameworks send beside the sampling keys: the same answer as without them."""
    plain = client.chat.completions.create(model="llm", messages=HELLO, **GREEDY).choices[0].message.content
    answer = client.chat.completions.create(
        model="llm", messages=HELLO, **GREEDY, store=False, metadata={"run": "7"}, service_tier="auto",
        modalities=["text"], prediction={"type": "content", "content": "Hello"}, user="u1",
        extra_body={"prompt_cache_key": "k1", "safety_identifier": "s1"})
    assert answer.choices[0].message.content == plain


def test_logit_bias_forces_and_bans_tokens(client):
    """OpenAI's logit_bias: JSON string keys naming token ids of the llm's tokenizer; vLLM's allowed_token_ids."""
    [the] = tiny_llm_ids(" the")
    forced = client.chat.completions.create(model="llm", messages=HELLO, temperature=0, max_tokens=3, logprobs=True,
                                            logit_bias={str(the): 100}, extra_body={"ignore_eos": True}).choices[0]
    assert forced.message.content == " the" * 3
    assert all(t.logprob > -1e-3 for t in forced.logprobs.content)
    banned = client.chat.completions.create(model="llm", messages=HELLO, temperature=0, max_tokens=8,
                                            logit_bias={str(the): -100}, extra_body={"ignore_eos": True}).choices[0]
    assert " the" not in banned.message.content
    text = client.completions.create(model="llm", prompt="Hello", temperature=0, max_tokens=2,
                                     logit_bias={str(the): 100}).choices[0].text
    assert text == " the" * 2
    only = client.chat.completions.create(model="llm", messages=HELLO, temperature=1.0, seed=5, max_tokens=3,
                                          extra_body={"allowed_token_ids": [the], "ignore_eos": True})
    assert only.choices[0].message.content == " the" * 3   # vLLM's allowed_token_ids


def test_logprobs_name_the_sampled_tokens_and_the_most_likely(client):
    answer = client.chat.completions.create(model="llm", messages=HELLO, max_tokens=8, temperature=1.0, seed=3,
                                            logprobs=True, top_logprobs=3).choices[0]
    tokens = answer.logprobs.content
    assert len(tokens) == 8 and joined_bytes(tokens).decode(errors="replace") == answer.message.content
    for t in tokens:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3 and t.token == as_openai_token(t.bytes)
        assert [a.logprob for a in t.top_logprobs] == sorted((a.logprob for a in t.top_logprobs), reverse=True)
        assert t.logprob <= t.top_logprobs[0].logprob + 1e-6
    _, chunks = streamed_text(client.chat.completions.create(model="llm", messages=HELLO, max_tokens=8, temperature=1.0,
                                                             seed=3, logprobs=True, top_logprobs=3, stream=True))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in tokens]


def test_special_alternatives_read_as_their_own_text(client):
    """vLLM's test_some_logprobs: N most likely are N keys. Special tokens, left out of the text, would all read
    as "" and share one key; as alternatives they read as their own text."""
    answer = client.completions.create(model="llm", prompt=[0, 0, 0, 0, 0], max_tokens=5, temperature=0,
                                       logprobs=5).choices[0]
    assert all(5 <= len(top) <= 6 for top in answer.logprobs.top_logprobs), answer.logprobs.top_logprobs
    assert any(key.startswith("<|") for top in answer.logprobs.top_logprobs for key in top)


def test_logprobs_bytes_are_each_tokens_own_where_a_character_spans_tokens(client):
    """As OpenAI: the tokens' bytes join into the answer's, also where a character spans tokens (the tiny vocab
    holds most characters as bytes: this answer's "у" is D1 83 in two tokens), each such part's token its bytes
    escaped ("\\xd1"); the alternatives too. Streamed, the same."""
    asked = dict(model="llm", messages=[{"role": "user", "content": "What is the capital of France?"}], temperature=0,
                 max_tokens=16, logprobs=True, top_logprobs=3)
    answer = client.chat.completions.create(**asked).choices[0]
    tokens = answer.logprobs.content
    assert joined_bytes(tokens).decode(errors="replace") == answer.message.content and "у" in answer.message.content
    at = [t.bytes for t in tokens].index([0xd1])
    assert [(t.token, t.bytes) for t in tokens[at:at + 2]] == [("\\xd1", [0xd1]), ("\\x83", [0x83])]
    for t in tokens:
        assert t.token == as_openai_token(t.bytes) and all(a.token == as_openai_token(a.bytes) for a in t.top_logprobs)
    assert any(a.bytes == [0xd1] for t in tokens for a in t.top_logprobs)   # among the alternatives as sampled
    chunks = list(client.chat.completions.create(**asked, stream=True))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [t.model_dump() for t in streamed] == [t.model_dump() for t in tokens]


def joined_bytes(tokens) -> bytes:
    return bytes(b for t in tokens for b in t.bytes)


def as_openai_token(raw: list[int]) -> str:
    """A token's text from its bytes; what is not UTF-8 alone (part of a character) escaped, as OpenAI shows it."""
    return bytes(raw).decode(errors="backslashreplace")


def test_completions_prompts_echo_and_logprobs(client, triton):
    answer = client.completions.create(model="llm", prompt=["The KV cache", "Paged attention"], n=2, max_tokens=5,
                                       temperature=0, extra_body={"ignore_eos": True})
    assert [c.index for c in answer.choices] == [0, 1, 2, 3] and answer.object == "text_completion"
    direct = triton.generate(prompt="Paged attention", sampling_parameters={"temperature": 0, "max_tokens": 5,
                                                                            "ignore_eos": True}, stream=False).collect()
    assert answer.choices[2].text == answer.choices[3].text == direct.text
    assert answer.usage.completion_tokens == 20
    echoed = client.completions.create(model="llm", prompt="The KV cache", max_tokens=5, temperature=0, echo=True)
    assert echoed.choices[0].text == "The KV cache" + answer.choices[0].text
    scored = client.completions.create(model="llm", prompt="The KV cache", max_tokens=5, temperature=0, logprobs=2)
    logprobs = scored.choices[0].logprobs
    assert "".join(logprobs.tokens) == scored.choices[0].text and len(logprobs.top_logprobs[0]) == 2
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(len(logprobs.tokens))]
    sampled = client.completions.create(model="llm", prompt="The KV cache", max_tokens=8, temperature=1.0, seed=3,
                                        logprobs=1).choices[0].logprobs   # as OpenAI: the sampled token too
    assert all(token in top and len(top) <= 2 for token, top in zip(sampled.tokens, sampled.top_logprobs))
    pieces = list(client.completions.create(model="llm", prompt="The KV cache", max_tokens=5, temperature=0,
                                            stream=True, echo=True))
    assert "".join(p.choices[0].text for p in pieces) == echoed.choices[0].text


def test_completions_echo_with_logprobs_scores_the_prompt_as_lm_eval_asks(client):
    """lm-eval's loglikelihood request: echo, logprobs and one token, the prompts as token ids (its default) or
    text; the prompt's tokens come first, the first without a logprob, as OpenAI and vLLM answer it."""
    prompt, asked = "Paged attention stores keys and values", dict(model="llm", temperature=0, logprobs=2)
    answer = client.completions.create(prompt=prompt, max_tokens=1, echo=True, **asked)
    choice, n = answer.choices[0], len(tiny_llm_ids(prompt))
    as_ids = client.completions.create(prompt=[tiny_llm_ids(prompt), tiny_llm_ids("A KV cache")], max_tokens=1,
                                       echo=True, **asked)
    assert as_ids.choices[0].text == choice.text and as_ids.choices[1].text.startswith("A KV cache")
    assert as_ids.choices[0].logprobs.tokens == choice.logprobs.tokens
    assert as_ids.choices[0].logprobs.token_logprobs == pytest.approx(choice.logprobs.token_logprobs, abs=1e-6)
    unscored = client.completions.create(prompt=tiny_llm_ids(prompt), max_tokens=1, echo=True, model="llm",
                                         temperature=0).choices[0]
    assert unscored.text == choice.text and unscored.logprobs is None   # token ids echoed as text
    logprobs = choice.logprobs
    assert answer.usage.prompt_tokens == n and len(logprobs.tokens) == n + 1 and choice.text.startswith(prompt)
    assert "".join(logprobs.tokens) == choice.text and "".join(logprobs.tokens[:n]) == prompt
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(n + 1)]
    for token, logprob, top in zip(logprobs.tokens[1:], logprobs.token_logprobs[1:], logprobs.top_logprobs[1:]):
        assert logprob <= 0 and 2 <= len(top) <= 3 and top[token] == pytest.approx(logprob, abs=1e-6)
    plain = client.completions.create(prompt=prompt, max_tokens=1, **asked).choices[0].logprobs
    assert plain.tokens == logprobs.tokens[n:] and plain.token_logprobs == logprobs.token_logprobs[n:]
    chunks = list(client.completions.create(prompt=prompt, max_tokens=4, echo=True, stream=True, **asked))
    streamed = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    assert streamed[0].tokens[:n] == logprobs.tokens[:n] and streamed[0].token_logprobs[0] is None
    assert streamed[0].token_logprobs[1:n] == pytest.approx(logprobs.token_logprobs[1:n], abs=1e-6)
    tokens = [t for lp in streamed for t in lp.tokens]
    assert "".join(tokens) == "".join(c.choices[0].text for c in chunks if c.choices)
    assert [o for lp in streamed for o in lp.text_offset] == [sum(map(len, tokens[:i])) for i in range(len(tokens))]


def test_vllms_prompt_logprobs_field(client):
    """vLLM's extension: `prompt_logprobs` N gives each completion choice (chat: the answer) the prompt's scores
    as vLLM returns them, None first; refused when streaming, as vLLM does."""
    prompt, n = "Paged attention stores keys", len(tiny_llm_ids("Paged attention stores keys"))
    choice = client.completions.create(model="llm", prompt=prompt, max_tokens=2, temperature=0,
                                       extra_body={"prompt_logprobs": 1}).choices[0]
    scores = choice.prompt_logprobs
    assert len(scores) == n and scores[0] is None
    for entry in scores[1:]:
        assert 1 <= len(entry) <= 2 and any(e["rank"] == 1 for e in entry.values())
        assert all(set(e) == {"logprob", "rank", "decoded_token"} and e["logprob"] <= 0 for e in entry.values())
    chat = client.chat.completions.create(model="llm", messages=HELLO, max_tokens=2, extra_body={"prompt_logprobs": 0})
    assert chat.prompt_logprobs[0] is None and all(len(entry) == 1 for entry in chat.prompt_logprobs[1:])
    for body, param in (({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
                        ({"prompt_logprobs": 21}, "prompt_logprobs"), ({"prompt_logprobs": "1"}, "prompt_logprobs")):
        with pytest.raises(BadRequestError) as refused:
            client.completions.create(model="llm", prompt=prompt, max_tokens=2, extra_body=body)
        assert refused.value.body["param"] == param, refused.value.body


def test_rag_answers_with_its_sources(client, triton):
    rag = {"model": "rag", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 6, "temperature": 0,
           "extra_body": {"ignore_eos": True}}
    answer = client.chat.completions.create(**rag)
    message = answer.choices[0].message
    sources = message.model_extra["sources"]
    assert [s.source for s in triton.query(QUESTION, max_tokens=1, stream=False).collect().sources] == \
        [s["source"] for s in sources]
    assert [s["n"] for s in sources] == list(range(1, len(sources) + 1)) and message.content
    # the llm's counts, relayed by rag: the prompt holds the passages, far more than the question
    usage = answer.usage
    assert usage.completion_tokens == 6 and usage.prompt_tokens > 50
    assert usage.total_tokens == usage.prompt_tokens + 6
    chunks = list(client.chat.completions.create(**rag, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.model_extra["sources"] == sources
    assert all("sources" not in (c.choices[0].delta.model_extra or {}) for c in chunks[1:] if c.choices)
    assert not chunks[-1].choices and chunks[-1].usage == usage   # include_usage: the last chunk
    assert all(c.usage is None for c in chunks[:-1])


def test_embeddings_are_the_embed_models_in_floats_and_base64(client, triton):
    texts = ["a sentence", "another one", "paged attention"]
    floats = client.embeddings.create(model="embed", input=texts)
    vectors = np.array([d.embedding for d in floats.data], dtype=np.float32)
    np.testing.assert_allclose(vectors, triton.embed(texts).vectors, atol=1e-6)
    assert [d.index for d in floats.data] == [0, 1, 2] and floats.usage.prompt_tokens == floats.usage.total_tokens > 6
    packed = client.embeddings.create(model="embed", input=texts, encoding_format="base64")
    unpacked = np.stack([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in packed.data])
    np.testing.assert_array_equal(unpacked, vectors)
    assert len(client.embeddings.create(model="embed", input="one", dimensions=384).data[0].embedding) == 384
    raw = client.embeddings.with_raw_response.create(model="embed", input="one", extra_body={
        "request_id": "r1", "use_activation": True, "embed_dtype": "float32", "endianness": "native"}).http_response
    assert raw.json()["id"] == "embd-r1" and raw.json()["created"] > 0   # vLLM's fields and values that change nothing


def test_more_inputs_than_one_batch_are_embedded_in_order(client, triton):
    texts = [f"text number {i}" for i in range(70)]   # three batches of embed_batch (32)
    vectors = np.array([d.embedding for d in client.embeddings.create(model="embed", input=texts).data])
    direct = np.concatenate([triton.embed(texts[i:i + 32]).vectors for i in (0, 32, 64)])
    np.testing.assert_allclose(vectors, direct, atol=1e-6)


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank"])
def test_rerank_orders_documents_as_the_rerank_model_does(client, triton, triton_server, path):
    documents = ["Bananas are yellow.", "Paged attention keeps the KV cache in fixed-size blocks.",
                 "The KV cache holds keys and values of past tokens."]
    url = "/rerank" if path == "/v1/rerank" else f"{triton_server.openai_url}/rerank"   # relative to .../v1/
    answer = client.post(url, cast_to=object, body={"model": "rerank", "query": QUESTION, "top_n": 2,
                                                    "documents": [documents[0], {"text": documents[1]}, documents[2]]})
    direct = triton.rerank(QUESTION, documents)
    assert [r["index"] for r in answer["results"]] == [r.index for r in direct[:2]]
    assert [r["relevance_score"] for r in answer["results"]] == pytest.approx([r.score for r in direct[:2]], abs=1e-6)
    assert answer["results"][0]["document"]["text"] == direct[0].passage
    assert answer["usage"]["prompt_tokens"] == answer["usage"]["total_tokens"] > 0   # vLLM's usage
    bare = client.post(url, cast_to=object, body={"model": "rerank", "query": QUESTION, "documents": documents,
                                                  "return_documents": False, "top_n": -1})   # vLLM's: all
    assert len(bare["results"]) == 3 and "document" not in bare["results"][0]


def test_models_lists_what_the_api_serves(client):
    listed = {m.id for m in client.models.list()}
    assert {"llm", "rag", "embed", "rerank"} <= listed
    assert not listed & {"embedder", "retriever", "prompt_builder", "rag_generate", "echo"}   # no endpoint for them
    assert client.models.retrieve("rag").owned_by == "ragstack"
    with pytest.raises(NotFoundError):
        client.models.retrieve("retriever")


def test_errors_are_openai_errors(client):
    with pytest.raises(BadRequestError) as refused:
        client.chat.completions.create(model="llm", messages=HELLO, top_p=1.5)
    assert refused.value.body["param"] == "top_p" and "top_p must be in (0, 1], got 1.5" in refused.value.message
    with pytest.raises(NotFoundError) as missing:
        client.chat.completions.create(model="gpt-4o", messages=HELLO)
    assert missing.value.code == "model_not_found"
    with pytest.raises(BadRequestError) as legacy:   # tools and response_format: test_openai_tools, _structured
        client.chat.completions.create(model="llm", messages=HELLO, max_tokens=2, function_call="auto")
    assert legacy.value.body["param"] == "function_call" and "send 'tool_choice' instead" in legacy.value.message


def test_the_async_client_streams_many_at_once(triton_server):
    async def main():
        async with AsyncOpenAI(base_url=f"{triton_server.openai_url}/v1", api_key="unused", max_retries=0,
                               timeout=120) as client:
            async def streamed(i: int) -> str:
                stream = await client.chat.completions.create(
                    model="llm", messages=[{"role": "user", "content": f"question {i}"}], max_tokens=6, temperature=0,
                    stream=True)
                return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

            async def whole(i: int) -> str:
                answer = await client.chat.completions.create(
                    model="llm", messages=[{"role": "user", "content": f"question {i}"}], max_tokens=6, temperature=0)
                return answer.choices[0].message.content

            return (await asyncio.gather(*(streamed(i) for i in range(6))),
                    await asyncio.gather(*(whole(i) for i in range(6))))

    streamed, whole = asyncio.run(main())
    assert streamed == whole and len(set(whole)) > 1
