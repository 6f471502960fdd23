"""The retriever, prompt_builder and rag_context on the real server, over gRPC and HTTP: known
queries over the sample corpus, clear errors, and an index version swap under load that loses
no request."""
from __future__ import annotations

import json
import shutil
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from ragstack import index_store, indexer
from ragstack.client import RagClient, RagstackError
from ragstack.launcher import ROOT
from model_states import wait_until_settled
from server_helpers import wait_until

pytestmark = pytest.mark.server

# (question, document that answers it, a phrase of the passage that answers it)
KNOWN = [
    ("How is the KV cache divided into blocks?", "paged_attention.md", "fixed-size blocks"),
    ("Which FAISS index performs exact cosine search?", "faiss.html", "IndexFlatIP"),
    ("What happens when a new model version is loaded?", "model_repository.md", "without downtime"),
    ("Why use a cross-encoder to rerank passages?", "reranking.md", "cross-encoder"),
    ("How are documents split into chunks with overlap?", "chunking.md", "overlap"),
    ("What does mean pooling do in a sentence embedding model?", "embeddings.txt", "mean pooling"),
    ("How does a decoupled Python model send several responses?", "python_backend.md", "response sender"),
    ("How much memory does an FP8 KV cache save?", "kv_cache_fp8.html", "halves that memory"),
    ("How does the dynamic batcher combine requests into batches?", "dynamic_batching.md", "dynamic batcher"),
]
MODEL_DIR = ROOT / "model_repository" / "retriever"


@pytest.fixture(params=["grpc", "http"])
def client(request, triton_server):
    url = triton_server.grpc_url if request.param == "grpc" else triton_server.http_url
    with RagClient(url, request.param) as c:
        yield c


@pytest.mark.parametrize("question, source, phrase", KNOWN)
def test_known_queries_find_their_passage(client, question, source, phrase):
    passages = client.retrieve(question, top_k=3)
    assert any(p.source == source and phrase.lower() in p.text.lower() for p in passages), \
        [(p.source, p.score) for p in passages]


def test_results_are_ranked_and_sized(client):
    passages = client.retrieve("paged attention", top_k=5)
    assert len(passages) == 5
    scores = [p.score for p in passages]
    assert scores == sorted(scores, reverse=True) and -1.0 <= scores[-1] <= scores[0] <= 1.0
    assert len(client.retrieve("paged attention")) == 8                       # default top_k
    count = index_store.latest(MODEL_DIR).manifest["count"]
    assert len(client.retrieve("paged attention", top_k=64)) == min(64, count)  # never more than the index has
    assert len({p.id for p in passages}) == 5


@pytest.mark.parametrize("top_k", [0, 65, -3])
def test_top_k_out_of_range(client, top_k):
    with pytest.raises(RagstackError) as info:
        client.retrieve("paged attention", top_k=top_k)
    assert info.value.code == "INVALID_ARG"
    assert f"top_k: {top_k} is out of range; it must be 1 to 64" in info.value.message


def test_unknown_index_version(client):
    with pytest.raises(RagstackError) as info:
        client.retrieve("paged attention", version="777")
    assert info.value.code == "NOT_FOUND"
    assert "'retriever' version 777" in info.value.message


def test_bad_embedding_shape(triton_server):
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    data = np.ones((1, 7), dtype=np.float32)
    tensor = grpcclient.InferInput("embedding", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    with pytest.raises(Exception, match=r"embedding: shape \[1, 7\]; expected \[1, 384\]"):
        client.infer("retriever", [tensor])
    client.close()


def test_rag_context_numbers_the_best_passages(client):
    context = client.context("How is the KV cache divided into blocks?", top_k=8, top_n=3)
    assert [s.n for s in context.sources] == [1, 2, 3]
    assert [m["role"] for m in context.messages] == ["system", "user"]
    user = context.messages[1]["content"]
    assert "[1] (source: " in user and "[3] (source: " in user and "[4]" not in user
    assert user.rstrip().endswith("cite the passages you use as [n].")
    assert "Question: How is the KV cache divided into blocks?" in user
    scores = [s.score for s in context.sources]
    assert scores == sorted(scores, reverse=True)      # ordered by the reranker
    assert context.sources[0].source == "paged_attention.md"


@pytest.mark.parametrize("top_n", [0, 17])
def test_rag_context_top_n_out_of_range(client, top_n):
    with pytest.raises(RagstackError) as info:
        client.context("paged attention", top_n=top_n)
    assert info.value.code == "INVALID_ARG"
    assert f"top_n: {top_n} is out of range; it must be 1 to 16" in info.value.message


def _prompt_builder(triton_server, passages, scores, **extra):
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    tensors = {"query": np.array([b"why?"], dtype=object),
               "passages": np.array([p.encode() for p in passages], dtype=object),
               "sources": np.array([f"doc{i}.md".encode() for i in range(len(passages))], dtype=object),
               "scores": np.array(scores, dtype=np.float32).reshape(-1, 1), **extra}
    inputs = []
    for name, value in tensors.items():
        dtype = {np.dtype(object): "BYTES", np.dtype(np.float32): "FP32", np.dtype(np.int32): "INT32"}[value.dtype]
        inputs.append(grpcclient.InferInput(name, list(value.shape), dtype))
        inputs[-1].set_data_from_numpy(value)
    try:
        result = client.infer("prompt_builder", inputs)
    finally:
        client.close()
    return json.loads(result.as_numpy("messages")[0]), json.loads(result.as_numpy("sources")[0])


def test_prompt_builder_sorts_by_score_and_keeps_to_the_llms_budget(triton_server):
    """The budget is the llm's max_model_len (2048) minus max_tokens, in the llm's tokens: filled strictly in
    score order, the first passage that does not fit trimmed (and the last), never one skipped for a later one."""
    messages, sources = _prompt_builder(triton_server, ["low", "high", "mid"], [0.1, 0.9, 0.5])
    assert [s["source"] for s in sources] == ["doc1.md", "doc2.md", "doc0.md"]
    user = messages[1]["content"]
    assert user.index("[1] (source: doc1.md)\nhigh") < user.index("[2] (source: doc2.md)\nmid")

    big = "the cat sat. " * 110                         # 660 tokens of the tiny Qwen2 tokenizer
    _, sources = _prompt_builder(triton_server, [big, big, big, "small"], [0.9, 0.8, 0.7, 0.6],
                                 top_n=np.array([4], dtype=np.int32))
    assert [s["source"] for s in sources] == ["doc0.md", "doc1.md", "doc2.md"]   # the 3rd trimmed, "small" never
    assert sources[2]["trimmed"] is True and "trimmed" not in sources[0]
    messages, sources = _prompt_builder(triton_server, [big, big, "small"], [0.9, 0.8, 0.7],
                                        max_tokens=np.array([1000], dtype=np.int32))
    assert [s["source"] for s in sources] == ["doc0.md", "doc1.md"] and sources[1]["trimmed"]
    with RagClient(triton_server.grpc_url) as client:
        prompt = client.generate(messages=messages, max_tokens=1000, sampling_parameters={"temperature": 0},
                                 stream=False).collect()
    assert prompt.finish_reason in ("length", "stop")   # the llm takes it: prompt + 1000 <= 2048

    with pytest.raises(Exception, match=r"max_tokens: with the chat template the question takes \d+ tokens; the llm's "
                                        r"max_model_len=2048 minus max_tokens=2040 leaves 8 for the prompt"):
        _prompt_builder(triton_server, ["a"], [0.5], max_tokens=np.array([2040], dtype=np.int32))
    with pytest.raises(Exception, match="passages 2, sources 2, passage_ids 2, scores 1"):
        _prompt_builder(triton_server, ["a", "b"], [0.5])


def test_index_swap_under_load_loses_no_request(triton_server, tmp_path):
    """Build version N+1, load it while queries run (Triton retires N once N+1 is ready),
    check traffic moved and N is gone; then put the repository and the server back as they were."""
    corpus = tmp_path / "corpus"
    shutil.copytree(ROOT / "data" / "sample_corpus", corpus)
    (corpus / "canary.txt").write_text("The swap canary: zebra crossings in Lisbon are painted blue.")
    before = index_store.versions(MODEL_DIR)
    stop, errors, counts = threading.Event(), [], [0, 0]

    def query(worker: int, protocol: str):
        url = triton_server.grpc_url if protocol == "grpc" else triton_server.http_url
        with RagClient(url, protocol) as c:
            while not stop.is_set():
                try:
                    assert c.retrieve("How is the KV cache divided into blocks?", top_k=4)
                    counts[worker] += 1
                except Exception as exc:  # noqa: BLE001 - every failure is the test's finding
                    errors.append(repr(exc))

    with RagClient(triton_server.grpc_url) as admin:
        try:
            built = indexer.build(corpus, admin, MODEL_DIR, progress=False)
            assert built.created and built.version == before[-1] + 1
            workers = [threading.Thread(target=query, args=(i, p)) for i, p in enumerate(["grpc", "http"])]
            for w in workers:
                w.start()
            wait_until(lambda: sum(counts) > 0 or errors, "the first queries")
            served_before = sum(counts)
            admin.load("retriever")                          # version_policy latest 1: N+1 in, N out
            wait_until(lambda: sum(counts) > served_before + 2 or errors, "queries after the swap")
            stop.set()
            for w in workers:
                w.join()
            assert errors == []
            assert served_before > 0 and sum(counts) > served_before

            assert admin.retrieve("What colour are zebra crossings in Lisbon?", top_k=1)[0].source == "canary.txt"
            states = {(m.version, m.state) for m in admin.models() if m.name == "retriever"}
            assert (str(built.version), "READY") in states
            with pytest.raises(RagstackError, match=f"'retriever' version {before[-1]}"):
                admin.retrieve("anything", version=str(before[-1]))
        finally:
            stop.set()
            shutil.rmtree(MODEL_DIR / str(before[-1] + 1), ignore_errors=True)
            admin.load("retriever")                          # back to the version that served before
            wait_until_settled(admin, "retriever", timeout_s=60)   # the retired version finishes unloading
        assert index_store.versions(MODEL_DIR) == before
        assert admin.retrieve("What colour are zebra crossings in Lisbon?", top_k=1)[0].source != "canary.txt"
