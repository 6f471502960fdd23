"""The llm model (triton_llm backend over llm_engine) through the real server: gRPC streaming and
not, HTTP generate and generate_stream, concurrency, cancellation, bad input, unload and reload,
metrics (overload: test_load.py; preemption: test_kv_exhaustion.py); the engine process of each llm
instance; llm_tp2, the same checkpoint over two tensor-parallel ranks, and llm_in_stub, with the engine in
a thread of the stub (engine_process: false)."""
from __future__ import annotations

import json
import os
import threading
import time

import pytest
import tritonclient.grpc as grpcclient

from llm_streams import StreamSession, llm_inputs
from ragstack import process_tree
from server_helpers import http_post, tiny_llm_ids
from server_metrics import metric_value, wait_for_metric

GREEDY = {"temperature": 0.0, "max_tokens": 12, "ignore_eos": True}


def generate(url: str, prompt: str, sampling=GREEDY, stream=True, model="llm", **kw):
    session = StreamSession(url)
    try:
        c = session.send("r0", llm_inputs(prompt, stream=stream, sampling=sampling, **kw), model=model)
        session.wait_all(120)
    finally:
        session.close()
    return c


def sse_events(body: str) -> list[dict]:
    return [json.loads(line[len("data:"):]) for line in body.splitlines() if line.startswith("data:")]


@pytest.fixture(scope="module")
def server(triton_server):
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    assert client.is_model_ready("llm")
    client.close()
    return triton_server


def test_grpc_streaming_ends_with_one_final(server):
    # 48 tokens: text that ends in a partial character is held back until it completes, and the random tiny
    # model's greedy tokens (which depend on what else shares its batch) once held all of 12 to the end
    c = generate(server.grpc_url, "The capital of France is", sampling={**GREEDY, "max_tokens": 48})
    assert not c.errors and c.finals == 1
    assert c.finish_reasons == ["length"]
    assert len(c.texts) >= 2  # streamed in pieces
    assert c.text.strip()


def test_grpc_non_streaming_single_response_equals_stream(server):
    streamed = generate(server.grpc_url, "Hello there", stream=True)
    single = generate(server.grpc_url, "Hello there", stream=False,
                      extra={"exclude_input_in_output": (True, "BOOL")})
    assert len(single.texts) == 1 and single.finals == 1
    assert single.text == streamed.text


def test_non_streaming_prepends_prompt_unless_excluded(server):
    full = generate(server.grpc_url, "Hello there", stream=False)
    assert full.text.startswith("Hello there")


def test_token_counts_when_asked(server):
    results = []
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.append((result, error)))
    inputs = llm_inputs("count me", stream=False, sampling=GREEDY,
                        extra={"return_num_input_tokens": (True, "BOOL"), "return_num_output_tokens": (True, "BOOL")})
    client.async_stream_infer("llm", inputs, request_id="n")
    deadline = time.monotonic() + 60
    while not results and time.monotonic() < deadline:
        time.sleep(0.05)
    client.stop_stream()
    client.close()
    result, error = results[0]
    assert error is None
    assert result.as_numpy("num_output_tokens")[0] == GREEDY["max_tokens"]
    assert result.as_numpy("num_input_tokens")[0] > 0


def test_stop_reason_when_asked(server):
    """vLLM's stop_reason as JSON: null on every response but the last, which names the stop string or the
    stop token (its id), or is null at max_tokens; include_stop_str_in_output keeps the stop string."""
    asked = {"return_stop_reason": (True, "BOOL")}

    def reasons(c):
        return [json.loads(r.as_numpy("stop_reason")[0]) for r in c.results if r.as_numpy("stop_reason") is not None]

    prompt = "The capital of France is"
    ref = generate(server.grpc_url, prompt, sampling={**GREEDY, "logprobs": 0},
                   extra={**asked, "return_logprobs": (True, "BOOL")})
    assert ref.finish_reasons == ["length"] and len(reasons(ref)) >= 2 and set(reasons(ref)) == {None}
    stop = ref.text[3:5]
    at = ref.text.index(stop)
    cut = generate(server.grpc_url, prompt, sampling={**GREEDY, "stop": [stop]}, extra=asked)
    assert cut.finish_reasons == ["stop"] and cut.text == ref.text[:at]
    assert reasons(cut)[-1] == stop and set(reasons(cut)[:-1]) <= {None}
    kept = generate(server.grpc_url, prompt, sampling={**GREEDY, "stop": [stop], "include_stop_str_in_output": "true"},
                    extra=asked)
    assert kept.text == ref.text[:at + len(stop)] and reasons(kept)[-1] == stop
    ids = [int(list(entry)[-1]) for r in ref.results for entry in json.loads(r.as_numpy("logprobs")[0])]
    status, body = http_post(server.http_url, "/v2/models/llm/generate", {
        "text_input": prompt, "exclude_input_in_output": True, "return_stop_reason": True,
        "parameters": {**GREEDY, "stop_token_ids": [ids[2]]}})
    assert status == 200, body
    assert json.loads(json.loads(body)["stop_reason"]) == ids[2]
    unasked = generate(server.grpc_url, prompt, stream=False)
    assert all(r.as_numpy("stop_reason") is None for r in unasked.results)   # sent only when asked


def test_prompt_logprobs_come_in_the_first_response_with_each_prompt_tokens_entry_last(server):
    prompt = "Paged attention stores keys and values ☃"   # the snowman: three byte tokens in the tiny vocab
    ids = tiny_llm_ids(prompt)
    c = generate(server.grpc_url, prompt, sampling={**GREEDY, "max_tokens": 6, "prompt_logprobs": 2},
                 extra={"return_prompt_logprobs": (True, "BOOL")})
    assert not c.errors
    raws = [json.loads(r.as_numpy("prompt_logprobs")[0]) for r in c.results
            if r.as_numpy("prompt_logprobs") is not None]
    first, later = raws[0], raws[1:]
    assert all(r is None for r in later)   # streamed: in the first response only (the pieces may come as one)
    assert len(first) == len(ids)
    start = first[0][str(ids[0])]
    assert first[0] == {str(ids[0]): {"logprob": None, "rank": None, "decoded_token": start["decoded_token"],
                                      "bytes": start["bytes"]}}   # nothing before the first token scores it
    pieces, raw = start["decoded_token"], start["bytes"]
    for token, entry in zip(ids[1:], first[1:]):
        own_id, own = list(entry.items())[-1]
        assert own_id == str(token) and own["logprob"] <= 0 and own["rank"] >= 1
        assert {1, 2} <= {e["rank"] for e in entry.values()} and len(entry) <= 3
        pieces += own["decoded_token"]
        raw += own["bytes"]
    assert pieces == prompt and bytes(raw) == prompt.encode()   # each token's own bytes: the snowman's parts too
    assert [own["bytes"] for own in (list(entry.values())[-1] for entry in first[-3:])] == [[0xe2], [0x98], [0x83]]


def test_a_prompt_of_token_ids_answers_as_the_text_it_encodes(server):
    ids = tiny_llm_ids("Hello there")
    as_text = generate(server.grpc_url, "Hello there")
    as_ids = generate(server.grpc_url, None, prompt_token_ids=ids)
    assert not as_ids.errors and as_ids.text == as_text.text
    echoed = generate(server.grpc_url, None, prompt_token_ids=ids, stream=False)   # the prompt repeated, decoded
    assert echoed.text == "Hello there" + as_text.text
    status, body = http_post(server.http_url, "/v2/models/llm/generate",
                             {"prompt_token_ids": ids, "exclude_input_in_output": True, "parameters": GREEDY})
    assert status == 200 and json.loads(body)["text_output"] == as_text.text, body


def test_chat_messages_use_the_chat_template(server):
    c = generate(server.grpc_url, None, messages=[{"role": "user", "content": "hi"}])
    assert not c.errors and c.finals == 1 and c.finish_reasons == ["length"]


def test_chat_template_kwargs_reach_the_template_and_bad_ones_are_refused_naming_the_key(server):
    chat = [{"role": "user", "content": "hi"}]

    def input_tokens(kwargs):
        extra = {"return_num_input_tokens": (True, "BOOL")}
        if kwargs is not None:
            extra["chat_template_kwargs"] = (json.dumps(kwargs).encode(), "BYTES")
        c = generate(server.grpc_url, None, messages=chat, stream=False, extra=extra)
        assert not c.errors and c.finals == 1 and c.finish_reasons == ["length"], c.errors
        return int(c.results[-1].as_numpy("num_input_tokens")[0])

    turn = "<|im_start|>user\nhi<|im_end|>\n"
    assert input_tokens(None) == len(tiny_llm_ids(turn + "<|im_start|>assistant\n"))
    assert input_tokens({"add_generation_prompt": False}) == len(tiny_llm_ids(turn))

    refused = generate(server.grpc_url, None, messages=chat,
                       extra={"chat_template_kwargs": (b'{"tokenize": false}', "BYTES")})
    assert refused.finals == 1 and len(refused.errors) == 1, refused.errors
    assert "input 'chat_template_kwargs' key 'tokenize' is an argument of apply_chat_template" in refused.errors[0]
    status, text = http_post(server.http_url, "/v2/models/llm/generate", {
        "messages": json.dumps(chat), "chat_template_kwargs": '{"tokenize": false}', "parameters": GREEDY})
    assert status == 400 and "key 'tokenize'" in text, (status, text)


def test_http_generate_and_parameters_fallback(server):
    status, body = http_post(server.http_url, "/v2/models/llm/generate",
                             {"text_input": "Hello there", "stream": False, "exclude_input_in_output": True,
                              "return_finish_reason": True, "parameters": GREEDY})
    assert status == 200, body
    reply = json.loads(body)
    assert reply["finish_reason"] == "length"
    assert reply["text_output"] == generate(server.grpc_url, "Hello there").text


def test_http_generate_stream_sse(server):
    status, body = http_post(server.http_url, "/v2/models/llm/generate_stream",
                             {"text_input": "Hello there", "stream": True, "return_finish_reason": True,
                              "parameters": GREEDY})
    assert status == 200, body
    events = sse_events(body)
    for event in events:  # with SSE an error can arrive after the 200
        assert "error" not in event, event
    assert len(events) >= 2
    assert events[-1]["finish_reason"] == "length"
    assert "".join(e["text_output"] for e in events) == generate(server.grpc_url, "Hello there").text


def test_32_concurrent_streams_match_alone(server):
    prompts = [f"request number {i} says" for i in range(32)]
    alone = {p: generate(server.grpc_url, p).text for p in prompts[:4]}
    session = StreamSession(server.grpc_url)
    try:
        collected = {p: session.send(f"c{i}", llm_inputs(p, sampling=GREEDY)) for i, p in enumerate(prompts)}
        session.wait_all(300)
    finally:
        session.close()
    assert not session.errors
    for p, c in collected.items():
        assert c.finals == 1 and c.finish_reasons == ["length"], (p, c)
    for p, text in alone.items():
        assert collected[p].text == text  # greedy: batching does not change the tokens


def test_cancellation_mid_stream_frees_blocks(server):
    session = StreamSession(server.grpc_url)
    c = session.send("long", llm_inputs("a long answer", sampling={"temperature": 0.0, "max_tokens": 1500,
                                                                    "ignore_eos": True}))
    deadline = time.monotonic() + 60
    while len(c.texts) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(c.texts) >= 3
    # The gauges move while it runs (the engine process's stats reach the metrics thread).
    wait_for_metric(server.metrics_url, "triton_llm_num_requests_running", "llm", lambda v: v == 1)
    wait_for_metric(server.metrics_url, "triton_llm_kv_cache_blocks_used", "llm", lambda v: v > 0)
    session.close(cancel=True)
    # The sequence is aborted in the engine: no request runs, every KV block is free again.
    for gauge in ("triton_llm_kv_cache_blocks_used", "triton_llm_num_requests_running"):
        wait_for_metric(server.metrics_url, gauge, "llm", lambda v: v == 0)
    assert len(c.texts) < 1500


BAD_INPUTS = [
    # case, inputs, the word the error must name
    ("missing text_input", dict(prompt=None), "text_input"),
    ("bad JSON", dict(sampling_parameters="{not json"), "sampling_parameters"),
    ("unknown key", dict(sampling={"temprature": 0.5}), "temprature"),
    ("negative temperature", dict(sampling={"temperature": -1.0}), "temperature"),
    ("top_p out of range", dict(sampling={"top_p": 1.5}), "top_p"),
    ("prompt over the limit", dict(prompt="word " * 5000), "max_model_len"),
    ("max_tokens beyond context", dict(max_tokens=100000), "max_tokens"),
    ("empty prompt", dict(prompt=""), "text_input"),
    ("bad messages", dict(prompt=None, messages=[{"role": "user"}]), "messages"),
    ("token ids and text", dict(prompt_token_ids=[1, 2]), "prompt_token_ids"),
    ("token id past the vocabulary", dict(prompt=None, prompt_token_ids=[1, 99999]), "prompt token ids must be in"),
    ("no token ids", dict(prompt=None, prompt_token_ids=[]), "prompt_token_ids"),
]


@pytest.mark.parametrize("case, inputs, field", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_invalid_arg(server, case, inputs, field):
    args = {"prompt": "hello", **inputs}
    prompt = args.pop("prompt")
    raw_params = args.pop("sampling_parameters", None)
    extra = {"sampling_parameters": (raw_params.encode(), "BYTES")} if raw_params else None
    session = StreamSession(server.grpc_url)
    try:
        c = session.send("bad", llm_inputs(prompt, extra=extra, **args))
        session.wait_all(60)
    finally:
        session.close()
    assert c.finals == 1 and len(c.errors) == 1, case
    assert field in c.errors[0], c.errors[0]

    # The gRPC stream drops the status code; the HTTP generate endpoint shows it: 400 = INVALID_ARG.
    body = {"stream": False}
    if prompt is not None:
        body["text_input"] = prompt
    if "messages" in args:
        body["messages"] = json.dumps(args["messages"])
    if "sampling" in args:
        body["sampling_parameters"] = json.dumps(args["sampling"])
    if raw_params:
        body["sampling_parameters"] = raw_params
    if "max_tokens" in args:
        body["max_tokens"] = args["max_tokens"]
    if "prompt_token_ids" in args:
        body["prompt_token_ids"] = args["prompt_token_ids"]
    status, text = http_post(server.http_url, "/v2/models/llm/generate", body)
    assert status == 400 and field in text, (status, text)
    assert generate(server.grpc_url, "still serving").finals == 1


def test_metrics_move(server):
    names = ["triton_llm_prompt_tokens_total", "triton_llm_generation_tokens_total",
             "triton_llm_time_to_first_token_seconds_count", "triton_llm_time_to_first_response_seconds_count",
             "triton_llm_time_per_output_token_seconds_count",
             "triton_llm_e2e_request_latency_seconds_count", "triton_llm_requests_finished_total"]
    before = {n: metric_value(server.metrics_url, n) for n in names}
    generate(server.grpc_url, "metrics please")
    # The gaps between tokens are observed by a thread of their own once the request has finished.
    gaps = "triton_llm_time_per_output_token_seconds_count"
    wait_for_metric(server.metrics_url, gaps, "llm", lambda v: v > before[gaps], timeout_s=5)
    after = {n: metric_value(server.metrics_url, n) for n in names}
    for n in names:
        assert after[n] > before[n], n
    assert metric_value(server.metrics_url, "triton_llm_kv_cache_blocks_total") > 0


def test_the_first_response_follows_the_first_token(server):
    sums = ["triton_llm_time_to_first_token_seconds_sum", "triton_llm_time_to_first_response_seconds_sum"]
    counts = [name.replace("_sum", "_count") for name in sums]
    before = {n: metric_value(server.metrics_url, n) for n in sums + counts}
    generate(server.grpc_url, "when does the first answer leave")
    for n in counts:
        wait_for_metric(server.metrics_url, n, "llm", lambda v, n=n: v >= before[n] + 1, timeout_s=5)
    ttft, first_response = (metric_value(server.metrics_url, n) - before[n] for n in sums)
    assert 0 < ttft <= first_response < ttft + 1.0
    metric_value(server.metrics_url, "triton_llm_num_requests_waiting")


def engine_process(server, instance: str = "llm_0_0") -> int:
    """The pid of the model instance's engine process (a child of its stub)."""
    [pid] = process_tree.engine_pids(server.process.pid, instance)
    return pid


def test_unload_and_reload_during_and_after_traffic(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    old_engine = engine_process(server)
    session = StreamSession(server.grpc_url)
    cs = [session.send(f"u{i}", llm_inputs("unload me", sampling={"temperature": 0.0, "max_tokens": 30,
                                                                   "ignore_eos": True})) for i in range(4)]
    time.sleep(0.3)
    unloader = threading.Thread(target=client.unload_model, args=("llm",))
    unloader.start()
    session.wait_all(120)
    unloader.join(60)
    session.close()
    for c in cs:  # each finished normally or ended with a clear error, always with one FINAL
        assert c.finals == 1
        assert c.finish_reasons == ["length"] or c.errors
    deadline = time.monotonic() + 60
    while (client.is_model_ready("llm") or process_tree.is_alive(old_engine)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not process_tree.is_alive(old_engine)  # unloading stopped the engine process
    for _ in range(2):
        client.load_model("llm")
        assert client.is_model_ready("llm")
        assert generate(server.grpc_url, "back again").finals == 1
    assert engine_process(server) != old_engine
    client.close()



def processes() -> dict[int, tuple[int, bytes]]:
    """pid -> (parent pid, command line) of every process."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                table[int(entry)] = (parent, f.read())
        except OSError:  # it exited meanwhile
            continue
    return table


def tensor_parallel_workers(server) -> list[int]:
    """Pids of the llm_engine.worker.tp_worker processes under the server (children of the models' engine processes)."""
    table = processes()
    below, frontier = set(), {server.process.pid}
    while frontier:
        frontier = {pid for pid, (parent, _) in table.items() if parent in frontier}
        below |= frontier
    return sorted(pid for pid in below if b"llm_engine.worker.tp_worker" in table[pid][1])


def test_tensor_parallel_model_generates_what_one_rank_does(server):
    """llm_tp2 (tests/fixtures) serves llm's checkpoint over two ranks: greedy text is the same."""
    for prompt in ("The capital of France is", "Two plus two"):
        two = generate(server.grpc_url, prompt, model="llm_tp2")
        assert not two.errors and two.finals == 1 and two.finish_reasons == ["length"]
        assert two.text == generate(server.grpc_url, prompt).text


def test_unloading_the_tensor_parallel_model_stops_its_worker(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert len(tensor_parallel_workers(server)) == 1  # rank 1; rank 0 is the model's engine process
    rank0 = engine_process(server, "llm_tp2_0_0")
    client.unload_model("llm_tp2")
    deadline = time.monotonic() + 60
    while (client.is_model_ready("llm_tp2") or tensor_parallel_workers(server) or process_tree.is_alive(rank0)) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    assert tensor_parallel_workers(server) == [] and not process_tree.is_alive(rank0)
    client.load_model("llm_tp2")  # a fresh stub starts a fresh engine process, which starts a fresh rank 1
    assert client.is_model_ready("llm_tp2") and len(tensor_parallel_workers(server)) == 1
    assert generate(server.grpc_url, "back again", model="llm_tp2").finals == 1
    client.close()


def test_the_engine_in_the_stub_serves_the_same(server):
    """llm_in_stub (tests/fixtures): engine_process false, no engine process; the same greedy text, cancellation."""
    assert process_tree.engine_pids(server.process.pid, "llm_in_stub_0_0") == []
    c = generate(server.grpc_url, "The capital of France is", model="llm_in_stub")
    assert not c.errors and c.finals == 1 and c.finish_reasons == ["length"]
    assert c.text == generate(server.grpc_url, "The capital of France is").text
    session = StreamSession(server.grpc_url)
    long = session.send("long", llm_inputs("a long answer", sampling={"temperature": 0.0, "max_tokens": 200,
                                                                       "ignore_eos": True}), model="llm_in_stub")
    deadline = time.monotonic() + 60
    while not long.texts and time.monotonic() < deadline:
        time.sleep(0.02)
    session.close(cancel=True)
    wait_for_metric(server.metrics_url, "triton_llm_kv_cache_blocks_used", "llm_in_stub", lambda v: v == 0)
