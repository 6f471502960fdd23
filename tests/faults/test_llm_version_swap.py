"""An llm version rolled forward under traffic, then back, on a server of its own (a temporary
repository: `llm_versions` runs the demo checkpoint, `version_policy: latest 1`). Version 2 appears
and is loaded while clients keep streaming: every request ends with its FINAL (version 1 finishes
what it has before it unloads), nothing hangs or fails, and version 2 serves the next requests; a
load pinned to version 1 rolls back the same way.
(test_llm_server.py unloads and reloads the session's llm under traffic; test_embedder_versions.py
swaps the versions of a model that is not decoupled.)"""
from __future__ import annotations

import asyncio
import json

import pytest
import tritonclient.grpc as grpcclient

from model_states import wait_until_settled
from ragstack import load_gen
from ragstack.client import RagClient
from ragstack.launcher import ROOT, TritonServer
from server_helpers import free_server_options, settled
from server_metrics import metric_value

pytestmark = pytest.mark.server
MODEL = "llm_versions"
CONFIG = f"""name: "{MODEL}"
backend: "triton_llm"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
version_policy: {{ latest: {{ num_versions: 1 }} }}
instance_group [ {{ kind: KIND_MODEL, count: 1 }} ]
parameters [
  {{ key: "model", value: {{ string_value: "{ROOT / 'model_repository' / 'llm' / '1' / 'tiny-qwen2'}" }} }},
  {{ key: "device", value: {{ string_value: "cpu" }} }}
]
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    path = tmp_path_factory.mktemp("versions-repository")
    (path / MODEL / "1").mkdir(parents=True)
    (path / MODEL / "config.pbtxt").write_text(CONFIG)
    return path


@pytest.fixture(scope="module")
def server(repo, tmp_path_factory):
    options = free_server_options(model_repositories=[repo], models=[MODEL])
    with TritonServer(options, work_dir=tmp_path_factory.mktemp("triton-versions")) as s:
        yield s


def swap_under_traffic(server, load) -> list[load_gen.Outcome]:
    """Two clients send short requests back to back while `load()` swaps versions in a thread, and
    one second beyond; returns every request's outcome. (Long streams across the swap do not work
    here: on 2 cores the new version's warm-up hardly moves while the old one generates.)"""
    async def client(stop: asyncio.Event, outcomes: list):
        while not stop.is_set():
            outcomes += (await load_gen.run_many(server.grpc_url, MODEL, [load_gen.llm_tensors("swap", 8)], 60,
                                                 channels=1))[0]

    async def scenario():
        stop, outcomes = asyncio.Event(), []
        clients = [asyncio.ensure_future(client(stop, outcomes)) for _ in range(2)]
        await asyncio.to_thread(load)
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.gather(*clients)
        return outcomes

    outcomes = asyncio.run(scenario())
    with RagClient(server.grpc_url) as c:
        wait_until_settled(c, MODEL, 60)
    return outcomes


def served_by(server, version: str) -> float:
    return settled(lambda: metric_value(server.metrics_url, "nv_inference_request_success", MODEL, version))


def assert_no_downtime(outcomes) -> None:
    assert outcomes and all(o.status == load_gen.OK for o in outcomes), load_gen.summarize(outcomes, 1)


def one_request(server) -> load_gen.Outcome:
    [outcome], _ = asyncio.run(load_gen.run_many(server.grpc_url, MODEL, [load_gen.llm_tensors("next", 8)], 60))
    return outcome


def test_roll_forward_then_back_under_traffic(server, repo):
    client = grpcclient.InferenceServerClient(server.grpc_url)  # used from a thread: HTTP's is not thread-safe
    (repo / MODEL / "2").mkdir()
    outcomes = swap_under_traffic(server, lambda: client.load_model(MODEL))
    assert_no_downtime(outcomes)
    assert served_by(server, "2") > 0  # the traffic went over to version 2 (version 1's metrics left with it)
    assert client.is_model_ready(MODEL, "2") and not client.is_model_ready(MODEL, "1")
    before = served_by(server, "2")
    assert one_request(server).status == load_gen.OK
    assert served_by(server, "2") == before + 1

    pinned = {**client.get_model_config(MODEL, as_json=True)["config"], "version_policy": {"specific": {"versions": [1]}}}
    assert_no_downtime(swap_under_traffic(server, lambda: client.load_model(MODEL, config=json.dumps(pinned))))
    assert client.is_model_ready(MODEL, "1") and not client.is_model_ready(MODEL, "2")
    assert one_request(server).status == load_gen.OK
    client.close()
