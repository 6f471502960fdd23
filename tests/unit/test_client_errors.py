"""The client's error reporting that needs no server: the status code read back from a message where
Triton 2.51 drops it (ragstack.error_codes), a failed load's reason in one line (ModelInfo.short_reason),
and the --url forms the transports take. The messages are copied from the server's answers."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from llm_engine.sampling_params import SamplingParams
from ragstack.error_codes import code_from_grpc, code_from_http, code_from_message
from ragstack.reachability import address
from ragstack.results import ModelInfo
from ragstack.tls import TlsOptions, resolve
from ragstack.transports import split_url

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


@pytest.mark.parametrize("message, code", [
    # the llm through rag_generate and the rag ensemble, as a gRPC stream and HTTP generate show them
    ("in ensemble 'rag', temperature must be >= 0 (0 = greedy), got -1", "INVALID_ARG"),
    ("in ensemble 'rag', sampling_parameters: 'temperature' must be a number or a numeric string, got 'abc'",
     "INVALID_ARG"),
    ("in ensemble 'rag', unknown sampling parameter(s) ['bogus']; known: ['frequency_penalty']", "INVALID_ARG"),
    ("in ensemble 'rag', max_tokens must be <= 570 (max_model_len=2048 minus 1478 prompt tokens), got 100000",
     "INVALID_ARG"),
    ("in ensemble 'rag', logit_bias token ids must be < vocab size 512, got 99999", "INVALID_ARG"),
    ("logit_bias['5'] must be a number in [-100, 100], got 101", "INVALID_ARG"),
    ("allowed_token_ids holds only end-of-sequence or stop ids, which min_tokens=1 forbids: no token could be "
     "picked", "INVALID_ARG"),
    ("prompt + max_tokens = 900 tokens needs 57 KV blocks; the cache holds 24 blocks of 16 tokens", "INVALID_ARG"),
    ("input 'sampling_parameters' is not valid JSON: Expecting value at position 0", "INVALID_ARG"),
    ("missing input: give 'text_input' (a prompt), 'messages' (chat JSON) or 'prompt_token_ids'", "INVALID_ARG"),
    ("give either 'text_input', 'messages' or 'prompt_token_ids', not text_input and prompt_token_ids",
     "INVALID_ARG"),
    ("prompt token ids must be in [0, 512), got min 0, max 99999", "INVALID_ARG"),
    ("'parameters' must be a JSON object, got list", "INVALID_ARG"),
    ("When streaming, `exclude_input_in_output` = False is not allowed.", "INVALID_ARG"),
    # the other steps
    ("in ensemble 'rag', top_k: 0 is out of range; it must be 1 to 64", "INVALID_ARG"),
    ("in ensemble 'embed', text[0] is empty; every text needs at least one non-blank character", "INVALID_ARG"),
    ("embedding: norm is nan; expected a finite, non-zero vector", "INVALID_ARG"),
    ("rag_generate: missing input(s) ['sources']", "INVALID_ARG"),
    ("in ensemble 'rag_context', unexpected deadlock, at least one output is not set while no more ensemble "
     "steps can be made", "INVALID_ARG"),
    # overload, unloading, an engine's death or restart
    ("in ensemble 'rag', waiting queue is full (max_waiting=4); retry later", "UNAVAILABLE"),
    ("the engine process (pid 4242) was killed by SIGKILL; its last output: x\ny; unload and load the model "
     "to start a new engine", "UNAVAILABLE"),
    ("the engine is restarting after a failure (exited with code 1); retry in a few seconds", "UNAVAILABLE"),
    ("the model is being unloaded; request aborted", "UNAVAILABLE"),
    ("rag_generate: no response from llm for 60 s (parameter llm_idle_timeout_s); the request is abandoned",
     "UNAVAILABLE"),
    ("in ensemble 'rag', request cancelled by the client", "CANCELLED"),
    # Triton's own
    ("in ensemble 'rag', Model llm - Error when running inference: Failed for execute the inference request. "
     "Model 'llm' is not ready.", "NOT_FOUND"),
    ("in ensemble 'rag', Request for unknown model: 'retriever' has no available versions", "NOT_FOUND"),
    ("in ensemble 'rag', Stub process 'retriever_0_0' is not healthy.", "INTERNAL"),
    ("triton_llm: KeyError: 'x'", "INTERNAL"),
    ("request 'abc' failed: step failed", "INTERNAL"),
])
def test_a_message_of_a_known_family_has_its_code(message, code):
    assert code_from_message(message) == code


def test_every_sampling_parameters_refusal_is_invalid_arg():
    """Through a gRPC stream a message names no code: a SamplingParams field missing from error_codes' families
    would come back as a 500 from the OpenAI frontend."""
    for field in dataclasses.fields(SamplingParams):
        assert code_from_message(f"in ensemble 'rag', {field.name} must be something, got x") == "INVALID_ARG", field


@pytest.mark.parametrize("message", [
    "in ensemble 'rag', Conversation roles must alternate user/assistant/user/assistant/...",  # a chat template
    "onnxruntime: [ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid dimensions",  # either code
    "rag_generate: 'NoneType' object is not subscriptable",
    "The stream is no longer in valid state, the error detail is reported through provided callback.",
    "something went wrong: temperature must be >= 0",  # a family counts only at the start
    "",
])
def test_any_other_message_has_none(message):
    assert code_from_message(message) is None


def _limits_table() -> list[tuple[str, str]]:
    """(message, code) of each row of operations.md's Limits table that quotes the error."""
    rows = []
    section = OPERATIONS.read_text().split("## Limits", 1)[1].split("\n## ", 1)[0]
    for line in section.splitlines():
        says = line.strip().strip("|").split("|")[-1].strip()   # the "error says" column
        code = "UNAVAILABLE" if says.startswith("UNAVAILABLE ") else "INVALID_ARG"
        quoted = re.match(r"`([^`]+)`", says.removeprefix("UNAVAILABLE "))
        if quoted and not quoted.group(1).startswith("..."):  # "...": `ragstack index build`'s, on the client
            rows.append((quoted.group(1), code))
    return rows


def test_every_error_in_the_limits_table_maps_to_its_code():
    """docs/operations.md lists each limit's message: through a gRPC stream (no code) each one must
    still come back with the code the table gives. A new row needs its family in ragstack/error_codes.py."""
    rows = _limits_table()
    assert len(rows) >= 15
    wrong = [(m, c, code_from_message(f"in ensemble 'rag', {m}")) for m, c in rows
             if code_from_message(f"in ensemble 'rag', {m}") != c]
    assert not wrong, wrong


def test_codes_from_the_protocols():
    assert code_from_grpc("StatusCode.INVALID_ARGUMENT") == "INVALID_ARG"
    assert code_from_grpc(None) == "UNKNOWN"
    assert [code_from_http(s) for s in (400, 404, 413, 429, 502, 503, 418, None)] == [
        "INVALID_ARG", "NOT_FOUND", "INVALID_ARG", "UNAVAILABLE", "UNAVAILABLE", "UNAVAILABLE", "UNKNOWN", "UNKNOWN"]


ENGINE_FAILED = """Internal: EngineStartError: the engine process exited with code 1 while starting; its last output:
Traceback (most recent call last):
  File "/work/main/llm_engine/worker/kv_cache.py", line 46, in allocate_kv_cache
    raise ValueError(f"num_kv_blocks {num_blocks} x block_size {block_size} exceeds {MAX_SLOTS} cache slots")
ValueError: num_kv_blocks 1000000000 x block_size 16 exceeds 2147483647 cache slots


At:
  /tmp/work/backends/triton_llm/engine_supervisor.py(33): __init__
  /tmp/work/backends/triton_llm/model.py(92): initialize
"""
NO_CHECKPOINT = """Internal: ValueError: model 'tiny-qwen2': no folder /r/m/1/tiny-qwen2. Name a local folder

At:
  /tmp/work/backends/triton_llm/engine_settings.py(76): load_settings
"""


@pytest.mark.parametrize("reason, short", [
    (ENGINE_FAILED, "ValueError: num_kv_blocks 1000000000 x block_size 16 exceeds 2147483647 cache slots"),
    (NO_CHECKPOINT, "ValueError: model 'tiny-qwen2': no folder /r/m/1/tiny-qwen2. Name a local folder"),
    ("unloaded", "unloaded"),
    ("Invalid argument: model 'x' has no version folder", "model 'x' has no version folder"),
    ("", ""),
])
def test_a_failed_loads_reason_in_one_line(reason, short):
    assert ModelInfo("m", "1", "UNAVAILABLE", reason).short_reason == short


@pytest.mark.parametrize("url, protocol, host_port", [
    ("localhost:8001", "grpc", ("localhost", 8001)),
    ("example.org", "grpc", ("example.org", 8001)),
    ("example.org", "http", ("example.org", 8000)),
    ("http://10.0.0.5:9000", "http", ("10.0.0.5", 9000)),
    ("grpc://10.0.0.5:9001/", "grpc", ("10.0.0.5", 9001)),
    ("[::1]:8001", "grpc", ("::1", 8001)),
    ("https://example.org", "http", ("example.org", 443)),
    ("grpcs://example.org:443", "grpc", ("example.org", 443)),
])
def test_urls(url, protocol, host_port):
    assert split_url(url, protocol) == host_port


@pytest.mark.parametrize("url, says", [
    ("localhost:80x", "the port is not a number"),
    ("http://localhost:8000/v2", "give the server as host:port"),
    ("ftp://localhost", "give the server as host:port"),
])
def test_urls_refused(url, says):
    with pytest.raises(ValueError, match=says):
        split_url(url, "http")


@pytest.mark.parametrize("url, protocol, tls, resolved", [
    ("localhost:8001", "grpc", None, None),
    ("grpc://localhost:8001", "grpc", None, None),
    ("grpcs://localhost", "grpc", None, TlsOptions()),
    ("https://localhost", "http", None, TlsOptions()),
    ("localhost:8000", "http", True, TlsOptions()),
    ("localhost:8000", "http", TlsOptions(insecure=True), TlsOptions(insecure=True)),
    ("https://localhost", "http", TlsOptions(insecure=True), TlsOptions(insecure=True)),
    ("localhost:8000", "http", False, None),
])
def test_when_tls_is_used(url, protocol, tls, resolved):
    assert resolve(url, protocol, tls) == resolved


@pytest.mark.parametrize("url, protocol, tls, says", [
    ("https://localhost", "http", False, "the URL asks for TLS and tls=False"),
    ("http://localhost", "http", True, "a http:// URL connects without TLS; write https://"),
    ("grpc://localhost", "grpc", TlsOptions(), "write grpcs://"),
    ("localhost", "grpc", TlsOptions(insecure=True), "gRPC cannot skip the check"),
    ("localhost", "http", TlsOptions(insecure=True, ca_file=__file__), "give one or the other"),
    ("localhost", "http", TlsOptions(key_file=__file__), "needs its certificate"),
    ("localhost", "http", TlsOptions(ca_file="/no/ca.pem"), "TLS CA file /no/ca.pem: no such file"),
])
def test_tls_settings_refused(url, protocol, tls, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        resolve(url, protocol, tls)


def test_addresses():
    assert address("127.0.0.1", 8001) == "127.0.0.1:8001"
    assert address("::1", 8001) == "[::1]:8001"
