"""Benchmark of RAG queries against a running server: client-side end-to-end latency, TTFT and queries/s
at each concurrency, and a per-step breakdown from the server's per-model metrics (deltas of /metrics
read before and after each level, divided by that model's request count)."""
from __future__ import annotations

import threading
import time
import urllib.request

import numpy as np

from ragstack.client import RagClient
from ragstack.results import RagstackError

# Questions about data/sample_corpus, so retrieval and reranking work on real matches.
QUESTIONS = [
    "How does Triton batch requests?",
    "What is an ensemble model?",
    "How are documents chunked for retrieval?",
    "What does a cross-encoder reranker do?",
    "How does paged attention store the KV cache?",
    "What is continuous batching?",
    "Which metrics does Triton publish for Prometheus?",
    "How do model versions work in the model repository?",
]
# Fixed-length greedy answers: every request costs the same, so levels and runs compare.
SAMPLING = {"temperature": 0, "ignore_eos": True}
# The leaf models of the rag ensemble, in pipeline order (rerank_tokenizer and reranker: called by
# rag_rerank only when the served reranker is not the embedder's cosine).
STEPS = ["embed_tokenizer", "embedder", "retriever", "rag_rerank", "rerank_tokenizer", "reranker",
         "prompt_builder", "rag_generate", "llm"]
COUNTERS = ["nv_inference_request_success", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
            "nv_inference_compute_infer_duration_us", "triton_llm_time_to_first_token_seconds_sum",
            "triton_llm_time_to_first_token_seconds_count", "triton_llm_time_to_first_response_seconds_sum",
            "triton_llm_time_to_first_response_seconds_count", "triton_llm_e2e_request_latency_seconds_sum",
            "triton_llm_e2e_request_latency_seconds_count"]
DEFAULT_METRICS_URL = "http://127.0.0.1:8002/metrics"


def scrape(metrics_url: str, names=COUNTERS) -> dict[tuple[str, str], float]:
    """{(counter, model): value} for the `names`, summed over versions (and other labels)."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    values: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if name in names and 'model="' in rest:
            model = rest.split('model="', 1)[1].split('"', 1)[0]
            values[(name, model)] = values.get((name, model), 0.0) + float(line.rsplit(" ", 1)[1])
    return values


def breakdown(before: dict, after: dict) -> dict[str, dict[str, float]]:
    """Per step: calls and mean request / queue / compute ms per call; for the llm also the engine's TTFT,
    the time to its first response in Triton's hands and end-to-end ms (its nv_ request time ends when
    execute returns, before the tokens stream)."""
    def delta(name, model):
        return after.get((name, model), 0.0) - before.get((name, model), 0.0)

    steps = {}
    for model in STEPS:
        calls = delta("nv_inference_request_success", model)
        if calls <= 0:
            continue
        steps[model] = {"calls": calls, **{key: delta(f"nv_inference_{metric}_duration_us", model) / calls / 1e3
                                           for key, metric in (("request_ms", "request"), ("queue_ms", "queue"),
                                                               ("compute_ms", "compute_infer"))}}
        for key, metric in (("ttft_ms", "time_to_first_token"), ("first_response_ms", "time_to_first_response"),
                            ("e2e_ms", "e2e_request_latency")):
            count = delta(f"triton_llm_{metric}_seconds_count", model)
            if count > 0:
                steps[model][key] = delta(f"triton_llm_{metric}_seconds_sum", model) / count * 1e3
    return steps


def _one_query(client: RagClient, question: str, max_tokens: int) -> tuple[float, float]:
    """(TTFT, end-to-end) seconds of one streamed query."""
    start = time.perf_counter()
    ttft = None
    for _ in client.query(question, sampling_parameters=SAMPLING, max_tokens=max_tokens):
        ttft = ttft or time.perf_counter() - start
    end = time.perf_counter() - start
    return (ttft or end), end


def run_level(url: str, protocol: str, concurrency: int, requests: int, max_tokens: int,
              metrics_url: str, tls=None) -> dict:
    """`requests` queries from `concurrency` threads, one client (one gRPC channel) each."""
    ttfts, e2es, errors = [], [], []
    lock = threading.Lock()

    def worker(w: int) -> None:
        with RagClient(url, protocol, tls=tls) as client:
            for i in range(w, requests, concurrency):
                try:
                    ttft, e2e = _one_query(client, QUESTIONS[i % len(QUESTIONS)], max_tokens)
                except RagstackError as exc:
                    with lock:
                        errors.append(str(exc))
                    continue
                with lock:
                    ttfts.append(ttft)
                    e2es.append(e2e)

    before = scrape(metrics_url)
    threads = [threading.Thread(target=worker, args=(w,)) for w in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    steps = breakdown(before, scrape(metrics_url))

    def ms(values, q):
        return float(np.percentile(values, q) * 1e3) if values else float("nan")
    return {"concurrency": concurrency, "requests": requests, "ok": len(e2es), "errors": errors[:3],
            "seconds": elapsed, "qps": len(e2es) / elapsed, "e2e_p50_ms": ms(e2es, 50), "e2e_p99_ms": ms(e2es, 99),
            "ttft_p50_ms": ms(ttfts, 50), "ttft_p99_ms": ms(ttfts, 99), "steps": steps}


def bench(url: str, protocol: str = "grpc", levels=(1, 8), requests: int = 32, max_tokens: int = 64,
          metrics_url: str = DEFAULT_METRICS_URL, tls=None) -> list[dict]:
    """`tls`: as RagClient's (the metrics are scraped as `metrics_url` says)."""
    # One untimed query first: the first request through each model pays for lazy initialisation.
    with RagClient(url, protocol, tls=tls) as client:
        _one_query(client, QUESTIONS[0], max_tokens)
    return [run_level(url, protocol, c, requests, max_tokens, metrics_url, tls) for c in levels]


def table(rows: list[dict]) -> str:
    """One markdown table: a column per concurrency; step cells are per call, request (queue) ms."""
    def cells(fn):
        return " | ".join(fn(r) for r in rows)

    def step(model):
        def cell(r):
            s = r["steps"].get(model)
            return f"{s['request_ms']:.1f} ({s['queue_ms']:.1f})" if s else "-"
        return cell

    lines = ["| measure | " + cells(lambda r: f"concurrency {r['concurrency']}") + " |",
             "|---|" + "---|" * len(rows),
             "| requests ok | " + cells(lambda r: f"{r['ok']}/{r['requests']}") + " |",
             "| queries/s | " + cells(lambda r: f"{r['qps']:.2f}") + " |",
             "| end-to-end p50 / p99 ms | " + cells(lambda r: f"{r['e2e_p50_ms']:.0f} / {r['e2e_p99_ms']:.0f}") + " |",
             "| TTFT p50 / p99 ms | " + cells(lambda r: f"{r['ttft_p50_ms']:.0f} / {r['ttft_p99_ms']:.0f}") + " |"]
    lines += [f"| {model} request (queue) ms | " + cells(step(model)) + " |" for model in STEPS]
    def llm(r):
        s = r["steps"].get("llm", {})
        return f"{s['ttft_ms']:.0f} / {s['e2e_ms']:.0f}" if "ttft_ms" in s else "-"
    lines.append("| llm engine TTFT / end-to-end ms | " + cells(llm) + " |")
    return "\n".join(lines)

