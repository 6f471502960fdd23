"""The frontend's own Prometheus metrics, on its `GET /metrics` (the compose Prometheus scrapes them):
requests, errors, latency and time to first token, by endpoint and model; the requests each worker answered.

`model` is a model the frontend serves or "" (a name it refused): client-chosen names never become
series. An error in a stream already answered 200 counts with the error's status.

With several workers (--openai-workers; $PROMETHEUS_MULTIPROC_DIR set by their supervisor) each
process writes its values to that folder and /metrics, whichever worker answers, adds up every
worker's (prometheus_client's multiprocess mode; requests in flight: the live workers' sum).
"""
from __future__ import annotations

import os
import time

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REGISTRY = CollectorRegistry()
LABELS = ("endpoint", "model")
# Seconds; up to the llm's longest generations.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

REQUESTS = Counter("ragstack_openai_requests", "Requests answered, by endpoint and model", LABELS, registry=REGISTRY)
ERRORS = Counter("ragstack_openai_errors", "Requests answered with an error (also inside a stream), by status",
                 (*LABELS, "status"), registry=REGISTRY)
LATENCY = Histogram("ragstack_openai_request_duration_seconds", "Arrival to the answer's last byte", LABELS,
                    buckets=BUCKETS, registry=REGISTRY)
TTFT = Histogram("ragstack_openai_time_to_first_token_seconds", "Arrival to a streamed answer's first text",
                 LABELS, buckets=BUCKETS, registry=REGISTRY)
IN_FLIGHT = Gauge("ragstack_openai_requests_in_flight", "Requests being answered now", ("endpoint",),
                  registry=REGISTRY, multiprocess_mode="livesum")
# One series per live worker (its pid, with several): how the kernel spread the clients' connections over them.
WORKER_REQUESTS = Gauge("ragstack_openai_worker_requests", "API requests this worker process answered (probes apart)",
                        registry=REGISTRY, multiprocess_mode="liveall")
PROBES = ("/health", "/ping", "/version")
# The endpoint label: the API's paths (probes apart from requests), anything else as "other".
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/rerank", "/rerank", "/v2/rerank",
             "/score", "/v1/score", "/v1/models", "/tokenize", "/v1/tokenize", "/detokenize", "/v1/detokenize",
             "/health", "/ping", "/version")


def endpoint_of(path: str) -> str:
    if path in ENDPOINTS:
        return path
    if not path.startswith("/v1/models/"):
        return "other"
    action = path.rsplit("/", 1)[-1]   # the admin's load and unload apart from reads
    return f"/v1/models/{{id}}/{action}" if action in ("load", "unload") and path.count("/") == 4 else "/v1/models/{id}"


def first_token(request: Request) -> None:
    state = request.scope.setdefault("state", {})
    if "first_token" not in state:
        state["first_token"] = time.perf_counter()
        TTFT.labels(endpoint_of(request.url.path), state.get("model", "")).observe(
            state["first_token"] - state["started"])


def failed(request: Request, status: int) -> None:
    request.scope.setdefault("state", {})["error_status"] = status


def served_model(request: Request, model: str) -> None:
    request.scope.setdefault("state", {})["model"] = model


def exposition(_request: Request) -> Response:
    if "PROMETHEUS_MULTIPROC_DIR" in os.environ:   # every worker's, read from their files
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)


class Metrics:
    """ASGI middleware: counts every request of the API once its answer has ended."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/metrics":
            await self.app(scope, receive, send)
            return
        endpoint = endpoint_of(scope["path"])
        state = scope.setdefault("state", {})
        state["started"] = time.perf_counter()
        status = 500

        async def sent(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        IN_FLIGHT.labels(endpoint).inc()
        try:
            await self.app(scope, receive, sent)
        finally:
            IN_FLIGHT.labels(endpoint).dec()
            model = state.get("model", "")
            REQUESTS.labels(endpoint, model).inc()
            if endpoint not in PROBES:
                WORKER_REQUESTS.inc()
            LATENCY.labels(endpoint, model).observe(time.perf_counter() - state["started"])
            status = state.get("error_status", status)
            if status >= 400:
                ERRORS.labels(endpoint, model, str(status)).inc()
