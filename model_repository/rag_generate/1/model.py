"""rag_generate (decoupled): messages + sources -> the llm's answer, streamed, with the sources.

Each request is relayed by a thread: a BLS request to the llm with the same `stream`,
`sampling_parameters`, `max_tokens` and request parameters (where the HTTP generate endpoint puts
its "parameters"); every llm response is forwarded as it comes, the sources ride on the first.
With stream=false the llm answers once and so does this model, in one FINAL response, which the
HTTP /generate endpoint requires. Every request ends with exactly one FINAL response.

Limit: the BLS API of Triton 2.51 cannot cancel a request it has sent, so a client that cancels
stops receiving at once, but the llm finishes that generation (bounded by max_tokens).

The llm's responses are read by a thread of their own and waited for with a timeout (parameter
llm_idle_timeout_s): Triton 2.51's BLS response iterator has none, and when the llm's stub process
dies it never answers again, which would hold this request, and its max_inflight slot, forever.
A relay that ends early (cancelled, stream=false) leaves that thread to drain the llm's remaining
responses; the llm's bounded queue limits that work.
"""
import json
import queue
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
PASSED_TO_LLM = ("messages", "stream", "sampling_parameters", "max_tokens")


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
            if not self.slots.acquire(blocking=False):
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"rag_generate: {self.max_inflight} requests in flight, the limit (parameter max_inflight); "
                    "retry later", pb_utils.TritonError.UNAVAILABLE)), flags=FINAL)
                continue
            self.pool.submit(self._relay, request, sender)
        return None

    def _relay(self, request, sender):
        try:
            self._generate(request, sender)
        except Exception as error:  # noqa: BLE001 - the client must still get its FINAL response
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"rag_generate: {error}")), flags=FINAL)
        finally:
            self.slots.release()

    def _generate(self, request, sender):
        inputs = [t for t in (pb_utils.get_input_tensor_by_name(request, n) for n in PASSED_TO_LLM) if t is not None]
        inputs.append(pb_utils.Tensor("exclude_input_in_output", np.array([True])))
        stream_tensor = pb_utils.get_input_tensor_by_name(request, "stream")
        stream = bool(stream_tensor.as_numpy().reshape(-1)[0]) if stream_tensor is not None else False
        sources = pb_utils.get_input_tensor_by_name(request, "sources").as_numpy()
        llm_request = pb_utils.InferenceRequest(
            model_name=self.llm, inputs=inputs, requested_output_names=["text_output", "finish_reason"],
            parameters=json.loads(request.parameters() or "{}"))

        responses: queue.Queue = queue.Queue()
        threading.Thread(target=_read_responses, args=(llm_request, responses), daemon=True,
                         name="rag_generate-llm").start()
        first = True
        while True:
            try:
                response = responses.get(timeout=self.idle_timeout_s)
            except queue.Empty:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"rag_generate: no response from {self.llm} for {self.idle_timeout_s:.0f} s (parameter "
                    "llm_idle_timeout_s); the request is abandoned", pb_utils.TritonError.UNAVAILABLE)), flags=FINAL)
                return
            if response is None:  # the llm's stream ended
                break
            if isinstance(response, Exception):
                raise response
            if sender.is_cancelled():
                sender.send(flags=FINAL)
                return
            if response.has_error():
                sender.send(pb_utils.InferenceResponse(error=response.error()), flags=FINAL)
                return
            tensors = response.output_tensors()
            if not tensors:
                continue
            if first:
                tensors = [*tensors, pb_utils.Tensor("sources", sources)]
                first = False
            sender.send(pb_utils.InferenceResponse(tensors), flags=0 if stream else FINAL)
            if not stream:
                return
        if first:  # the llm sent no output at all: still deliver the sources
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("sources", sources)]), flags=FINAL)
        else:
            sender.send(flags=FINAL)

    def finalize(self):
        self.pool.shutdown(wait=True)


def _read_responses(llm_request, responses: queue.Queue) -> None:
    """Every response of the llm into `responses`, then None; an exec failure as the exception."""
    try:
        for response in llm_request.exec(decoupled=True):
            responses.put(response)
    except Exception as error:  # noqa: BLE001 - handed to the relay, which answers the client
        responses.put(error)
    responses.put(None)
