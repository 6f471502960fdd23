"""The admin key on a real server (the launcher with `admin_key`, as `ragstack serve` sets it from
$RAGSTACK_ADMIN_KEY): repository calls without the key are refused over gRPC and HTTP, with it
they work, from tritonclient and from RagClient; inference, health and metadata stay open."""
from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from ragstack import admin_key, serve
from ragstack.client import RagClient
from ragstack.launcher import LauncherError, TritonServer
from server_helpers import FIXTURE_REPOSITORY, free_server_options

KEY = "0123456789abcdef0123456789abcdef"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    options = free_server_options(model_repositories=[FIXTURE_REPOSITORY], models=["echo"], admin_key=KEY)
    with TritonServer(options, work_dir=tmp_path_factory.mktemp("admin")) as running:
        yield running


def clients(server):
    return {"grpc": grpcclient.InferenceServerClient(server.grpc_url),
            "http": httpclient.InferenceServerClient(server.http_url)}


def echo(client, module) -> np.ndarray:
    data = np.ones((1, 2), dtype=np.float32)
    tensor = module.InferInput("INPUT", [1, 2], "FP32")
    tensor.set_data_from_numpy(data)
    return client.infer("echo", [tensor]).as_numpy("OUTPUT")


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_repository_calls_need_the_key(server, protocol):
    client = clients(server)[protocol]
    calls = [lambda **h: client.get_model_repository_index(**h), lambda **h: client.unload_model("echo", **h),
             lambda **h: client.load_model("echo", **h)]
    for call in calls:
        for headers in ({}, admin_key.headers(protocol, "not-the-key-0123456789")):
            with pytest.raises(InferenceServerException, match="restricted") as refused:
                call(headers=headers)
            assert refused.value.status() in ("StatusCode.UNAVAILABLE", "403")
    assert client.is_model_ready("echo")                  # nothing was unloaded
    with_key = admin_key.headers(protocol, KEY)
    client.unload_model("echo", headers=with_key)
    assert not client.is_model_ready("echo")
    client.load_model("echo", headers=with_key)
    assert client.is_model_ready("echo")
    client.close()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_inference_health_and_metadata_stay_open(server, protocol):
    client = clients(server)[protocol]
    module = grpcclient if protocol == "grpc" else httpclient
    np.testing.assert_array_equal(echo(client, module), np.ones((1, 2)))
    assert client.is_server_ready() and client.is_model_ready("echo")
    assert client.get_model_metadata("echo")
    client.close()


def test_the_other_admin_apis_need_the_key(server):
    def post(path, body, headers):
        request = urllib.request.Request(f"http://{server.http_url}{path}", data=json.dumps(body).encode(),
                                         headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code

    for path, body in (("/v2/logging", {"log_verbose_level": 1}), ("/v2/trace/setting", {"trace_rate": "1"}),
                       ("/v2/systemsharedmemory/region/r/register", {"key": "/x", "offset": 0, "byte_size": 8})):
        assert post(path, body, {}) == 403, path
    assert post("/v2/logging", {"log_verbose_level": 0}, admin_key.headers("http", KEY)) == 200


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_ragclient_sends_the_key_from_the_environment(server, protocol, monkeypatch):
    url = server.grpc_url if protocol == "grpc" else server.http_url
    monkeypatch.delenv(admin_key.ENV, raising=False)
    with RagClient(url, protocol) as anonymous, pytest.raises(Exception, match="restricted"):
        anonymous.models()
    monkeypatch.setenv(admin_key.ENV, KEY)
    with RagClient(url, protocol) as admin:
        assert "echo" in {m.name for m in admin.models()}
        admin.load("echo")


def test_serve_takes_the_key_from_the_environment(monkeypatch):
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    monkeypatch.delenv(admin_key.ENV, raising=False)
    assert serve.options_from_args(parser.parse_args([])).admin_key is None
    monkeypatch.setenv(admin_key.ENV, KEY)
    options = serve.options_from_args(parser.parse_args([]))
    assert options.admin_key == KEY


@pytest.mark.parametrize("key", ["short", "has:colon-0123456789", "has,comma-0123456789", "has space 0123456789"])
def test_a_key_triton_cannot_parse_or_that_is_weak_is_refused(tmp_path, key):
    server = TritonServer(free_server_options(model_repositories=[FIXTURE_REPOSITORY], admin_key=key),
                          work_dir=tmp_path)
    with pytest.raises(LauncherError, match=admin_key.ENV):
        server.start()
