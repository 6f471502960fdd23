"""vLLM's score API (`/score` and `/v1/score`) on the session server's OpenAI frontend, over raw HTTP (the
`openai` SDK has no score method): pairs 1 x N and N x N scored as `/v1/rerank` scores them, answered by the
pairs' index in vLLM's shape, vLLM's pairing and truncation rules, and refusals that name the field."""
from __future__ import annotations

import concurrent.futures
import time

import httpx2 as httpx
import pytest
from server_helpers import invalid_request_message as refused

pytestmark = pytest.mark.server
QUESTION = "How does paged attention store the KV cache?"
# The best document last: a score sorted by relevance would come in another order.
DOCUMENTS = ["Bananas are yellow.", "The KV cache holds keys and values of past tokens.",
             "Paged attention keeps the KV cache in fixed-size blocks."]
LONG = "Dynamic batching merges requests that arrive together. " * 60   # ~480 tokens; the reranker reads 256
LIMIT = 256


@pytest.fixture(scope="module")
def http(triton_server):
    with httpx.Client(base_url=triton_server.openai_url, timeout=120) as client:
        yield client


def answered(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


def rerank(http, query: str, documents: list[str]) -> tuple[list[float], int]:
    """/v1/rerank's relevance_score of each document, by index, and its token count."""
    got = answered(http.post("/v1/rerank", json={"model": "rerank", "query": query, "documents": documents}))
    scores = [0.0] * len(documents)
    for result in got["results"]:
        scores[result["index"]] = result["relevance_score"]
    return scores, got["usage"]["total_tokens"]


def test_one_text_against_many_scores_as_rerank_in_the_pairs_order(http):
    expected, tokens = rerank(http, QUESTION, DOCUMENTS)
    assert sorted(range(3), key=lambda i: -expected[i]) != [0, 1, 2]   # rerank's order is not the index order
    for text_1 in (QUESTION, [QUESTION]):
        got = answered(http.post("/v1/score", json={"model": "rerank", "text_1": text_1, "text_2": DOCUMENTS}))
        assert got["id"].startswith("score-") and got["object"] == "list" and got["model"] == "rerank"
        assert abs(got["created"] - time.time()) < 60
        assert [d["index"] for d in got["data"]] == [0, 1, 2] and {d["object"] for d in got["data"]} == {"score"}
        assert [d["score"] for d in got["data"]] == pytest.approx(expected, abs=1e-6)
        assert got["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}


def test_pairs_one_by_one_score_as_rerank_does_each_pair(http):
    """N x N: pairs that share a first text go to the model together, the others apart; the answer keeps
    the pairs' order."""
    queries = [QUESTION, "What colour are bananas?", QUESTION, "Where are keys and values kept?"]
    documents = [DOCUMENTS[2], DOCUMENTS[0], DOCUMENTS[1], DOCUMENTS[1]]
    expected = [rerank(http, query, [document]) for query, document in zip(queries, documents)]
    got = answered(http.post("/v1/score", json={"model": "rerank", "text_1": queries, "text_2": documents}))
    assert [d["index"] for d in got["data"]] == [0, 1, 2, 3]
    assert [d["score"] for d in got["data"]] == pytest.approx([score for [score], _ in expected], abs=1e-5)
    tokens = sum(count for _, count in expected)
    assert got["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}
    for first, second in (("data_1", "data_2"), ("queries", "documents"), ("queries", "items")):   # vLLM's newer
        renamed = answered(http.post("/v1/score", json={"model": "rerank", first: queries, second: documents}))
        assert renamed["data"] == got["data"]


def test_both_paths_answer_and_a_request_without_model_goes_to_the_rerank_model(http):
    body = {"text_1": QUESTION, "text_2": DOCUMENTS[:2]}
    scores = [[d["score"] for d in answered(http.post(path, json=body))["data"]] for path in ("/score", "/v1/score")]
    assert scores[0] == pytest.approx(scores[1], abs=1e-6)
    assert answered(http.post("/score", json=body))["model"] == "rerank"


def test_vllms_fields_at_the_values_this_server_honours(http):
    expected, _ = rerank(http, QUESTION, DOCUMENTS)
    body = {"model": "rerank", "text_1": QUESTION, "text_2": DOCUMENTS, "priority": 0, "user": "u",
            "request_id": "req-1", "mm_processor_kwargs": {}, "use_activation": False, "activation": None,
            "softmax": False, "truncate_prompt_tokens": -1}
    got = answered(http.post("/v1/score", json=body))
    assert [d["score"] for d in got["data"]] == pytest.approx(expected, abs=1e-6)


def test_the_bundled_reranker_answers_its_cosine_with_or_without_activation(http):
    """vLLM scores an embedding model by the cosine alone; the pair-cosine reranker's activated score is that
    cosine (a cross-encoder's: test_rag_rerank)."""
    body = {"text_1": QUESTION, "text_2": DOCUMENTS}
    plain = [d["score"] for d in answered(http.post("/v1/score", json=body))["data"]]
    for name in ("use_activation", "activation", "softmax"):
        for value in (True, False):
            got = answered(http.post("/v1/score", json={**body, name: value}))["data"]
            assert [d["score"] for d in got] == pytest.approx(plain, abs=1e-6)


@pytest.mark.parametrize("body, param, words", [
    ({"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_1",
     "Input lengths must be either 1:1, 1:N or N:N; got 2 texts in text_1 and 3 in text_2"),
    ({"queries": ["a", "b", "c"], "documents": "d"}, "queries", "got 3 texts in queries and 1 in documents"),
    ({"text_1": [], "text_2": ["d"]}, "text_1", "text_1 must hold at least one text"),
    ({"text_1": "q", "text_2": []}, "text_2", "text_2 must hold at least one text"),
    ({"text_1": "q"}, "text_2", "by one of text_1 and text_2, data_1 and data_2, queries and documents, queries "
                                "and items; got text_1"),
    ({"text_1": "q", "documents": ["d"]}, "text_1", "got text_1, documents"),
    ({"text_1": "q", "text_2": 5}, "text_2", "text_2 must be a string or a list of strings, got int"),
    ({"text_1": "q", "text_2": ["d", 5]}, "text_2[1]", "text_2[1] must be a string; got int"),
    ({"text_1": "q", "text_2": [{"content": [{"type": "text", "text": "d"}]}]}, "text_2[0]",
     "read no multimodal content"),
    ({"text_1": "q", "text_2": ["d", " \n"]}, "text_2[1]", "text_2[1] is empty"),
    ({"text_1": "q", "text_2": "d", "use_activation": "yes"}, "use_activation", "valid boolean"),
    ({"text_1": "q", "text_2": "d", "priority": 1}, "priority", "only 0 is accepted"),
    ({"text_1": "q", "text_2": "d", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens", "or at least 1"),
    ({"text_1": "q", "text_2": "d", "mm_processor_kwargs": {"fps": 1}}, "mm_processor_kwargs", "read text only"),
    ({"text_1": "q", "text_2": "d", "encoding_format": "float"}, "encoding_format",
     "'encoding_format' is not supported by this endpoint"),
    ({"model": "embed", "text_1": "q", "text_2": "d"}, "model", "model 'embed' serves embeddings, not score"),
])
def test_bad_requests_are_refused_naming_the_field(http, body, param, words):
    assert words in refused(http.post("/v1/score", json=body), param)


def test_an_oversize_text_is_named_by_its_index_in_the_request(http):
    """text_2[70] is in the second batch (64 pairs a batch)."""
    message = refused(http.post("/v1/score", json={"text_1": "q", "text_2": ["fine"] * 70 + ["y" * 16_385]}),
                      "text_2[70]")
    assert message == "text_2[70] is 16385 bytes; model 'rerank' reads at most 16384 (max_text_bytes)"
    message = refused(http.post("/v1/score", json={"text_1": ["q", "é" * 8193], "text_2": ["a", "b"]}), "text_1[1]")
    assert message == "text_1[1] is 16386 bytes; model 'rerank' reads at most 16384 (max_text_bytes)"


def test_a_pair_longer_than_the_model_reads_needs_truncate_prompt_tokens(http):
    """As vLLM's score (unlike rerank, which cuts without a word): refused unless the cut is asked for."""
    body = {"model": "rerank", "text_1": ["q", "r"], "text_2": ["short", LONG]}
    message = refused(http.post("/v1/score", json=body), "text_2[1]")
    assert message == (f"text_2[1] with text_1[1] is longer than model 'rerank' reads ({LIMIT} tokens); send "
                       "truncate_prompt_tokens: -1 to have it cut there")
    expected, tokens = rerank(http, "r", [LONG])
    for cut in (-1, LIMIT):
        got = answered(http.post("/v1/score", json={**body, "truncate_prompt_tokens": cut}))
        assert got["data"][1]["score"] == pytest.approx(expected[0], abs=1e-5)
        assert got["usage"]["prompt_tokens"] == tokens + rerank(http, "q", ["short"])[1]
    message = refused(http.post("/v1/score", json={**body, "truncate_prompt_tokens": 20}), "truncate_prompt_tokens")
    assert f"text_2[1] with text_1[1] keeps {LIMIT} tokens, more than 20" in message


def test_a_first_text_longer_than_the_model_reads_is_the_one_named(http):
    message = refused(http.post("/v1/score", json={"model": "rerank", "text_1": LONG, "text_2": ["a", "b"]}),
                      "text_1")
    assert message.startswith("text_2[0] with text_1 is longer than model 'rerank' reads")


def test_groups_split_over_batches_keep_each_pairs_score(http):
    """Two first texts taking turns, 65 pairs each: each group goes to the model in two batches (64 a batch)."""
    topics = [f"Document {i} says the KV cache is paged into block {i}." for i in range(65)]
    queries = [QUESTION, "Where are keys and values kept?"]
    got = answered(http.post("/v1/score", json={"model": "rerank", "text_1": [queries[i % 2] for i in range(130)],
                                                "text_2": [topics[i // 2] for i in range(130)]}))
    expected = [rerank(http, query, topics)[0] for query in queries]
    assert [d["score"] for d in got["data"]] == pytest.approx([expected[i % 2][i // 2] for i in range(130)],
                                                              abs=1e-5)


def test_concurrent_requests_of_many_pairs_stay_within_the_rerankers_queue(triton_server):
    """Six requests of 300 one-pair groups at once: 1,800 requests to the rerank model, which queues at most
    256; the frontend keeps 128 in flight for all of them, so none is refused."""
    def one(n: int) -> httpx.Response:
        body = {"model": "rerank", "text_1": [f"question {n}.{i}" for i in range(300)],
                "text_2": [f"passage {i}" for i in range(300)]}
        with httpx.Client(base_url=triton_server.openai_url, timeout=300) as client:
            return client.post("/v1/score", json=body)

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(one, range(6)))
    assert [a.status_code for a in answers] == [200] * 6, [a.text[:300] for a in answers if a.status_code != 200]


def test_an_unknown_model_is_404(http):
    response = http.post("/v1/score", json={"model": "no_such_reranker", "text_1": "q", "text_2": "d"})
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"


def test_score_is_counted_under_its_own_endpoints(http):
    def requests(path: str) -> float:
        line = f'ragstack_openai_requests_total{{endpoint="{path}",model="rerank"}} '
        text = http.get("/metrics").text
        return next((float(l.removeprefix(line)) for l in text.splitlines() if l.startswith(line)), 0.0)

    for path in ("/score", "/v1/score"):
        before = requests(path)
        answered(http.post(path, json={"model": "rerank", "text_1": "q", "text_2": "d"}))
        assert requests(path) == before + 1
