"""Bad input to `embed` / `rerank` / `embedder`: INVALID_ARG naming the field and the limit; serving goes on."""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from text_models import embed, rerank, text_input

pytestmark = pytest.mark.server


@pytest.fixture()
def client(triton_server):
    c = grpcclient.InferenceServerClient(triton_server.grpc_url)
    yield c
    embedding, _ = embed(c, ["still serving"])  # after every bad request
    assert embedding.shape == (1, 384)
    c.close()


def invalid(call, *args) -> str:
    with pytest.raises(InferenceServerException) as raised:
        call(*args)
    assert raised.value.status() == "StatusCode.INVALID_ARGUMENT", raised.value
    return raised.value.message()


@pytest.mark.parametrize("texts, message", [
    (["fine", ""], "text[1] is empty"),
    (["   \n"], "text[0] is empty"),
    (["x"] * 33, "text: 33 texts in the request; send 1 to 32"),
    ([], "text: 0 texts in the request; send 1 to 32"),
])
def test_embed_rejects_bad_texts(client, texts, message):
    assert message in invalid(embed, client, texts)


def test_embed_rejects_invalid_utf8(client):
    tensor = grpcclient.InferInput("text", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([b"\xff\xfe"], dtype=object))
    assert "text[0] is not valid UTF-8" in invalid(client.infer, "embed", [tensor])


def test_embed_rejects_wrong_dtype_and_shape(client):
    ints = grpcclient.InferInput("text", [2], "INT32")
    ints.set_data_from_numpy(np.array([1, 2], dtype=np.int32))
    assert "'text'" in (message := invalid(client.infer, "embed", [ints])) and "BYTES" in message
    matrix = grpcclient.InferInput("text", [1, 2], "BYTES")
    matrix.set_data_from_numpy(np.array([[b"a", b"b"]], dtype=object))
    assert "'text'" in (message := invalid(client.infer, "embed", [matrix])) and "[-1]" in message


def test_rerank_rejects_bad_query_and_passages(client):
    assert "query[0] is empty" in invalid(rerank, client, "", ["a passage"])
    assert "passages[1] is empty" in invalid(rerank, client, "a query", ["a passage", ""])
    assert "passages: 65 texts in the request; send 1 to 64" in invalid(rerank, client, "q", ["p"] * 65)
    two_queries = [text_input(client, "query", ["q1", "q2"]), text_input(client, "passages", ["p"])]
    assert "'query'" in (message := invalid(client.infer, "rerank", two_queries)) and "[1]" in message


def test_embedder_rejects_a_batch_over_its_maximum(client):
    ids = np.ones((33, 4), dtype=np.int64)
    tensors = []
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        tensor = grpcclient.InferInput(name, list(ids.shape), "INT64")
        tensor.set_data_from_numpy(ids)
        tensors.append(tensor)
    message = invalid(client.infer, "embedder", tensors)
    assert "batch-size must be <= 32" in message and "embedder" in message
