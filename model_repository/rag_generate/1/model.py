"""rag_generate (decoupled): messages + sources -> the llm's answer, streamed, with the sources.

Each request is relayed by a thread: a BLS request to the llm with the same `stream`,
`sampling_parameters`, `max_tokens` and request parameters (where the HTTP generate endpoint puts
its "parameters"); every llm response is forwarded as it comes, the sources ride on the first.
With stream=false the llm answers once and so does this model, in one FINAL response, which the
HTTP /generate endpoint requires. Every request ends with exactly one FINAL response. The token counts
(return_num_input_tokens / return_num_output_tokens) and the stop reason (return_stop_reason) are the
llm's, asked of it and relayed as it sends them: num_input_tokens the prompt's (with the passages),
num_output_tokens per response when streaming, stop_reason JSON (null until the last response).

Triton 2.51's BLS cannot cancel a request it has sent, and loses a decoupled callee's error response
that follows its first response. So each llm request carries a key (request parameter
ragstack_cancel_key: the caller's, such as the HTTP gateway's, or a new one): when this request is
cancelled, the watcher ends it and sends the llm a control request with that key (ragstack_abort),
which frees the generation at the llm's next step; a caller holding the key can do the same. (The
`rag` ensemble passes a client's cancellation on only to steps it schedules after it, so a gRPC
client that cancels mid-stream is not seen here; the gateway aborts by the key.) The llm is asked
to send its errors as data (ragstack_errors_in_band: an `error` output, JSON code and message), which
this model turns back into an error response.

Each relay runs in a thread of its own, watched by the pool thread that holds the request's
max_inflight slot: after llm_idle_timeout_s without a response from the llm, the watcher ends the
request with UNAVAILABLE and frees the slot. Triton 2.51's BLS response iterator has no timeout, and
when the llm's stub process dies it never answers again: without the watcher the request, and its
slot, would wait forever (the relay thread still does, and is left behind). A BLS request and its
responses stay in that one thread, as in the Python backend's own BLS examples.

answer_format "json" (structured_answer.py) asks the llm for {"answer", "citations"} under a JSON
schema whose citations can only be the numbers of the sources given, and checks the complete answer.
"""
import faulthandler
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import structured_answer
import triton_python_backend_utils as pb_utils

# Triton logs no word when a stub dies: a segfault here prints every thread's stack to the server log
faulthandler.enable()

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# The llm's control parameters (backends/triton_llm/llm_request.py: CANCEL_KEY, ABORT_KEY, ERRORS_IN_BAND).
CANCEL_KEY, ABORT_KEY, ERRORS_IN_BAND = "ragstack_cancel_key", "ragstack_abort", "ragstack_errors_in_band"
# The llm's outputs relayed when asked for, by their return_* inputs (passed on to the llm).
RELAYED = {"return_num_input_tokens": "num_input_tokens", "return_num_output_tokens": "num_output_tokens",
           "return_stop_reason": "stop_reason"}
PASSED_TO_LLM = ("stream", "max_tokens", *RELAYED)
REQUIRED = ("messages", "sources")


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        self.llm = params.get("llm_model", "llm")
        self.max_inflight = int(params.get("max_inflight", "64"))
        self.idle_timeout_s = float(params.get("llm_idle_timeout_s", "60"))
        self.max_answer_chars = int(params.get("max_answer_chars", "2000"))
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
        """Runs in the pool: starts the relay and waits for it, for the client to cancel, or for the
        llm to go silent."""
        # The caller's key (the HTTP gateway's) names the llm request too, so the caller can abort it.
        key = json.loads(request.parameters() or "{}").get(CANCEL_KEY) or uuid.uuid4().hex
        relay = _Relay(sender, str(key))
        threading.Thread(target=self._forward, args=(request, relay), daemon=True, name="rag_generate-relay").start()
        try:
            while not relay.done.wait(0.25):
                if relay.client_cancelled():
                    relay.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                        "request cancelled by the client", pb_utils.TritonError.CANCELLED)), FINAL)
                    self._abort_llm(relay.key)
                    return
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
        inputs = [t for t in (pb_utils.get_input_tensor_by_name(request, n) for n in PASSED_TO_LLM) if t is not None]
        inputs.append(pb_utils.Tensor("exclude_input_in_output", np.array([True])))
        inputs.append(pb_utils.Tensor("return_finish_reason", np.array([True])))
        stream_tensor = pb_utils.get_input_tensor_by_name(request, "stream")
        stream = bool(stream_tensor.as_numpy().reshape(-1)[0]) if stream_tensor is not None else False
        sources = pb_utils.get_input_tensor_by_name(request, "sources").as_numpy()
        messages, sampling = _text(request, "messages"), _text(request, "sampling_parameters")
        answer_format = _text(request, "answer_format") or "text"
        num_sources = len(json.loads(sources.reshape(-1)[0]))
        if answer_format not in structured_answer.FORMATS:
            relay.send(_invalid(f"answer_format: {answer_format!r} is not one of {list(structured_answer.FORMATS)}"),
                       FINAL)
            return
        if answer_format == "json":
            max_chars = self.max_answer_chars
            tensor = pb_utils.get_input_tensor_by_name(request, "max_answer_chars")
            if tensor is not None:
                max_chars = int(tensor.as_numpy().reshape(-1)[0])
                if not 1 <= max_chars <= self.max_answer_chars:
                    relay.send(_invalid(f"max_answer_chars: {max_chars} is out of range; it must be 1 to "
                                        f"{self.max_answer_chars} (parameter max_answer_chars)"), FINAL)
                    return
            try:
                sampling, messages = structured_answer.constrained(sampling, messages, num_sources, max_chars)
            except ValueError as error:
                relay.send(_invalid(f"rag_generate: {error}"), FINAL)
                return
        inputs.append(pb_utils.Tensor("messages", np.array([messages.encode()], dtype=object)))
        if sampling is not None:
            inputs.append(pb_utils.Tensor("sampling_parameters", np.array([sampling.encode()], dtype=object)))
        parameters = {**json.loads(request.parameters() or "{}"), CANCEL_KEY: relay.key, ERRORS_IN_BAND: True}
        relayed = [output for flag, output in RELAYED.items() if _flag(request, flag)]
        llm_request = pb_utils.InferenceRequest(
            model_name=self.llm, inputs=inputs,
            requested_output_names=["text_output", "finish_reason", "error", *relayed],
            parameters=parameters)

        first, answer = True, []
        for response in llm_request.exec(decoupled=True):
            relay.last_response = time.monotonic()
            if response.has_error():
                relay.send(pb_utils.InferenceResponse(error=response.error()), FINAL)
                return
            error = pb_utils.get_output_tensor_by_name(response, "error")
            if error is not None:
                error = json.loads(error.as_numpy().reshape(-1)[0])
                code = getattr(pb_utils.TritonError, error["code"], pb_utils.TritonError.INTERNAL)
                relay.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(error["message"], code)), FINAL)
                return
            tensors = response.output_tensors()
            if not tensors:
                continue
            if answer_format == "json":
                answer.append(_output_text(response, "text_output"))
                if _output_text(response, "finish_reason") == "stop":
                    problem = structured_answer.check("".join(answer), num_sources)
                    if problem is not None:  # the schema should have made this impossible
                        relay.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                            f"rag_generate: the answer does not follow answer_format 'json': {problem}")), FINAL)
                        return
            if first:
                tensors = [*tensors, pb_utils.Tensor("sources", sources)]
                first = False
            if not relay.send(pb_utils.InferenceResponse(tensors), 0 if stream else FINAL) or not stream:
                return
        if first:  # the llm sent no output at all: still deliver the sources
            relay.send(pb_utils.InferenceResponse([pb_utils.Tensor("sources", sources)]), FINAL)
        else:
            relay.send(None, FINAL)

    def _abort_llm(self, key: str) -> None:
        """The llm frees the request with this key before its next step."""
        try:
            for _ in pb_utils.InferenceRequest(model_name=self.llm, inputs=[], requested_output_names=[],
                                               parameters={ABORT_KEY: key}).exec(decoupled=True):
                pass
        except Exception as error:  # noqa: BLE001 - the llm is gone: nothing left to abort
            pb_utils.Logger.log_warn(f"rag_generate: could not abort the llm's request: {error}")

    def finalize(self):
        self.pool.shutdown(wait=True)


def _text(request, name: str) -> str | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    value = tensor.as_numpy().reshape(-1)[0]
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _flag(request, name: str) -> bool:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return tensor is not None and bool(tensor.as_numpy().reshape(-1)[0])


def _output_text(response, name: str) -> str:
    tensor = pb_utils.get_output_tensor_by_name(response, name)
    if tensor is None or not tensor.as_numpy().size:
        return ""
    value = tensor.as_numpy().reshape(-1)[0]
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _invalid(message: str):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG))


class _Relay:
    """One request's responses to the client: the relay thread's, or the watcher's error once it gives
    up. After a FINAL nothing more is sent, whoever tries."""

    def __init__(self, sender, key: str):
        self.sender = sender
        self.key = key  # names the llm request (CANCEL_KEY)
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

    def client_cancelled(self) -> bool:
        """Asked only while the request is open: a sender whose FINAL went out belongs to Triton no
        more (asking then reads freed memory in the server)."""
        with self._lock:
            return not self._closed and self.sender.is_cancelled()

    def abandon(self, message: str) -> None:
        self.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message, pb_utils.TritonError.UNAVAILABLE)),
                  FINAL)
