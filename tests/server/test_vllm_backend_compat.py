"""vllm_backend's clients against `llm`, unchanged: the request flows of vllm_backend's sample client
(samples/client.py) and of its CI tests (ci/L0_backend_vllm: vllm_backend, enabled_stream,
request_cancellation; ci/L0_additional_outputs_vllm), written here and sent to the real server, with
the same structural assertions. Model texts aside: the demo model is random, so only the texts'
shape is checked (a prompt prefix, pieces that add up).
"""
from __future__ import annotations

import asyncio
import json
import queue
import time
import urllib.request
from functools import partial

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aio_grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from server_helpers import TINY_LLM, http_post, settled
from server_metrics import metric_value, wait_for_metric

pytestmark = pytest.mark.server
MODEL = "llm"
PROMPTS = ["The most dangerous animal is", "The capital of France is", "The future of AI is"]
SAMPLING = {"temperature": "0", "top_p": "1"}  # strings, as vllm_backend's clients send them


def vllm_request(prompt, request_id, stream, sampling, send_parameters_as_tensor=True,
                 exclude_input_in_output=None, **returns):
    """What vllm_backend's CI helper (create_vllm_request) and sample client build."""
    inputs = [grpcclient.InferInput("text_input", [1], "BYTES"), grpcclient.InferInput("stream", [1], "BOOL")]
    inputs[0].set_data_from_numpy(np.array([prompt.encode()], dtype=np.object_))
    inputs[1].set_data_from_numpy(np.array([stream], dtype=bool))
    if send_parameters_as_tensor:
        inputs.append(grpcclient.InferInput("sampling_parameters", [1], "BYTES"))
        inputs[-1].set_data_from_numpy(np.array([json.dumps(sampling).encode()], dtype=np.object_))
    flags = dict(returns)
    if exclude_input_in_output is not None:
        flags["exclude_input_in_output"] = exclude_input_in_output
    for name, value in flags.items():
        if value is not None:
            inputs.append(grpcclient.InferInput(name, [1], "BOOL"))
            inputs[-1].set_data_from_numpy(np.array([value], dtype=bool))
    return {"model_name": MODEL, "inputs": inputs, "outputs": [grpcclient.InferRequestedOutput("text_output")],
            "request_id": str(request_id), "parameters": sampling}


def run_stream(url, requests):
    """One gRPC stream, every request on it; the results (or errors) in arrival order."""
    results = queue.Queue()
    with grpcclient.InferenceServerClient(url) as client:
        client.start_stream(callback=lambda result, error: results.put(error or result))
        for request in requests:
            client.async_stream_infer(MODEL, request["inputs"], request_id=request["request_id"],
                                      outputs=request.get("outputs"), parameters=request["parameters"])
        client.stop_stream()
    return list(results.queue)


# --- the sample client: one aio stream, a request per prompt, sampling values as strings ---------------

@pytest.mark.parametrize("streaming", [False, True], ids=["single-response", "streaming"])
def test_the_sample_clients_request_flow(triton_server, streaming):
    sampling = {"temperature": "0.1", "top_p": "0.95", "max_tokens": "100"}
    results: dict[str, list[bytes]] = {str(i): [] for i in range(len(PROMPTS))}

    async def main():
        async with aio_grpcclient.InferenceServerClient(triton_server.grpc_url) as client:
            async def requests():
                for i, prompt in enumerate(PROMPTS):
                    yield vllm_request(prompt, i, streaming, sampling, exclude_input_in_output=streaming or False)

            errors = []
            async for result, error in client.stream_infer(inputs_iterator=requests(), stream_timeout=120):
                if error:
                    errors.append(error)
                    continue
                for text in result.as_numpy("text_output"):
                    results[result.get_response().id].append(text)
            return errors

    assert asyncio.run(main()) == []  # the sample client prints "PASS: vLLM example"
    for i, prompt in enumerate(PROMPTS):
        text = b"".join(results[str(i)]).decode()
        assert results[str(i)] and (streaming or text.startswith(prompt))
        assert len(results[str(i)]) > 1 if streaming else len(results[str(i)]) == 1


# --- ci/L0_backend_vllm/vllm_backend ---------------------------------------------------------------------

@pytest.mark.parametrize("as_tensor", [True, False], ids=["sampling_parameters", "request-parameters"])
def test_every_prompt_is_answered_on_one_stream(triton_server, as_tensor):
    results = run_stream(triton_server.grpc_url, [vllm_request(p, i, False, SAMPLING, as_tensor)
                                                  for i, p in enumerate(PROMPTS)])
    assert len(results) == len(PROMPTS)
    for result in results:
        assert not isinstance(result, InferenceServerException), result
        assert result.as_numpy("text_output") is not None


def test_null_sampling_values_leave_the_defaults(triton_server):
    sampling = {"temperature": None, "top_p": None, "max_tokens": "4", "stop_token_ids": "[0]"}
    request = {**vllm_request("Hello", "nulls", False, sampling), "parameters": {}}  # JSON has null, Triton's not
    [result] = run_stream(triton_server.grpc_url, [request])
    assert not isinstance(result, InferenceServerException), result


@pytest.mark.parametrize("exclude, prefixed", [(None, True), (False, True), (True, False)])
def test_exclude_input_in_output_when_not_streaming(triton_server, exclude, prefixed):
    prompt = PROMPTS[1]
    [result] = run_stream(triton_server.grpc_url, [vllm_request(prompt, 0, False, SAMPLING,
                                                                exclude_input_in_output=exclude)])
    text = result.as_numpy("text_output")[0].decode()
    assert text.startswith(prompt) == prefixed and len(text) > len(prompt) * prefixed


# --- ci/L0_backend_vllm/enabled_stream --------------------------------------------------------------------

async def stream_texts(url, prompts, exclude_input_in_output=None):
    async with aio_grpcclient.InferenceServerClient(url) as client:
        async def requests():
            for i, prompt in enumerate(prompts):
                yield vllm_request(prompt, i, True, SAMPLING, exclude_input_in_output=exclude_input_in_output)

        out = []
        async for result, error in client.stream_infer(inputs_iterator=requests()):
            out.append(error or result)
        return out


def test_streaming_several_prompts_returns_only_the_generated_pieces(triton_server):
    results = asyncio.run(stream_texts(triton_server.grpc_url, PROMPTS[:2]))
    assert all(not isinstance(r, InferenceServerException) for r in results), results
    pieces = [r.as_numpy("text_output")[0].decode() for r in results]
    assert len(pieces) > 2 and not any(p.startswith(PROMPTS[0]) for p in pieces)


def test_streaming_with_the_prompt_in_the_output_is_refused_in_vllm_backends_words(triton_server):
    [error] = asyncio.run(stream_texts(triton_server.grpc_url, PROMPTS[:1], exclude_input_in_output=False))
    assert isinstance(error, InferenceServerException)
    assert error.message() == "When streaming, `exclude_input_in_output` = False is not allowed."


# --- ci/L0_backend_vllm/request_cancellation ---------------------------------------------------------------

def test_stop_stream_with_cancel_requests_cancels_and_frees_the_engine(triton_server):
    completed = queue.Queue()
    sampling = {"temperature": "0", "top_p": "1", "max_tokens": "1500"}
    with grpcclient.InferenceServerClient(triton_server.grpc_url) as client:
        client.start_stream(callback=partial(lambda q, result, error: q.put(error or result), completed))
        request = vllm_request("Write an original and creative poem of at least 200 words.", "1", False, sampling)
        client.async_stream_infer(MODEL, request["inputs"], request_id="1", outputs=request["outputs"],
                                  parameters=sampling)
        time.sleep(1)
        client.stop_stream(cancel_requests=True)
    time.sleep(1)
    result = completed.get_nowait()
    assert isinstance(result, InferenceServerException) and result.status() == "StatusCode.CANCELLED"
    assert completed.empty()
    wait_for_metric(triton_server.metrics_url, "triton_llm_num_requests_running", MODEL, lambda v: v == 0)


# --- ci/L0_additional_outputs_vllm ---------------------------------------------------------------------------

RETURNS = ("return_finish_reason", "return_cumulative_logprob", "return_logprobs", "return_num_input_tokens",
           "return_num_output_tokens")
# vllm_backend's test runs every combination (1458); these cover each output on, off and absent, alone
# and together, with logprobs absent, 0 and 2, streaming and not.
CASES = [dict.fromkeys(RETURNS, value) for value in (None, True, False)] + [{name: True} for name in RETURNS]


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("logprobs", [None, 0, 2])
@pytest.mark.parametrize("returns", CASES, ids=lambda r: "+".join(k[7:] for k, v in r.items() if v) or
                         ("all-false" if False in r.values() else "none"))
def test_additional_outputs(triton_server, stream, logprobs, returns):
    prompt = "In this example,"
    sampling = {**SAMPLING, **({} if logprobs is None else {"logprobs": logprobs})}
    request = vllm_request(prompt, 0, stream, sampling, **returns)
    responses = []
    with grpcclient.InferenceServerClient(triton_server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: responses.append((result, error)))
        client.async_stream_infer(MODEL, inputs=request["inputs"], parameters=sampling)
        client.stop_stream()
    assert responses and all(error is None for _, error in responses), responses
    results = [result for result, _ in responses]
    texts = [r.as_numpy("text_output")[0].decode() for r in results]
    assert "".join(texts)
    asked = {name for name, value in returns.items() if value}

    for i, result in enumerate(results):
        reason = result.as_numpy("finish_reason")
        if "return_finish_reason" not in asked:
            assert reason is None
        else:
            assert reason[0].decode() == ("length" if i == len(results) - 1 else "None")
        count = result.as_numpy("num_output_tokens")
        assert (count is None) == ("return_num_output_tokens" not in asked)
        if count is not None:
            assert count.dtype == np.uint32 and count[0] > 0
        inputs = result.as_numpy("num_input_tokens")
        assert (inputs is None) == ("return_num_input_tokens" not in asked)
        if inputs is not None:
            assert inputs.dtype == np.uint32 and 0 < inputs[0] <= len(prompt)

    cumulative = [r.as_numpy("cumulative_logprob") for r in results]
    if "return_cumulative_logprob" not in asked:
        assert all(c is None for c in cumulative)
    else:
        values = [float(c[0]) for c in cumulative]
        assert all(a != b for a, b in zip([0.0] + values, values)), values  # it moves with every response

    for result, text in zip(results, texts):
        raw = result.as_numpy("logprobs")
        if "return_logprobs" not in asked:
            assert raw is None
            continue
        entries = json.loads(raw[0].decode())
        if logprobs is None:
            assert entries is None
            continue
        assert isinstance(entries, list) and entries
        count = result.as_numpy("num_output_tokens")
        if count is not None:
            assert len(entries) == count[0]
        pieces = ""
        for entry in entries:
            assert 1 <= len(entry) <= logprobs + 1
            assert len([e for e in entry.values() if e["rank"] == 1]) == 1
            sampled = [e for e in entry.values() if e.pop("sampled", False) is True]   # ours, as bytes
            assert len(sampled) == 1
            for token_id, e in entry.items():
                assert token_id.isdigit() and set(e) == {"logprob", "rank", "decoded_token", "bytes"}   # bytes: ours
                assert isinstance(e["logprob"], float) and isinstance(e["rank"], int)
                assert isinstance(e["decoded_token"], str)
            pieces += sampled[0]["decoded_token"]
        assert (pieces if stream else prompt + pieces) == text


# --- ci/L0_backend_vllm/metrics_test: vllm_backend's metric families ---------------------------------------

def test_vllm_backends_metric_families_count_the_requests(triton_server):
    url = triton_server.metrics_url
    names = ["vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_count",
             "vllm:time_per_output_token_seconds_count", "vllm:e2e_request_latency_seconds_count",
             "vllm:request_prompt_tokens_count", "vllm:request_generation_tokens_count",
             "vllm:request_generation_tokens_sum", "vllm:request_params_n_count"]
    wait_for_metric(url, "triton_llm_num_requests_running", MODEL, lambda v: v == 0)
    before = settled(lambda: {n: metric_value(url, n, MODEL) for n in names})
    sampling = {"temperature": "0", "max_tokens": "8", "ignore_eos": "true"}
    prompts = [f"Metrics prompt number {i} with its own words" for i in range(3)]
    results = run_stream(triton_server.grpc_url, [vllm_request(p, i, False, sampling) for i, p in enumerate(prompts)])
    assert not any(isinstance(r, InferenceServerException) for r in results), results
    # The llm publishes its counts every metrics_interval_s: reads a second apart can agree before that.
    wanted = before["vllm:generation_tokens_total"] + 3 * 8
    wait_for_metric(url, "vllm:generation_tokens_total", MODEL, lambda v: v >= wanted)
    delta = settled(lambda: {n: metric_value(url, n, MODEL) - before[n] for n in names})
    assert delta["vllm:generation_tokens_total"] == delta["vllm:request_generation_tokens_sum"] == 3 * 8, delta
    assert delta["vllm:prompt_tokens_total"] >= 3 * 5, delta  # each prompt's tokens computed once
    for name in names[2:-2] + names[-1:]:
        assert delta[name] == (3 * 7 if "per_output" in name else 3), (name, delta)
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    assert 'vllm:e2e_request_latency_seconds_bucket{' in text and 'le="60"' in text
    for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert metric_value(url, gauge, MODEL) >= 0


# --- a vllm_backend model folder: 1/model.json holds vLLM engine arguments ----------------------------------



def load_vllm_folder(url: str, name: str, engine_args: dict) -> None:
    """Loads a model as vllm_backend users have it: a config naming the backend, and 1/model.json."""
    config = {"name": name, "backend": "triton_llm", "instance_group": [{"kind": "KIND_MODEL", "count": 1}]}
    with httpclient.InferenceServerClient(url) as admin:
        admin.load_model(name, config=json.dumps(config), files={"file:1/model.json": json.dumps(engine_args).encode()})


@pytest.mark.parametrize("engine_args, message", [
    ({"model": "facebook/opt-125m"}, r"model 'facebook/opt-125m': no folder .* nothing is downloaded"),
    ({"model": str(TINY_LLM), "quantization": "awq", "pipeline_parallel_size": 2},
     r"cannot honour: quantization 'awq' \(supported: fp8, compressed-tensors or null\); "
     r"pipeline_parallel_size=2"),
    ({"model": str(TINY_LLM), "kv_cache_dtype": "fp8_e5m2"}, r"kv_cache_dtype 'fp8_e5m2' \(supported: auto, fp8, fp8_e4m3\)"),
], ids=["hub-id", "unsupported-arguments", "kv-cache-dtype"])
def test_a_model_json_that_cannot_be_honoured_fails_the_load_naming_why(triton_server, engine_args, message):
    with pytest.raises(InferenceServerException, match=message):
        load_vllm_folder(triton_server.http_url, "vllm_model", engine_args)


def test_a_vllm_backend_model_folder_loads_from_its_model_json(triton_server):
    load_vllm_folder(triton_server.http_url, "vllm_model", {
        "model": str(TINY_LLM), "gpu_memory_utilization": 0.1, "enforce_eager": True, "disable_log_stats": False,
        "max_model_len": 512, "dtype": "float", "enable_prefix_caching": True})
    try:
        [result] = run_stream(triton_server.grpc_url, [dict(vllm_request(PROMPTS[0], 0, False, SAMPLING))])
        assert not isinstance(result, InferenceServerException), result
    finally:
        with httpclient.InferenceServerClient(triton_server.http_url) as admin:
            admin.unload_model("vllm_model")
            # Under strict readiness a failed load (the tests before) keeps the server unready, and unloading
            # that model does not clear it on Triton 2.51: a load of the name that succeeds, then its unload, does.
            deadline = time.monotonic() + 30
            while not admin.is_server_ready():
                assert time.monotonic() < deadline, "the session server stayed unready after vllm_model unloaded"
                time.sleep(0.2)


# --- HTTP generate: the same values as the tensors, no 5xx for any of them ---------------------------------

@pytest.mark.parametrize("parameters, status, fragment", [
    ({"max_tokens": "8", "temperature": "0", "ignore_eos": "true"}, 200, None),  # strings, as vLLM's clients send
    ({"max_tokens": 8, "stop": '["zzz"]', "top_p": 1}, 200, None),
    ({"max_tokens": 8, "stop_token_ids": [0, 1]}, 200, None),
    ({"max_tokens": 8, "stop_token_ids": "[0, 1]"}, 200, None),
    ({"stop_token_ids": 7}, 400, "'stop_token_ids' must be a list (or a JSON-list string), got 7"),
    ({"max_tokens": 8, "logit_bias": {"0": 5}}, 200, None),
    ({"max_tokens": 8, "allowed_token_ids": "[0, 1]"}, 200, None),
    ({"max_tokens": 4, "truncate_prompt_tokens": "1"}, 200, None),
    ({"max_tokens": 8, "logit_bias": '{"0": "-5.5"}'}, 200, None),
    ({"logit_bias": 7}, 400, "'logit_bias' must be an object (or its JSON text), got 7"),
    ({"logit_bias": {"0": "lots"}}, 400, "'logit_bias['0']' must be a number or a numeric string, got 'lots'"),
    ({"max_tokens": "eight"}, 400, "'parameters.max_tokens' must be an integer for the input's type INT32"),
    ({"max_tokens": "99999999999"}, 400, "'parameters.max_tokens' = 99999999999 is out of range for INT32"),
    ({"temperature": "hot"}, 400, "'temperature' must be a number or a numeric string, got 'hot'"),
    ({"stream": "maybe"}, 400, "'parameters.stream' must be true or false"),
])
def test_http_generate_takes_string_values_and_refuses_bad_ones_with_400(triton_server, parameters, status, fragment):
    body = {"text_input": "Hello", "parameters": parameters}
    got, text = http_post(triton_server.http_url, "/v2/models/llm/generate", body)
    assert got == status, text
    if fragment:
        assert fragment in text, text
