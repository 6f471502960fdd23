"""The frontend's streamed requests and responses (triton_wire.py) against tritonclient's own: the same
request message, and every output read back as InferResult.as_numpy reads it."""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.grpc._utils import _get_inference_request
from tritonclient.utils import serialize_byte_tensor

from ragstack.openai_frontend import triton_wire
from ragstack.openai_frontend.triton import tensors_of

INPUTS = {"text_input": np.array(["héllo".encode(), b"", b"\x00\xff"], dtype=np.object_).reshape(1, 3),
          "stream": np.array([True]), "max_tokens": np.array([7], dtype=np.int32)}
PARAMETERS = {"ragstack_cancel_key": "k1", "ragstack_errors_in_band": True, "n": 3, "temperature": 0.5}


def test_the_request_is_tritonclients():
    theirs = _get_inference_request(model_name="llm", inputs=tensors_of(INPUTS), model_version="", request_id="",
                                    outputs=None, sequence_id=0, sequence_start=False, sequence_end=False,
                                    priority=0, timeout=None, parameters=PARAMETERS)
    assert triton_wire.request("llm", INPUTS, PARAMETERS) == theirs


def test_an_unsupported_parameter_is_refused_by_name():
    with pytest.raises(TypeError, match="'bad': list"):
        triton_wire.request("llm", {}, {"bad": [1]})


def test_outputs_read_as_tritonclient_reads_them():
    response = service_pb2.ModelInferResponse(model_name="llm")
    outputs = {"text_output": np.array([b"one", "twó".encode(), b""], dtype=np.object_),
               "finish_reason": np.array([b"length"], dtype=np.object_),
               "num_output_tokens": np.array([3, 1], dtype=np.uint32),
               "logprob": np.array([[-0.5], [-1.25]], dtype=np.float32), "done": np.array([True])}
    for name, array in outputs.items():
        datatype = "BYTES" if array.dtype == np.object_ else grpcclient.np_to_triton_dtype(array.dtype)
        response.outputs.add(name=name, datatype=datatype, shape=array.shape)
        raw = serialize_byte_tensor(array).item() if datatype == "BYTES" else array.tobytes()
        response.raw_output_contents.append(raw)
    ours = triton_wire.outputs(response)
    theirs = grpcclient.InferResult(response)
    assert list(ours) == list(outputs)
    for name in outputs:
        expected = theirs.as_numpy(name)
        assert ours[name].dtype == expected.dtype and ours[name].shape == expected.shape
        assert ours[name].tolist() == expected.tolist() == outputs[name].tolist()


@pytest.mark.parametrize("change, message", [
    (lambda r: r.raw_output_contents.pop(), "2 outputs but 1 raw contents"),
    (lambda r: setattr(r.outputs[1], "datatype", "BF16"), "datatype BF16 is not read here"),
    (lambda r: r.raw_output_contents.__setitem__(0, b"\x09\x00\x00\x00abc"), "runs past the 7 bytes"),
    (lambda r: r.raw_output_contents.__setitem__(1, b"\x01\x00"), "'count' \\(INT32 \\[1\\]\\)"),
])
def test_a_response_that_does_not_match_its_outputs_is_refused_by_name(change, message):
    response = service_pb2.ModelInferResponse(model_name="llm")
    response.outputs.add(name="text_output", datatype="BYTES", shape=[1])
    response.raw_output_contents.append(serialize_byte_tensor(np.array([b"ok"], dtype=np.object_)).item())
    response.outputs.add(name="count", datatype="INT32", shape=[1])
    response.raw_output_contents.append(np.array([5], dtype=np.int32).tobytes())
    assert triton_wire.outputs(response)["count"].tolist() == [5]
    change(response)
    with pytest.raises(triton_wire.WireError, match=message):
        triton_wire.outputs(response)
