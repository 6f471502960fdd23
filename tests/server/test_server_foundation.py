"""The real server answers health, repository, load/unload and metrics requests (gRPC and HTTP)."""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from server_helpers import settled
from server_metrics import metric_value, wait_for_metric


@pytest.fixture(params=["grpc", "http"])
def client(request, triton_server):
    if request.param == "grpc":
        c = grpcclient.InferenceServerClient(triton_server.grpc_url)
    else:
        c = httpclient.InferenceServerClient(triton_server.http_url)
    yield c
    c.close()


def _echo(client, values):
    module = grpcclient if isinstance(client, grpcclient.InferenceServerClient) else httpclient
    data = np.asarray([values], dtype=np.float32)
    inp = module.InferInput("INPUT", list(data.shape), "FP32")
    inp.set_data_from_numpy(data)
    return client.infer("echo", [inp]).as_numpy("OUTPUT")


def test_live_and_ready(client):
    assert client.is_server_live()
    assert client.is_server_ready()


def test_repository_index_lists_models(client):
    index = client.get_model_repository_index()
    if isinstance(index, dict):  # the HTTP client returns a list, gRPC a message
        index = index["models"]
    names = {m["name"] if isinstance(m, dict) else m.name for m in
             (index if isinstance(index, list) else index.models)}
    assert "echo" in names


def test_unload_load_reload(client):
    assert client.is_model_ready("echo")
    client.unload_model("echo")
    assert not client.is_model_ready("echo")
    with pytest.raises(Exception, match="echo"):
        _echo(client, [1.0])
    client.load_model("echo")
    assert client.is_model_ready("echo")
    client.load_model("echo")  # a loaded model whose files did not change: a no-op, it stays ready
    assert client.is_model_ready("echo")
    np.testing.assert_array_equal(_echo(client, [1.0, 2.0]), [[1.0, 2.0]])


def test_per_model_metrics_after_request(client, triton_server):
    # The server counts a request after sending its response: a count may trail its reply, the previous
    # test's last request's too.
    def successes() -> float:
        return metric_value(triton_server.metrics_url, "nv_inference_request_success", "echo")

    before = settled(successes)
    _echo(client, [3.0])
    wait_for_metric(triton_server.metrics_url, "nv_inference_request_success", "echo",
                    lambda v: v >= before + 1, timeout_s=10)
    assert settled(successes) == before + 1
