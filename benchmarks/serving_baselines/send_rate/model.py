"""The llm's response path with no engine behind it: how fast one stub can send decoupled responses.

Each request asks for `responses` responses. One sender thread per instance (as backends/triton_llm
sends every response from its loop thread) runs rounds, as the engine runs steps: each round sends
one response to every open stream, each like the llm's streamed token (`text_output` of a few bytes
and `num_output_tokens`), the last one flagged FINAL. `step_ms` 0 runs the rounds back to back (the
most this stub can send); above 0 a round starts every `step_ms` (an engine step), unless the last
round took longer. `cancel_check_ms` > 0 asks `is_cancelled()` of a stream at most that often, as the
llm does (every 20 ms). A stream's FINAL response carries `send_stats` (JSON): its sends' count, the
wall and thread CPU seconds spent in `send()` and in `is_cancelled()` for it, and the instance name.
"""
from __future__ import annotations

import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
TOKEN = np.array([b" tok"], dtype=np.object_)
ONE = np.array([1], dtype=np.uint32)


class _Stream:
    __slots__ = ("sender", "left", "step_s", "check_s", "next_check", "sends", "send_s", "send_cpu_s",
                 "checks", "check_wall_s")

    def __init__(self, sender, left: int, step_s: float, check_s: float):
        self.sender, self.left, self.step_s, self.check_s = sender, left, step_s, check_s
        self.next_check = 0.0
        self.sends = self.checks = 0
        self.send_s = self.send_cpu_s = self.check_wall_s = 0.0


class TritonPythonModel:
    def initialize(self, args):
        self.instance = args["model_instance_name"]
        self._inbox: list[_Stream] = []
        self._wakeup = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._send_rounds, name="send-rounds", daemon=True)
        self._thread.start()

    def execute(self, requests):
        streams = []
        for request in requests:
            streams.append(_Stream(request.get_response_sender(), max(1, int(_value(request, "responses", 1))),
                                   float(_value(request, "step_ms", 0.0)) / 1e3,
                                   float(_value(request, "cancel_check_ms", 0.0)) / 1e3))
        with self._wakeup:
            self._inbox += streams
            self._wakeup.notify()

    def _send_rounds(self) -> None:
        open_streams: list[_Stream] = []
        while True:
            with self._wakeup:
                while not (self._inbox or open_streams or self._stop):
                    self._wakeup.wait()
                if self._stop:
                    return
                open_streams += self._inbox
                self._inbox = []
            start = time.perf_counter()
            step_s = min(s.step_s for s in open_streams)
            for stream in open_streams:
                self._send_one(stream)
            open_streams = [s for s in open_streams if s.left > 0]
            if step_s > 0:
                time.sleep(max(0.0, start + step_s - time.perf_counter()))

    def _send_one(self, stream: _Stream) -> None:
        now = time.perf_counter()
        if stream.check_s > 0 and now >= stream.next_check:
            stream.next_check = now + stream.check_s
            stream.sender.is_cancelled()
            stream.checks += 1
            stream.check_wall_s += time.perf_counter() - now
        stream.left -= 1
        tensors = [pb_utils.Tensor("text_output", TOKEN), pb_utils.Tensor("num_output_tokens", ONE)]
        final = stream.left == 0
        if final:
            stats = {"sends": stream.sends + 1, "send_s": stream.send_s, "send_cpu_s": stream.send_cpu_s,
                     "checks": stream.checks, "check_s": stream.check_wall_s, "instance": self.instance}
            tensors.append(pb_utils.Tensor("send_stats", np.array([json.dumps(stats).encode()], dtype=np.object_)))
        response = pb_utils.InferenceResponse(output_tensors=tensors)
        t0, c0 = time.perf_counter(), time.thread_time()
        stream.sender.send(response, flags=FINAL if final else 0)
        stream.send_s += time.perf_counter() - t0
        stream.send_cpu_s += time.thread_time() - c0
        stream.sends += 1

    def finalize(self):
        with self._wakeup:
            self._stop = True
            self._wakeup.notify()
        self._thread.join(timeout=5)


def _value(request, name: str, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy().reshape(-1)[0].item()
