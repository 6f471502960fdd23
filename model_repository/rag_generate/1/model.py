"""rag_generate (decoupled): messages + sources -> the llm's answer, streamed, with the sources.

Each request is relayed by a thread: a BLS request to the llm with the same `stream`,
`sampling_parameters`, `max_tokens` and request parameters (where the HTTP generate endpoint puts
its "parameters"); every llm response is forwarded as it comes, the sources ride on the first.
With stream=false the llm answers once and so does this model, in one FINAL response, which the
HTTP /generate endpoint requires. Every request ends with exactly one FINAL response.

Limit: the BLS API of Triton 2.51 cannot cancel a request it has sent, so a client that cancels
stops receiving at once, but the llm finishes that generation (bounded by max_tokens).

Each relay runs in a thread of its own, watched by the pool thread that holds the request's
max_inflight slot: after llm_idle_timeout_s without a response from the llm, the watcher ends the
request with UNAVAILABLE and frees the slot. Triton 2.51's BLS response iterator has no timeout, and
when the llm's stub process dies it never answers again: without the watcher the request, and its
slot, would wait forever (the relay thread still does, and is left behind). A BLS request and its
responses stay in that one thread, as in the Python backend's own BLS examples.
"""
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
PASSED_TO_LLM = ("messages", "stream", "sampling_parameters", "max_tokens")
REQUIRED = ("messages", "sources")


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        self.llm = params.get("llm_model", "llm")
        self.max_inflight = int(params.get("max_inflight", "64"))
        self.idle_timeout_s = float(params.get("llm_idle_timeout_s", "60"))
        self.slots = threading.BoundedSemaphore(self.max_inflight)
        self.pool = ThreadPoolExecutor(max_workers=self.max_inflight, thread_name_prefix="rag_generate")

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            # Triton 2.51 lets a required input go missing when a model has optional ones.
            missing = [name for name in REQUIRED if pb_utils.get_input_tensor_by_name(request, name) is None]
            if missing:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"rag_generate: missing input(s) {missing}", pb_utils.TritonError.INVALID_ARG)), flags=FINAL)
                continue
            if not self.slots.acquire(blocking=False):
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"rag_generate: {self.max_inflight} requests in flight, the limit (parameter max_inflight); "
                    "retry later", pb_utils.TritonError.UNAVAILABLE)), flags=FINAL)
                continue
            self.pool.submit(self._relay, request, sender)
        return None

    def _relay(self, request, sender):
        """Runs in the pool: starts the relay and waits for it, or for the llm to go silent."""
        relay = _Relay(sender)
        threading.Thread(target=self._forward, args=(request, relay), daemon=True, name="rag_generate-relay").start()
        try:
            while not relay.done.wait(0.25):
                if time.monotonic() - relay.last_response > self.idle_timeout_s:
                    relay.abandon(
                        f"rag_generate: no response from {self.llm} for {self.idle_timeout_s:.0f} s (parameter "
                        "llm_idle_timeout_s); the request is abandoned")
                    return
        finally:
            self.slots.release()

    def _forward(self, request, relay):
        try:
            self._generate(request, relay)
        except Exception as error:  # noqa: BLE001 - the client must still get its FINAL response
            relay.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"rag_generate: {error}")), FINAL)
        finally:
            relay.done.set()

    def _generate(self, request, relay):
        sender = relay.sender
        inputs = [t for t in (pb_utils.get_input_tensor_by_name(request, n) for n in PASSED_TO_LLM) if t is not None]
        inputs.append(pb_utils.Tensor("exclude_input_in_output", np.array([True])))
        stream_tensor = pb_utils.get_input_tensor_by_name(request, "stream")
        stream = bool(stream_tensor.as_numpy().reshape(-1)[0]) if stream_tensor is not None else False
        sources = pb_utils.get_input_tensor_by_name(request, "sources").as_numpy()
        llm_request = pb_utils.InferenceRequest(
            model_name=self.llm, inputs=inputs, requested_output_names=["text_output", "finish_reason"],
            parameters=json.loads(request.parameters() or "{}"))

        first = True
        for response in llm_request.exec(decoupled=True):
            relay.last_response = time.monotonic()
            if sender.is_cancelled():
                relay.send(None, FINAL)
                return
            if response.has_error():
                relay.send(pb_utils.InferenceResponse(error=response.error()), FINAL)
                return
            tensors = response.output_tensors()
            if not tensors:
                continue
            if first:
                tensors = [*tensors, pb_utils.Tensor("sources", sources)]
                first = False
            if not relay.send(pb_utils.InferenceResponse(tensors), 0 if stream else FINAL) or not stream:
                return
        if first:  # the llm sent no output at all: still deliver the sources
            relay.send(pb_utils.InferenceResponse([pb_utils.Tensor("sources", sources)]), FINAL)
        else:
            relay.send(None, FINAL)

    def finalize(self):
        self.pool.shutdown(wait=True)


class _Relay:
    """One request's responses to the client: the relay thread's, or the watcher's error once it gives
    up. After a FINAL nothing more is sent, whoever tries."""

    def __init__(self, sender):
        self.sender = sender
        self.done = threading.Event()
        self.last_response = time.monotonic()
        self._lock = threading.Lock()
        self._closed = False

    def send(self, response, flags) -> bool:
        """False once the request is closed: the relay stops."""
        with self._lock:
            if self._closed:
                return False
            self._closed = bool(flags & FINAL)
            if response is None:
                self.sender.send(flags=flags)
            else:
                self.sender.send(response, flags=flags)
            return True

    def abandon(self, message: str) -> None:
        self.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message, pb_utils.TritonError.UNAVAILABLE)),
                  FINAL)
