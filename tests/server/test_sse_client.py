"""bench_serving's lean SSE client against the real OpenAI frontend: streamed completions read off kept-alive
connections (each request's tokens, the connection reused), and an error status raised with its body."""
from __future__ import annotations

import asyncio
import json
import urllib.parse

import pytest

from benchmarks import bench_serving
from benchmarks.sse_client import HTTPStatusError, SSEConnection

pytestmark = pytest.mark.server


def test_run_openai_reads_each_request_on_kept_alive_connections(triton_server):
    requests = [("Hello there", 4), ("Hi", 3), ("Good morning", 5)]
    results, _ = asyncio.run(bench_serving.run_openai(triton_server.openai_url, requests, concurrency=2))
    assert [r.tokens for r in results] == [4, 3, 5]
    assert all(r.ttft > 0 and len(r.gaps) <= n - 1 for r, (_, n) in zip(results, requests))


def test_the_frontends_requests_per_worker_are_read_from_its_metrics(triton_server):
    """bench_serving's spread of the connections over the frontend's workers (one here: no pid label)."""
    before = bench_serving.worker_requests(triton_server.openai_url)
    asyncio.run(bench_serving.run_openai(triton_server.openai_url, [("Hello", 2)] * 3, concurrency=3))
    after = bench_serving.worker_requests(triton_server.openai_url)
    key = (bench_serving.WORKER_REQUESTS, "")
    assert list(after) == [key] and after[key] - before.get(key, 0) == 3


def test_one_connection_serves_requests_one_after_the_other(triton_server):
    address = urllib.parse.urlsplit(triton_server.openai_url)

    async def two() -> tuple[list[list[bytes]], bool]:
        connection = SSEConnection(address.hostname, address.port)
        answers, writers = [], []
        for prompt in ("one", "two"):
            body = json.dumps({"model": "llm", "prompt": prompt, "max_tokens": 2, "stream": True}).encode()
            answers.append([data async for data in connection.events("/v1/completions", body)])
            writers.append(connection._writer)
        await connection.close()
        return answers, writers[0] is writers[1]

    answers, reused = asyncio.run(two())
    assert reused
    for data in answers:
        assert data[-1] == b"[DONE]" and all("choices" in json.loads(d) for d in data[:-1])


def test_an_error_status_is_raised_with_its_body(triton_server):
    address = urllib.parse.urlsplit(triton_server.openai_url)

    async def refused():
        connection = SSEConnection(address.hostname, address.port)
        body = json.dumps({"model": "llm", "prompt": "x", "temperature": -1, "stream": True}).encode()
        try:
            return [data async for data in connection.events("/v1/completions", body)]
        finally:
            await connection.close()

    with pytest.raises(HTTPStatusError, match="temperature") as error:
        asyncio.run(refused())
    assert error.value.status == 400
