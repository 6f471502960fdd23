"""Embedder version 2 (int8) loads beside version 1 (fp32); version 1 unloads while version 2 serves."""
from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from model_states import wait_until_settled
from ragstack.client import RagClient
from text_models import text_input

pytestmark = pytest.mark.server
TEXTS = ["how do I reset a forgotten password", "Canberra is the capital of Australia."]


def with_versions(config: dict, versions: list[int]) -> str:
    return json.dumps({**config, "version_policy": {"specific": {"versions": versions}}})


def token_inputs(client) -> list[httpclient.InferInput]:
    result = client.infer("embed_tokenizer", [text_input(client, "text", TEXTS)])
    tensors = []
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        array = result.as_numpy(name)
        tensor = httpclient.InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


def embed_with(client, version: str, inputs) -> np.ndarray:
    return client.infer("embedder", inputs, model_version=version).as_numpy("embedding")


def test_two_versions_side_by_side_then_one_unloads(triton_server):
    client = httpclient.InferenceServerClient(triton_server.http_url, concurrency=2)
    original = client.get_model_config("embedder")
    inputs = token_inputs(client)
    with pytest.raises(InferenceServerException, match="version"):  # as the repository serves it: version 1 only
        embed_with(client, "2", inputs)
    try:
        client.load_model("embedder", config=with_versions(original, [1, 2]))
        assert client.is_model_ready("embedder", "1") and client.is_model_ready("embedder", "2")
        fp32, int8 = embed_with(client, "1", inputs), embed_with(client, "2", inputs)
        cosine = (fp32 * int8).sum(1)
        assert 0.95 <= cosine.min() and not np.array_equal(fp32, int8)  # same model, other precision

        failures, served, done = [], [], threading.Event()

        def keep_asking_version_2():
            worker = httpclient.InferenceServerClient(triton_server.http_url)
            while not done.is_set():
                try:
                    np.testing.assert_array_equal(embed_with(worker, "2", inputs), int8)
                    served.append(1)
                except Exception as error:  # noqa: BLE001 - any failure of version 2 fails the test
                    failures.append(error)
            worker.close()

        def served_more(count):
            target = len(served) + count
            for _ in range(500):
                if len(served) >= target or failures:
                    return
                threading.Event().wait(0.01)

        thread = threading.Thread(target=keep_asking_version_2)
        thread.start()
        try:
            served_more(3)
            client.load_model("embedder", config=with_versions(original, [2]))
            served_more(3)
        finally:
            done.set()
            thread.join()
        assert not failures and served
        assert not client.is_model_ready("embedder", "1") and client.is_model_ready("embedder", "2")
        with pytest.raises(InferenceServerException, match="version"):
            embed_with(client, "1", inputs)
    finally:
        client.load_model("embedder", config=json.dumps(original))
    assert client.is_model_ready("embedder", "1") and not client.is_model_ready("embedder", "2")
    np.testing.assert_array_equal(embed_with(client, "1", token_inputs(client)), fp32)
    client.close()
    with RagClient(triton_server.grpc_url) as rag_client:  # version 2 is still UNLOADING: not ready yet
        wait_until_settled(rag_client, "embedder")
