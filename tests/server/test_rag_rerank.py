"""The rag pipeline's rerank step (rag_rerank) on the real server: with the default reranker (the
embedder's pair-cosine) the scores are the retriever's and no passage is encoded again; a cross-encoder
served as `reranker` is called for every query and its scores order the context, and the OpenAI frontend
answers its activated score as vLLM does (CrossEncoder.predict's sigmoid), its logit when asked."""
from __future__ import annotations

import json

import httpx2 as httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from model_states import wait_until_settled
from ragstack.client import RagClient
from ragstack.onnx_export import export
from server_helpers import settled
from text_models import rerank

pytestmark = pytest.mark.server
QUESTION = "How is the KV cache divided into blocks?"


def clients_of(server):
    """An HTTP client and a RagClient of `server`, closed after the test."""
    http = httpclient.InferenceServerClient(server.http_url)
    with RagClient(server.grpc_url) as rag:
        yield http, rag
    http.close()


@pytest.fixture()
def clients(triton_server):
    yield from clients_of(triton_server)


@pytest.fixture(scope="module")
def reload_server(tmp_path_factory):
    """A server of its own, with rag_context's models and the rerank ensemble, for the reranker's version
    swap. Twice in CI, Triton 2.51 aborted with heap corruption (glibc's check at a thread's exit) while
    the session server, some 900 tests old, unloaded the reranker's version 1 here; 70 swaps on fresh
    servers, 30 of them after rounds of cancelled rag queries, never did (docs/operations.md)."""
    from ragstack.launcher import TritonServer
    from server_helpers import free_server_options

    options = free_server_options(openai=True, models=["rag_context", "rerank", "embed"])
    with TritonServer(options, work_dir=tmp_path_factory.mktemp("triton-rerank-swap")) as server:
        yield server


@pytest.fixture()
def reload_clients(reload_server):
    yield from clients_of(reload_server)


def reranker_executions(http) -> int:
    return settled(lambda: sum(s["execution_count"] for s in http.get_inference_statistics("reranker")["model_stats"]))


def scores_by_id(http, passages) -> dict[str, float]:
    """The `rerank` ensemble's score of each passage, by passage id."""
    return dict(zip((p.id for p in passages), rerank(http, QUESTION, [p.text for p in passages])[0].tolist()))


def check_the_openai_scores_are_vllms(url, folder, passages, logits):
    """rerank and score answer sentence-transformers' CrossEncoder.predict (vLLM's default: the sigmoid) unless
    use_activation is false (the logit, as `rerank` gives it over Triton)."""
    from sentence_transformers import CrossEncoder

    texts = [p.text for p in passages]
    predicted = CrossEncoder(str(folder), device="cpu").predict([(QUESTION, t) for t in texts])
    with httpx.Client(base_url=url, timeout=60) as http:
        for extra, want in (({}, predicted), ({"use_activation": True}, predicted),
                            ({"use_activation": False}, [logits[p.id] for p in passages]),
                            ({"activation": False}, [logits[p.id] for p in passages])):
            answer = http.post("/v1/rerank", json={"model": "rerank", "query": QUESTION, "documents": texts,
                                                   **extra})
            assert answer.status_code == 200, answer.text
            got = {r["index"]: r["relevance_score"] for r in answer.json()["results"]}
            np.testing.assert_allclose([got[i] for i in range(len(texts))], want, atol=1e-5)
            score = http.post("/v1/score", json={"model": "rerank", "text_1": QUESTION, "text_2": texts, **extra})
            assert score.status_code == 200, score.text
            np.testing.assert_allclose([d["score"] for d in score.json()["data"]], want, atol=1e-5)
    assert 0 < min(predicted) and max(predicted) < 1 and not np.allclose(predicted, [logits[p.id] for p in passages])


def test_default_reranker_scores_come_from_the_retriever(clients):
    http, rag = clients
    passages = rag.retrieve(QUESTION, top_k=8)
    reranker_would_say = scores_by_id(http, passages)
    before = reranker_executions(http)
    context = rag.context(QUESTION, top_k=8, top_n=8)
    assert reranker_executions(http) == before  # no passage encoded again
    retrieved = {p.id: p.score for p in passages}
    assert len(context.sources) >= 3
    for source in context.sources:
        assert source.score == pytest.approx(retrieved[source.passage_id], abs=1e-6)
        assert source.score == pytest.approx(reranker_would_say[source.passage_id], abs=1e-4)


def test_a_cross_encoder_in_the_reranker_slot_orders_the_context(reload_server, reload_clients, tiny_cross_encoder,
                                                                   repository):
    http, rag = reload_clients
    export(tiny_cross_encoder, repository, "reranker", 2)
    config = http.get_model_config("reranker")
    override = json.dumps({**config, "version_policy": {"specific": {"versions": [2]}}})
    # The upload (5 MB of base64) is past the gateway's max_body_bytes: an admin sends it to Triton's port.
    admin = httpclient.InferenceServerClient(reload_server.triton_http_url)
    try:
        admin.load_model("reranker", config=override,
                         files={"file:2/model.onnx": (repository / "reranker" / "2" / "model.onnx").read_bytes()})
        passages = rag.retrieve(QUESTION, top_k=8)
        cross_encoder = scores_by_id(http, passages)
        assert max(abs(cross_encoder[p.id] - p.score) for p in passages) > 1e-3  # not the cosine
        before = reranker_executions(http)
        context = rag.context(QUESTION, top_k=8, top_n=8)
        assert reranker_executions(http) > before
        scores = [source.score for source in context.sources]
        assert scores == sorted(scores, reverse=True)
        for source in context.sources:
            assert source.score == pytest.approx(cross_encoder[source.passage_id], abs=1e-5)
        check_the_openai_scores_are_vllms(reload_server.openai_url, tiny_cross_encoder, passages, cross_encoder)
    finally:
        http.load_model("reranker")  # the repository's config again: version 1
        wait_until_settled(rag, "reranker")
        admin.close()
    assert rag.context(QUESTION, top_n=1).sources[0].score == pytest.approx(rag.retrieve(QUESTION, 1)[0].score, abs=1e-6)
