"""The project's models on the launcher's server, as an operator and a dashboard see them: a model
unloaded through the repository API answers NOT_FOUND until it is loaded again (docs/operations.md's
error table), and one `rag` query is counted once by each step of the pipeline in Triton's per-model
metrics. (Health, readiness and the repository index are Triton's own: the session fixture's start,
which waits for every model, covers ours; the model list through RagClient and the CLI is checked in
test_admin_key.py and test_client_cli.py.)"""
from __future__ import annotations

import pytest

from model_states import wait_until_settled
from ragstack.client import RagClient, RagstackError
from server_helpers import settled
from server_metrics import metric_value

QUESTION = "How is the KV cache divided into blocks?"
# The steps one `rag` query runs, each once: the ensembles, their steps, and the llm called by
# rag_generate (BLS). With the default reranker (the embedder's cosine) rag_rerank keeps the
# retriever's scores: the `rerank` ensemble and its models are not called.
CALLED = ["rag", "embed", "embed_tokenizer", "embedder", "retriever", "rag_rerank", "prompt_builder",
          "rag_generate", "llm"]
NOT_CALLED = ["rerank", "rerank_tokenizer", "reranker"]


@pytest.fixture(params=["grpc", "http"])
def client(request, triton_server):
    url = triton_server.grpc_url if request.param == "grpc" else triton_server.http_url
    with RagClient(url, request.param) as c:
        yield c


def test_an_unloaded_model_is_not_found_until_it_is_loaded_again(client):
    client.unload("embed")
    try:
        with pytest.raises(RagstackError, match="'embed'") as info:
            client.embed(["paged attention"])
        assert info.value.code == "NOT_FOUND"
    finally:
        client.load("embed")
        wait_until_settled(client, "embed")
        wait_until_settled(client, "rag")  # an ensemble that has `embed` as a step is loaded with it again
    assert client.embed(["paged attention"]).vectors.shape == (1, 384)
    assert client.query(QUESTION, max_tokens=2).collect().finish_reason == "length"


def test_one_rag_query_is_counted_once_by_each_step(client, triton_server):
    # The server counts a request after sending its response: a count may trail its reply, the previous
    # test's last request's too.
    def successes() -> dict[str, float]:
        return {model: metric_value(triton_server.metrics_url, "nv_inference_request_success", model)
                for model in CALLED + NOT_CALLED}

    before = settled(successes)
    client.query(QUESTION, max_tokens=2).collect()
    after = settled(successes)
    assert {model: after[model] - before[model] for model in CALLED + NOT_CALLED} == \
        {**{model: 1 for model in CALLED}, **{model: 0 for model in NOT_CALLED}}
