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

# The input dtypes the frontend sends.
DATATYPES = {np.dtype(np.object_): "BYTES", np.dtype(np.bool_): "BOOL", np.dtype(np.int32): "INT32"}
_LENGTH = struct.Struct("<I")
# The fixed-size output types, as numpy reads their little-endian bytes (BF16 has no numpy type: refused).
_NUMPY = {"BOOL": np.bool_, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
          "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
          "FP16": np.float16, "FP32": np.float32, "FP64": np.float64}


class WireError(ValueError):
    """A response that does not decode: Triton's message is not what its outputs say."""


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
    """Each output as tritonclient's InferResult.as_numpy gives it: BYTES as an object array of bytes.
    WireError for contents that do not match the outputs (count, datatype, size)."""
    if len(response.outputs) != len(response.raw_output_contents):
        raise WireError(f"{len(response.outputs)} outputs but {len(response.raw_output_contents)} raw contents")
    found = {}
    for tensor, raw in zip(response.outputs, response.raw_output_contents):
        shape = tuple(tensor.shape)
        try:
            if tensor.datatype == "BYTES":
                found[tensor.name] = _elements(raw).reshape(shape)
            elif tensor.datatype in _NUMPY:
                found[tensor.name] = np.frombuffer(raw, dtype=_NUMPY[tensor.datatype]).reshape(shape)
            else:
                raise WireError(f"datatype {tensor.datatype} is not read here")
        except (ValueError, struct.error) as error:  # WireError included
            raise WireError(f"output {tensor.name!r} ({tensor.datatype} {list(shape)}): {error}") from None
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
        if at + 4 + length > len(raw):
            raise WireError(f"an element of {length} bytes at {at} runs past the {len(raw)} bytes")
        values.append(raw[at + 4:at + 4 + length])
        at += 4 + length
    array = np.empty(len(values), dtype=np.object_)
    array[:] = values
    return array
