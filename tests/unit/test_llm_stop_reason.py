"""The llm's `stop_reason` output (backends/triton_llm/stop_reason.py), without a server: declared with its
`return_stop_reason` input in the backend and in both configs, JSON of vLLM's stop_reason (a stop string, a
stop token id or null; null before the last response), and read back by the OpenAI frontend as the value
itself. The outputs on the wire are checked against the real server in tests/server/test_openai_stop_reason.py."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "backends" / "triton_llm"))
from llm_request import INPUTS, OUTPUTS, RETURNS  # noqa: E402
from stop_reason import stop_reason_json  # noqa: E402

from ragstack.openai_frontend.generation import Piece, _piece  # noqa: E402


def test_the_input_and_output_are_declared_by_the_backend_and_both_configs():
    assert "return_stop_reason" in RETURNS
    assert {"name": "return_stop_reason", "data_type": "TYPE_BOOL", "dims": [1], "optional": True} in INPUTS
    assert {"name": "stop_reason", "data_type": "TYPE_STRING", "dims": [-1]} in OUTPUTS
    for config in ("config.pbtxt", "configs/gpu.pbtxt"):
        text = (ROOT / "model_repository" / "llm" / config).read_text()
        inputs = re.search(r"^input \[(.*?)^\]", text, re.S | re.M)[1]
        outputs = re.search(r"^output \[(.*?)^\]", text, re.S | re.M)[1]
        assert '{ name: "return_stop_reason", data_type: TYPE_BOOL, dims: [ 1 ], optional: true }' in inputs
        assert '{ name: "stop_reason", data_type: TYPE_STRING, dims: [ -1 ] }' in outputs


def response(stop_reason: bytes, finish_reason: bytes) -> dict:
    """A response's outputs as the frontend's gRPC client hands them over: BYTES tensors as object arrays."""
    return {"text_output": np.array([b"text"], dtype=np.object_),
            "finish_reason": np.array([finish_reason], dtype=np.object_),
            "stop_reason": np.array([stop_reason], dtype=np.object_)}


@pytest.mark.parametrize("value", ["\n\n", "STOP", "世界 \"quoted\"", 151645, 0, None])
def test_the_last_response_carries_the_value_and_the_frontend_reads_it_back(value):
    encoded = stop_reason_json(value, final=True)
    assert encoded.isascii()
    piece = _piece(response(encoded, b"stop"), None)
    assert piece.stop_reason == value and type(piece.stop_reason) is type(value)


def test_responses_before_the_last_carry_null():
    assert stop_reason_json("STOP", final=False) == stop_reason_json(7, final=False) == b"null"
    assert _piece(response(b"null", b"None"), None).stop_reason is None


def test_a_model_that_sends_no_stop_reason_gives_none():
    assert _piece({"text_output": np.array([b"x"], dtype=np.object_)}, None).stop_reason is None


def test_a_choices_pieces_keep_the_stop_reason_of_its_last():
    whole = Piece()
    for piece in (Piece(text="a"), Piece(text="b", finish_reason="stop", stop_reason="\n")):
        whole.add(piece)
    assert (whole.text, whole.finish_reason, whole.stop_reason) == ("ab", "stop", "\n")
