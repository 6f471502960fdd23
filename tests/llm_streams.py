"""gRPC streaming helpers for the decoupled llm model: collect every response of a request and
know when its FINAL one arrived."""
from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc as grpcclient


def llm_inputs(prompt: str | None = None, *, stream: bool = True, sampling: dict | None = None,
               messages: list | None = None, max_tokens: int | None = None, extra: dict | None = None,
               prompt_token_ids: list[int] | None = None):
    tensors = []

    def add(name, value, dtype):
        arr = np.array([value], dtype=np.object_ if dtype == "BYTES" else
                       {"BOOL": np.bool_, "INT32": np.int32}[dtype])
        t = grpcclient.InferInput(name, [1], dtype)
        t.set_data_from_numpy(arr)
        tensors.append(t)

    if prompt is not None:
        add("text_input", prompt.encode(), "BYTES")
    if messages is not None:
        add("messages", json.dumps(messages).encode(), "BYTES")
    if prompt_token_ids is not None:
        ids = grpcclient.InferInput("prompt_token_ids", [len(prompt_token_ids)], "INT32")
        ids.set_data_from_numpy(np.array(prompt_token_ids, dtype=np.int32))
        tensors.append(ids)
    add("stream", stream, "BOOL")
    add("return_finish_reason", True, "BOOL")  # sent only when asked, as vllm_backend does
    if sampling is not None:
        add("sampling_parameters", json.dumps(sampling).encode(), "BYTES")
    if max_tokens is not None:
        add("max_tokens", max_tokens, "INT32")
    for name, (value, dtype) in (extra or {}).items():
        add(name, value, dtype)
    return tensors


@dataclass
class Collected:
    texts: list[str] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    finals: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    results: list = field(default_factory=list)   # each response's InferResult

    @property
    def text(self) -> str:
        return "".join(self.texts)


class StreamSession:
    """One gRPC stream carrying many requests, responses sorted by request id."""

    def __init__(self, url: str):
        self.client = grpcclient.InferenceServerClient(url)
        self.requests: dict[str, Collected] = {}
        self.errors: list[str] = []
        self.client.start_stream(callback=self._callback)

    def _callback(self, result, error):
        if error is not None:
            # The stream's error responses carry no request id: attribute one only when a single
            # request is pending (tests that expect errors send one request per stream).
            self.errors.append(str(error))
            pending = [c for c in self.requests.values() if not c.done.is_set()]
            if len(pending) == 1:
                pending[0].errors.append(str(error))
                pending[0].finals += 1
                pending[0].done.set()
            return
        response = result.get_response()
        collected = self.requests[response.id]
        collected.results.append(result)
        text = result.as_numpy("text_output")
        if text is not None and text.size:
            collected.texts.append(text.reshape(-1)[0].decode())
        reason = result.as_numpy("finish_reason")
        if reason is not None and reason.size and reason.reshape(-1)[0] not in (b"", b"None"):
            collected.finish_reasons.append(reason.reshape(-1)[0].decode())
        if response.parameters["triton_final_response"].bool_param:
            collected.finals += 1
            collected.done.set()

    def send(self, request_id: str, inputs, model: str = "llm") -> Collected:
        collected = self.requests[request_id] = Collected()
        self.client.async_stream_infer(model, inputs, request_id=request_id, enable_empty_final_response=True)
        return collected

    def wait_all(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        for rid, c in self.requests.items():
            if not c.done.wait(max(0.0, deadline - time.monotonic())):
                raise AssertionError(f"request {rid} got no FINAL response within {timeout} s")

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()
