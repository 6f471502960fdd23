"""Embeddings, rerank and models on the session server's OpenAI frontend, as vLLM, Cohere and Jina clients
send them: inputs longer than the model reads, vendor fields, `/v2/rerank`, `top_n: 0`, refusals that name the
request's field and its index past the first batch, and vLLM's fields of the model objects. Embeddings through
the official `openai` package, rerank over raw HTTP; the vectors and scores compared with Triton's own door."""
from __future__ import annotations

import httpx2 as httpx
import numpy as np
import pytest
from openai import BadRequestError
from server_helpers import invalid_request_message as error_of

pytestmark = pytest.mark.server
LONG = "Dynamic batching merges requests that arrive together. " * 60   # ~480 tokens; the embedder reads 256
LIMIT = 256   # all-MiniLM-L6-v2's and the demo reranker's tokens, their special tokens included
QUESTION = "How does paged attention store the KV cache?"
DOCUMENTS = ["Bananas are yellow.", "Paged attention keeps the KV cache in fixed-size blocks.",
             "The KV cache holds keys and values of past tokens."]


def refused(call, **kw) -> BadRequestError:
    with pytest.raises(BadRequestError) as raised:
        call(**kw)
    return raised.value


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.openai_url}{path}", json=body, timeout=60)


def test_token_id_input_is_refused_saying_what_langchain_needs(client):
    for ids in ([9906, 1917], [[9906, 1917], [15339]]):
        error = refused(client.embeddings.create, model="embed", input=ids)
        assert error.body["param"] == "input" and "pass check_embedding_ctx_length=False" in error.message


def test_an_input_longer_than_the_model_reads_needs_truncate_prompt_tokens(client, triton):
    error = refused(client.embeddings.create, model="embed", input=["short", LONG])
    assert error.body["param"] == "input[1]"
    assert f"input[1] is longer than model 'embed' reads ({LIMIT} tokens)" in error.message
    assert "truncate_prompt_tokens: -1" in error.message
    direct = triton.embed(["short", LONG])
    assert direct.truncated == [False, True]   # Triton's own door and the ragstack client still cut silently
    for cut in (-1, LIMIT, 10_000):   # the model's limit, or any count at least that
        answer = client.embeddings.create(model="embed", input=["short", LONG],
                                          extra_body={"truncate_prompt_tokens": cut})
        vectors = np.array([d.embedding for d in answer.data], dtype=np.float32)
        np.testing.assert_allclose(vectors, direct.vectors, atol=1e-6)
        assert answer.usage.prompt_tokens == LIMIT + 3   # [CLS] short [SEP], and LONG cut at the limit


def test_truncate_prompt_tokens_below_the_limit_is_refused_where_it_would_cut(client):
    error = refused(client.embeddings.create, model="embed", input=["short", LONG],
                    extra_body={"truncate_prompt_tokens": 100})
    assert error.body["param"] == "truncate_prompt_tokens"
    assert f"input[1] keeps {LIMIT} tokens, more than 100" in error.message and f"its limit ({LIMIT} tokens)" in \
        error.message and "send -1" in error.message
    fits = client.embeddings.create(model="embed", input="short", extra_body={"truncate_prompt_tokens": 3})
    assert fits.usage.prompt_tokens == 3   # nothing to cut
    error = refused(client.embeddings.create, model="embed", input="short", extra_body={"truncate_prompt_tokens": 0})
    assert error.body["param"] == "truncate_prompt_tokens" and "-1 (cut at the model's limit) or at least 1" in \
        error.message


def test_vllms_embedding_fields_are_taken_at_their_defaults(client):
    defaults = {"priority": 0, "normalize": True, "add_special_tokens": True, "request_id": "req-1",
                "truncate_prompt_tokens": None, "encoding_format": None}
    answer = client.embeddings.create(model="embed", input="one", extra_body=defaults)
    assert len(answer.data[0].embedding) == 384
    for field, value, words in (("priority", 1, "only 0 is accepted"), ("normalize", False, "normalize: false"),
                                ("add_special_tokens", False, "always adds them"),
                                ("frobnicate", 1, "'frobnicate' is not supported by this endpoint")):
        error = refused(client.embeddings.create, model="embed", input="one", extra_body={field: value})
        assert error.body["param"] == field and words in error.message, error.message


def test_a_text_past_the_tokenizers_bytes_is_named_by_its_index_in_the_request(triton_server, client):
    """input[40] and documents[70] are in the second batch (32 inputs, 64 documents a batch)."""
    error = refused(client.embeddings.create, model="embed", input=["fine"] * 40 + ["x" * 20_000])
    assert error.body["param"] == "input[40]"
    assert error.body["message"] == "input[40] is 20000 bytes; model 'embed' reads at most 16384 (max_text_bytes)"
    error = refused(client.embeddings.create, model="embed", input=["fine"] * 35 + [" \n"])
    assert error.body["param"] == "input[35]" and "input[35] is empty" in error.message
    documents = ["fine"] * 70 + ["y" * 16_385]
    message = error_of(post(triton_server, "/v1/rerank", {"model": "rerank", "query": "q", "documents": documents}),
                       "documents[70]")
    assert message == "documents[70] is 16385 bytes; model 'rerank' reads at most 16384 (max_text_bytes)"
    message = error_of(post(triton_server, "/v1/rerank", {"model": "rerank", "query": "é" * 8193, "documents": ["a"]}),
                       "query")
    assert message == "query is 16386 bytes; model 'rerank' reads at most 16384 (max_text_bytes)"
    surrogate = httpx.post(f"{triton_server.openai_url}/v1/embeddings", timeout=60,
                           content=b'{"model": "embed", "input": ["ok", "\\ud800"]}',   # JSON's lone surrogate
                           headers={"Content-Type": "application/json"})
    assert "input[1] holds a lone surrogate" in error_of(surrogate, "input[1]")


def test_cohere_and_vllm_rerank_fields(triton_server, triton):
    direct = triton.rerank(QUESTION, DOCUMENTS)
    body = {"model": "rerank", "query": QUESTION, "user": "u", "max_tokens_per_doc": 512, "rank_fields": ["text"],
            "truncate_prompt_tokens": -1, "priority": 0, "use_activation": False, "activation": None,
            "documents": [{"text": DOCUMENTS[0], "title": "fruit", "id": 7}, DOCUMENTS[1], {"text": DOCUMENTS[2]}]}
    answer = post(triton_server, "/v1/rerank", body)
    assert answer.status_code == 200, answer.text
    assert [r["index"] for r in answer.json()["results"]] == [r.index for r in direct]
    assert answer.json()["results"][0]["document"] == {"text": direct[0].passage}
    for field, value, param, words in (
            ("documents", ["a", {"title": "t"}], "documents[1].text", "documents[1] has no 'text'"),
            ("documents", ["a", {"text": 5}], "documents[1].text", "must be a string, got int"),
            ("rank_fields", ["title"], "rank_fields", 'only ["text"]'),
            ("max_tokens_per_doc", 0, "max_tokens_per_doc", "at least 1"),
            ("priority", 2, "priority", "only 0"),
            ("top_n", 1.5, "top_n", "valid integer"),
            ("use_activation", "yes", "use_activation", "valid boolean"),
            ("return_urls", True, "return_urls", "'return_urls' is not supported by this endpoint")):
        assert words in error_of(post(triton_server, "/v1/rerank", {**body, field: value}), param)


def test_rerank_cuts_documents_without_a_word_but_not_below_the_models_limit(triton_server):
    body = {"model": "rerank", "query": "q", "documents": ["short", LONG]}
    assert post(triton_server, "/v1/rerank", body).status_code == 200
    assert post(triton_server, "/v1/rerank", {**body, "truncate_prompt_tokens": LIMIT}).status_code == 200
    message = error_of(post(triton_server, "/v1/rerank", {**body, "truncate_prompt_tokens": 20}),
                       "truncate_prompt_tokens")
    assert f"documents[1] with the query keeps {LIMIT} tokens, more than 20" in message


def test_v2_rerank_answers_as_cohere_v2(triton_server, triton):
    direct = triton.rerank(QUESTION, DOCUMENTS)
    body = {"model": "rerank", "query": QUESTION, "documents": DOCUMENTS, "top_n": 2}
    v2 = post(triton_server, "/v2/rerank", body).json()
    assert [r["index"] for r in v2["results"]] == [r.index for r in direct[:2]]
    assert all(set(r) == {"index", "relevance_score"} for r in v2["results"])   # no documents unless asked
    assert v2["meta"] == {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}}
    asked = post(triton_server, "/v2/rerank", {**body, "return_documents": True}).json()
    assert asked["results"][0]["document"] == {"text": direct[0].passage}
    v1 = post(triton_server, "/v1/rerank", {**body, "return_documents": None}).json()
    assert "document" in v1["results"][0] and v1["meta"]["api_version"] == {"version": "1"}


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_top_n_0_means_every_document(triton_server, path):
    answer = post(triton_server, path, {"model": "rerank", "query": QUESTION, "documents": DOCUMENTS, "top_n": 0})
    assert sorted(r["index"] for r in answer.json()["results"]) == [0, 1, 2]


def counted(server, endpoint: str, model: str) -> float:
    text = httpx.get(f"{server.openai_url}/metrics", timeout=30).text
    line = f'ragstack_openai_requests_total{{endpoint="{endpoint}",model="{model}"}} '
    return next((float(l.removeprefix(line)) for l in text.splitlines() if l.startswith(line)), 0.0)


def test_v2_rerank_is_counted_under_its_own_endpoint(triton_server):
    before = counted(triton_server, "/v2/rerank", "rerank")
    post(triton_server, "/v2/rerank", {"model": "rerank", "query": "q", "documents": ["a"]})
    assert counted(triton_server, "/v2/rerank", "rerank") == before + 1


def test_a_model_object_is_counted_under_its_model(triton_server):
    before = counted(triton_server, "/v1/models/{id}", "llm")
    assert httpx.get(f"{triton_server.openai_url}/v1/models/llm", timeout=30).status_code == 200
    assert counted(triton_server, "/v1/models/{id}", "llm") == before + 1


def test_model_objects_carry_vllms_fields(client):
    listed = {m.id: m.model_dump() for m in client.models.list()}
    for name in ("llm", "rag", "embed", "rerank"):
        assert listed[name]["root"] == name and listed[name]["parent"] is None and listed[name]["permission"] == []
    assert listed["llm"]["max_model_len"] == 2048   # model_repository/llm/config.pbtxt
    assert "max_model_len" not in listed["embed"]   # its limit lives in its tokenizer.json, not in a config
    assert client.models.retrieve("llm").model_dump()["max_model_len"] == 2048
    # rag answers with the llm its rag_generate step runs (its llm_model parameter)
    assert listed["rag"]["max_model_len"] == client.models.retrieve("rag").model_dump()["max_model_len"] == 2048
