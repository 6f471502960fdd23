"""Triton's streamed inference messages (service_pb2) written and read directly, for the frontend's hot path.

tritonclient's aio stream_infer wraps every request in InferInput objects and an async request iterator (a
task per call), and every response in an InferResult read back one output at a time: about a sixth of the
frontend's CPU per streamed chunk and per request (benchmarks/bench_openai_frontend.py). These two
functions make the same messages: BYTES as 4-byte little-endian lengths before each element, fixed-size
types as their raw little-endian bytes, request parameters typed as tritonclient types them.
"""
from __future__ import annotations

import struct

import numpy as np
from tritonclient.grpc import service_pb2
from tritonclient.utils import triton_to_np_dtype

# The input dtypes the frontend sends.
DATATYPES = {np.dtype(np.object_): "BYTES", np.dtype(np.bool_): "BOOL", np.dtype(np.int32): "INT32"}
_LENGTH = struct.Struct("<I")


def request(model: str, inputs: dict[str, np.ndarray], parameters: dict | None = None) -> service_pb2.ModelInferRequest:
    message = service_pb2.ModelInferRequest(model_name=model)
    for name, array in inputs.items():
        datatype = DATATYPES[array.dtype]
        message.inputs.add(name=name, datatype=datatype, shape=array.shape)
        message.raw_input_contents.append(_bytes_of(array) if datatype == "BYTES" else array.tobytes())
    for key, value in (parameters or {}).items():
        slot = message.parameters[key]
        if isinstance(value, str):
            slot.string_param = value
        elif isinstance(value, bool):
            slot.bool_param = value
        elif isinstance(value, int):
            slot.int64_param = value
        elif isinstance(value, float):
            slot.double_param = value
        else:
            raise TypeError(f"request parameter {key!r}: {type(value).__name__} is not str, bool, int or float")
    return message


def outputs(response: service_pb2.ModelInferResponse) -> dict[str, np.ndarray]:
    """Each output as tritonclient's InferResult.as_numpy gives it: BYTES as an object array of bytes."""
    found = {}
    for tensor, raw in zip(response.outputs, response.raw_output_contents):
        shape = tuple(tensor.shape)
        if tensor.datatype == "BYTES":
            found[tensor.name] = _elements(raw).reshape(shape)
        else:
            found[tensor.name] = np.frombuffer(raw, dtype=triton_to_np_dtype(tensor.datatype)).reshape(shape)
    return found


def _bytes_of(array: np.ndarray) -> bytes:
    parts = []
    for value in array.reshape(-1):
        data = value if isinstance(value, bytes) else str(value).encode("utf-8")
        parts += (_LENGTH.pack(len(data)), data)
    return b"".join(parts)


def _elements(raw: bytes) -> np.ndarray:
    values, at = [], 0
    while at < len(raw):
        (length,) = _LENGTH.unpack_from(raw, at)
        values.append(raw[at + 4:at + 4 + length])
        at += 4 + length
    array = np.empty(len(values), dtype=np.object_)
    array[:] = values
    return array
