"""Concurrent load on a running server: decoupled models (llm, rag) over gRPC, one stream per request.

Every request is followed to its end and classified: `ok` (responses, then exactly one FINAL),
`error` (an error response, the request's last), `hung` (no FINAL before the deadline), `lost`
(the stream closed without a FINAL), `duplicate` (anything after the FINAL or the error) or
`cancelled` (the client cancelled it on purpose). Requests are built as protos directly because
tritonclient's asyncio stream cannot ask for the empty FINAL response (a reserved parameter),
and without it rag_generate's end of stream would be invisible.
"""
from __future__ import annotations

import asyncio
import functools
import json
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

OK, ERROR, HUNG, LOST, DUPLICATE, CANCELLED = "ok", "error", "hung", "lost", "duplicate", "cancelled"
GREEDY = {"temperature": 0.0, "ignore_eos": True}  # fixed-length answers: every request costs the same


@dataclass
class Outcome:
    status: str
    seconds: float                 # from sending to the end (FINAL, error, deadline, close)
    first_s: float | None = None   # to the first response
    responses: int = 0
    error: str = ""                # the error response's message, or the client-side failure


def llm_tensors(prompt: str, max_tokens: int, sampling: dict | None = None) -> dict:
    return {"text_input": [prompt.encode()], "stream": [True],
            "sampling_parameters": [json.dumps({**GREEDY, **(sampling or {})}).encode()],
            "max_tokens": np.array([max_tokens], dtype=np.int32)}


def rag_tensors(query: str, max_tokens: int, top_k: int | None = None) -> dict:
    tensors = {"query": [query.encode()], "stream": [True], "sampling_parameters": [json.dumps(GREEDY).encode()],
               "max_tokens": np.array([max_tokens], dtype=np.int32)}
    if top_k is not None:  # fewer passages to rerank: the cross-encoder is the costly step on a CPU
        tensors["top_k"] = np.array([top_k], dtype=np.int32)
    return tensors


def request_proto(model: str, tensors: dict, request_id: str) -> service_pb2.ModelInferRequest:
    """Single-element BYTES (list of bytes), BOOL (list of bool) or INT32 (numpy) inputs."""
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    for name, values in tensors.items():
        value = values[0]
        if isinstance(value, bytes):
            tensor = request.inputs.add(name=name, datatype="BYTES", shape=[1])
            tensor.contents.bytes_contents.append(value)
        elif isinstance(value, (bool, np.bool_)):
            tensor = request.inputs.add(name=name, datatype="BOOL", shape=[1])
            tensor.contents.bool_contents.append(bool(value))
        else:
            tensor = request.inputs.add(name=name, datatype="INT32", shape=[1])
            tensor.contents.int_contents.append(int(value))
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    return request


async def run_one(stub, request: service_pb2.ModelInferRequest, timeout_s: float,
                  cancel_after: int | None = None, on_response: Callable[[], None] | None = None) -> Outcome:
    """Sends one request on its own stream and reads the stream to its end. `cancel_after`: cancel
    the request once that many responses arrived (0: right after sending); `on_response` is called
    on each response."""
    async def one():
        yield request

    start = time.perf_counter()
    call = stub.ModelStreamInfer(one(), timeout=timeout_s)
    first = None
    responses = 0
    ended = ""        # "final" or "error" once the request's last response came
    error = ""
    extra = False     # something arrived after the end
    try:
        if cancel_after == 0:
            call.cancel()
        async for response in call:
            first = first if first is not None else time.perf_counter() - start
            if ended:
                extra = True
                continue
            responses += 1
            if on_response is not None:
                on_response()
            if response.error_message:
                ended, error = "error", response.error_message
            elif response.infer_response.parameters["triton_final_response"].bool_param:
                ended = "final"
            if cancel_after is not None and responses >= cancel_after and not ended:
                call.cancel()
    except grpc.aio.AioRpcError as exc:
        seconds = time.perf_counter() - start
        if exc.code() == grpc.StatusCode.CANCELLED and cancel_after is not None:
            return Outcome(CANCELLED, seconds, first, responses)
        if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            return Outcome(HUNG, seconds, first, responses, f"no FINAL within {timeout_s:.0f} s")
        return Outcome(ERROR, seconds, first, responses, f"{exc.code().name}: {exc.details()}")
    except asyncio.CancelledError:
        if cancel_after is None:
            raise
        return Outcome(CANCELLED, time.perf_counter() - start, first, responses)
    seconds = time.perf_counter() - start
    if extra:
        return Outcome(DUPLICATE, seconds, first, responses, error)
    if ended == "final":
        return Outcome(OK, seconds, first, responses)
    if ended == "error":
        return Outcome(ERROR, seconds, first, responses, error)
    return Outcome(LOST, seconds, first, responses, "stream closed without a FINAL response")


async def run_many(url: str, model: str, tensors_list: list[dict], timeout_s: float = 120.0,
                   cancel_after: list[int | None] | None = None, channels: int = 4,
                   on_response: Callable[[int], None] | None = None) -> tuple[list[Outcome], float]:
    """All requests at once (their concurrency is their number), spread over a few channels.
    Returns the outcomes in order and the wall time. `on_response(i)`: request i got a response."""
    opened = [grpc.aio.insecure_channel(url, options=[("grpc.max_receive_message_length", 64 << 20)])
              for _ in range(channels)]
    stubs = [service_pb2_grpc.GRPCInferenceServiceStub(c) for c in opened]
    cancel_after = cancel_after or [None] * len(tensors_list)
    start = time.perf_counter()
    try:
        outcomes = await asyncio.gather(*(
            run_one(stubs[i % channels], request_proto(model, tensors, f"{model}-{i}"), timeout_s, cancel_after[i],
                    None if on_response is None else functools.partial(on_response, i))
            for i, tensors in enumerate(tensors_list)))
    finally:
        for c in opened:
            await c.close()
    return list(outcomes), time.perf_counter() - start


async def mixed(url: str, llm_count: int, rag_count: int, llm_tokens: int, rag_tokens: int,
                rag_top_k: int | None = None, timeout_s: float = 300.0,
                on_response: Callable[[int], None] | None = None) -> dict:
    """`llm_count` streaming llm requests and `rag_count` rag queries, all at once; a summary of each."""
    from ragstack.rag_bench import QUESTIONS  # noqa: PLC0415 - questions about the sample corpus

    llm = [llm_tensors(f"request {i} is about", llm_tokens) for i in range(llm_count)]
    rag = [rag_tensors(QUESTIONS[i % len(QUESTIONS)], rag_tokens, rag_top_k) for i in range(rag_count)]
    (llm_out, llm_wall), (rag_out, rag_wall) = await asyncio.gather(
        run_many(url, "llm", llm, timeout_s, on_response=on_response),
        run_many(url, "rag", rag, timeout_s, on_response=on_response))
    return {"llm": summarize(llm_out, llm_wall), "rag": summarize(rag_out, rag_wall)}


def summarize(outcomes: list[Outcome], wall_s: float) -> dict:
    """Counts by status, errors by message (a gRPC stream's error carries no status code, so the
    message is what tells them apart), completed requests/s, latency percentiles of the ok ones."""
    ok = [o for o in outcomes if o.status == OK]
    latencies = [o.seconds for o in ok]
    firsts = [o.first_s for o in ok if o.first_s is not None]

    def ms(values, q):
        return float(np.percentile(values, q) * 1e3) if values else float("nan")

    return {"requests": len(outcomes), **{s: sum(o.status == s for o in outcomes)
                                          for s in (OK, ERROR, HUNG, LOST, DUPLICATE, CANCELLED)},
            "errors": dict(Counter(_error_kind(o.error) for o in outcomes if o.status == ERROR)),
            # responses a hung request had before it stopped: 0 is stuck before its first token
            "hung_after_responses": dict(Counter(o.responses for o in outcomes if o.status == HUNG)),
            "wall_s": wall_s, "per_s": len(ok) / wall_s if wall_s else float("nan"),
            "p50_ms": ms(latencies, 50), "p99_ms": ms(latencies, 99), "first_p99_ms": ms(firsts, 99)}


def _error_kind(message: str) -> str:
    """An error message without its numbers, so that equal failures count together."""
    return "".join(c for c in message if not c.isdigit())[:120]


async def overload(url: str, model: str, burst: int, max_tokens: int, timeout_s: float = 300.0) -> dict:
    """A request alone, a burst of `burst` at once (beyond the model's queue), a request alone again.
    Admitted requests must finish and the rest be refused at once with a message; the admitted ones'
    latency is bounded by the queue's depth, not by the burst."""
    tensors = llm_tensors("overload", max_tokens)
    [alone], _ = await run_many(url, model, [tensors], timeout_s)
    outcomes, wall = await run_many(url, model, [tensors] * burst, timeout_s)
    [after], _ = await run_many(url, model, [tensors], timeout_s)
    admitted = [o.seconds for o in outcomes if o.status == OK]
    refused = [o for o in outcomes if o.status == ERROR]
    return {"burst": burst, "alone": alone, "after": after, "admitted": len(admitted), "refused": len(refused),
            "other": len(outcomes) - len(admitted) - len(refused),
            "errors": dict(Counter(o.error for o in refused)), "refused_max_ms": max((o.seconds * 1e3 for o in refused),
                                                                                    default=float("nan")),
            "admitted_p99_ms": float(np.percentile(admitted, 99) * 1e3) if admitted else float("nan"), "wall_s": wall}
