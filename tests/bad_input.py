"""Shared by the property-based bad-input tests: bounded, reproducible hypothesis settings, a case
(a request that is wrong in one way, and the words its error must contain), sending it over gRPC or
HTTP (generate too), the refusal check, and the count of cases tried (conftest.py prints it)."""
from __future__ import annotations

import collections
import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from hypothesis import HealthCheck, Phase, settings
from tritonclient.utils import InferenceServerException

TRIED: collections.Counter = collections.Counter()   # "model protocol" -> cases sent
REQUEST_TIMEOUT_S = 60  # a request the server never answers fails its case instead of hanging the run
UNANSWERED: collections.Counter = collections.Counter()  # model -> gRPC requests sent again after a timeout

NUMPY = {"BYTES": np.object_, "BOOL": np.bool_, "INT8": np.int8, "UINT8": np.uint8, "INT32": np.int32,
         "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64}
CONFIG_TYPES = {"TYPE_STRING": "BYTES", "TYPE_BOOL": "BOOL", "TYPE_INT32": "INT32", "TYPE_INT64": "INT64",
                "TYPE_FP32": "FP32"}
# Signs of a crash rather than a refusal: a traceback relayed by the Python backend.
CRASH_MARKS = ("Traceback", "\nAt:\n", "Failed to process the request")


def bounded(max_examples: int) -> settings:
    """derandomize: every run tries the same cases (CI is reproducible); no example database. No
    shrinking: hypothesis catches pytest-timeout's failure too, and shrinking a case that hung the
    server would send it again and again past every timeout (a CI run wedged so for an hour); the
    first failing case is reported as it is."""
    return settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
                    phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


Tensors = dict  # input name -> (numpy array, Triton dtype)


@dataclass(frozen=True, eq=False)  # eq on numpy arrays is ambiguous
class Case:
    tensors: Tensors
    fields: tuple[str, ...]             # the error message must contain one of these
    body: dict | None = field(default=None)  # the same request for HTTP generate, where JSON can say it


def tensor(value, dtype: str) -> tuple[np.ndarray, str]:
    """A [1] tensor of `value`, or an array kept as it is."""
    array = value if isinstance(value, np.ndarray) else np.array([value], dtype=NUMPY[dtype])
    return array, dtype


def retyped(array: np.ndarray, dtype: str) -> tuple[np.ndarray, str]:
    """An array of `array`'s shape in another Triton dtype."""
    if dtype == "BYTES":
        return np.full(array.shape, b"1", dtype=np.object_), dtype
    return np.ones(array.shape, dtype=NUMPY[dtype]), dtype


def infer_inputs(module, tensors: Tensors) -> list:
    inputs = []
    for name, (array, dtype) in tensors.items():
        item = module.InferInput(name, list(array.shape), dtype)
        item.set_data_from_numpy(array)
        inputs.append(item)
    return inputs


def send(client, model: str, tensors: Tensors) -> InferenceServerException | None:
    """A non-decoupled model's answer: None when it served the request, else its error. A gRPC request
    left unanswered for REQUEST_TIMEOUT_S is sent once more and counted in UNANSWERED (the terminal
    summary prints it): in one CI run an embedder request of these sequential cases was never
    answered and wedged the run (cause not found; docs/benchmarks-journal.md, 2026-12-05 11:41)."""
    module = grpcclient if isinstance(client, grpcclient.InferenceServerClient) else httpclient
    for attempt in range(2):
        try:
            if module is grpcclient:
                client.infer(model, infer_inputs(module, tensors), client_timeout=REQUEST_TIMEOUT_S)
            else:  # the HTTP client's own network_timeout (60 s) bounds it
                client.infer(model, infer_inputs(module, tensors))
        except InferenceServerException as exc:
            if attempt == 0 and exc.status() == "StatusCode.DEADLINE_EXCEEDED":
                UNANSWERED[model] += 1
                continue
            return exc
        return None


def check_refused(message: str | None, case: Case, invalid_arg: bool = True) -> None:
    """Refused (`message` is the error, None if served), as a client error, naming the field."""
    assert message is not None, f"served a bad request; the error should have named {case.fields}"
    assert not any(mark in message for mark in CRASH_MARKS), message
    assert invalid_arg, message
    assert any(f in message for f in case.fields), f"none of {case.fields} in: {message}"


def is_invalid_arg(error: InferenceServerException) -> bool:
    return error.status() in ("StatusCode.INVALID_ARGUMENT", "400")


def generate(url: str, model: str, body: dict) -> tuple[int, str]:
    request = urllib.request.Request(f"http://{url}/v2/models/{model}/generate", data=json.dumps(body).encode())
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
