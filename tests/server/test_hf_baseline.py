"""The HF generate() baseline of benchmarks/bench_serving.py on its own real server: requests sent together
run as one batch, each answered with its own number of tokens; sampling it cannot do is refused."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from benchmarks import bench_serving
from ragstack.launcher import TritonServer
from server_helpers import TINY_LLM, free_server_options, settled



@pytest.fixture(scope="module")
def baseline_server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("hf_repository")
    bench_serving.write_hf_baseline(repository, str(TINY_LLM), max_batch_size=4)
    options = free_server_options(model_repositories=[repository], models=["hf_generate"])
    with TritonServer(options, work_dir=tmp_path_factory.mktemp("hf_triton")) as server:
        yield server


def test_a_batch_answers_each_request_with_its_tokens(baseline_server):
    requests = [("the quick brown fox", n) for n in (3, 9, 5, 7)]
    results, _ = asyncio.run(bench_serving.run_triton(baseline_server.grpc_url, requests, concurrency=4,
                                                      model="hf_generate", batched=True))
    assert [r.tokens for r in results] == [3, 9, 5, 7]
    assert all(r.gaps == [] for r in results)  # one response per request
    client = grpcclient.InferenceServerClient(baseline_server.grpc_url)
    inferences, executions = settled(lambda: counts(client.get_inference_statistics("hf_generate")))
    assert inferences == 4 and executions < 4  # batched by the dynamic batcher


def counts(statistics) -> tuple[int, int]:
    model = statistics.model_stats[0]
    return model.inference_count, model.execution_count


def test_sampling_is_refused_with_the_field(baseline_server):
    inputs = []
    for name, value in (("text_input", b"hello"), ("sampling_parameters", json.dumps({"temperature": 0.7}).encode())):
        tensor = grpcclient.InferInput(name, [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[value]], dtype=np.object_))
        inputs.append(tensor)
    with pytest.raises(InferenceServerException, match="temperature must be 0"):
        grpcclient.InferenceServerClient(baseline_server.grpc_url).infer("hf_generate", inputs)
