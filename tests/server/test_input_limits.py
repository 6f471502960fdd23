"""Every input limit is enforced in the server path and its error says the limit (INVALID_ARG): one
request just past each, the limit read from the served config. docs/operations.md lists them."""
from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from bad_input import generate, is_invalid_arg, send, tensor
from bad_input_strategies import texts_array
from served_config import config, parameter, token_limits

pytestmark = pytest.mark.server


def tokens(rows: int, length: int) -> dict:
    ids = np.ones((rows, length), np.int64)
    return {"input_ids": (ids, "INT64"), "attention_mask": (ids, "INT64"), "token_type_ids": (ids * 0, "INT64")}


def prompt_builder(**changes) -> dict:
    request = {"query": texts_array([b"q"]), "passages": texts_array([b"p"]), "sources": texts_array([b"s"]),
               "scores": (np.ones((1, 1), np.float32), "FP32")}
    return {**request, **changes}


def over_the_limit(url: str) -> list[tuple[str, dict, str]]:
    """(model, a request one past a limit, what the error must say)."""
    texts, passages = parameter(url, "embed_tokenizer", "max_texts"), parameter(url, "rerank_tokenizer", "max_texts")
    text_bytes = parameter(url, "embed_tokenizer", "max_text_bytes")
    top_k, top_n = parameter(url, "retriever", "max_top_k"), parameter(url, "prompt_builder", "max_top_n")
    query_chars = parameter(url, "prompt_builder", "max_query_chars")
    most_passages = parameter(url, "prompt_builder", "max_passages")
    passage_bytes = parameter(url, "prompt_builder", "max_passage_bytes")
    batch, max_length = config(url, "embedder")["max_batch_size"], token_limits("embedder")["max_length"]
    unit = (np.full((1, 384), 384 ** -0.5, np.float32), "FP32")
    return [
        ("embed", {"text": texts_array([b"t"] * (texts + 1))}, f"send 1 to {texts}"),
        ("embed", {"text": texts_array([b"t" * (text_bytes + 1)])}, f"the limit is {text_bytes}"),
        ("rerank", {"query": texts_array([b"q"]), "passages": texts_array([b"p"] * (passages + 1))},
         f"send 1 to {passages}"),
        ("embedder", tokens(batch + 1, 4), f"batch-size must be <= {batch}"),
        ("embedder", tokens(1, max_length + 1), f"1 to {max_length} tokens"),
        ("retriever", {"embedding": unit, "top_k": tensor(top_k + 1, "INT32")}, f"1 to {top_k}"),
        ("prompt_builder", prompt_builder(top_n=tensor(top_n + 1, "INT32")), f"1 to {top_n}"),
        ("prompt_builder", prompt_builder(query=texts_array([b"q" * (query_chars + 1)])),
         f"the limit is {query_chars}"),
        ("prompt_builder", prompt_builder(passages=texts_array([b"p" * (passage_bytes + 1)])),
         f"the limit is {passage_bytes}"),
        ("prompt_builder", prompt_builder(**{name: texts_array([b"x"] * (most_passages + 1))
                                                  for name in ("passages", "sources")},
                                          scores=(np.ones((most_passages + 1, 1), np.float32), "FP32")),
         f"the limit is {most_passages}"),
    ]


def test_limits_of_the_non_generating_models(triton_server):
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    for model, request, says in over_the_limit(triton_server.http_url):
        error = send(client, model, request)
        assert error is not None and is_invalid_arg(error), (model, says, error)
        assert says in error.message(), (model, error.message())
    client.close()


def test_each_tokenizer_step_passes_its_models_full_batch_and_no_more(triton_server):
    """`embed` and `rerank` serve as many texts as their ONNX model takes in one batch (its max_batch_size):
    one more is refused by the tokenizer step with its own message, before the model would refuse it."""
    url = triton_server.http_url
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    for ensemble, model, name in (("embed", "embedder", "text"), ("rerank", "reranker", "passages")):
        batch = config(url, model)["max_batch_size"]
        query = {"query": texts_array([b"q"])} if ensemble == "rerank" else {}
        assert send(client, ensemble, {**query, name: texts_array([b"t"] * batch)}) is None, ensemble
        error = send(client, ensemble, {**query, name: texts_array([b"t"] * (batch + 1))})
        assert error is not None and is_invalid_arg(error), (ensemble, error)
        assert f"{name}: {batch + 1} texts in the request; send 1 to {batch}" in error.message(), error.message()
    client.close()


def test_limits_of_the_llm(triton_server):
    url = triton_server.http_url
    engine = {k: v["string_value"] for k, v in config(url, "llm")["parameters"].items()}
    max_len, prompt_bytes = int(engine["max_model_len"]), int(engine["max_prompt_bytes"])
    for body, says in (
            ({"text_input": "word " * (2 * max_len)}, f"max_model_len={max_len}"),
            ({"text_input": "a" * (prompt_bytes + 1)}, f"the limit is {prompt_bytes}"),
            ({"text_input": "hello", "max_tokens": max_len}, f"max_model_len={max_len}"),
            ({"text_input": "hello", "sampling_parameters": json.dumps({"stop": ["x" * (64 << 10)]})},
             f"the limit is {64 << 10}"),
            ({"text_input": "hello", "sampling_parameters": "[" * 17 + "]" * 17}, "deeper than 16 levels"),
            ({"text_input": "hello", "sampling_parameters": '{"seed": ' + "9" * 33 + "}"}, "the limit is 32")):
        status, text = generate(url, "llm", {**body, "stream": False})
        assert status == 400 and says in text, (says, status, text[:300])
