"""Property-based bad input to every non-decoupled public model, over gRPC and HTTP: each case is
refused with INVALID_ARG naming the field (Triton's own check for dtypes, shapes and missing or
unknown inputs; the model's for values), and a valid request still works after the cases.
The limits the cases cross are read from the running server's configs and the served graphs."""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from hypothesis import given
from hypothesis import strategies as st

from bad_input import TRIED, bounded, check_refused, is_invalid_arg, send
from bad_input_strategies import (embedding_cases, out_of_range, prompt_builder_cases, query_cases, texts_array,
                                  texts_cases, token_cases, triton_cases)
from served_config import config, parameter, token_limits

pytestmark = pytest.mark.server
MODELS = ["embed", "embed_tokenizer", "rerank", "rerank_tokenizer", "embedder", "reranker", "retriever",
          "prompt_builder", "rag_context"]
EXAMPLES = {"rag_context": 60}   # its valid steps (embed, retrieve, rerank) make each case slower
DEFAULT_EXAMPLES = 150


def tokens(rows: int) -> dict:
    ids = np.array([[101, 2023, 102]] * rows, dtype=np.int64)
    return {"input_ids": (ids, "INT64"), "attention_mask": (np.ones_like(ids), "INT64"),
            "token_type_ids": (np.zeros_like(ids), "INT64")}


def cases_for(model: str, url: str):
    """(a valid request, the strategy of its value-level mistakes)."""
    if model in ("embed", "embed_tokenizer"):
        valid = {"text": texts_array([b"a valid text"])}
        return valid, texts_cases(valid, "text", parameter(url, "embed_tokenizer", "max_texts"),
                                  parameter(url, "embed_tokenizer", "max_text_bytes"))
    if model in ("rerank", "rerank_tokenizer"):
        valid = {"query": texts_array([b"a query"]), "passages": texts_array([b"one passage", b"another"])}
        limit = parameter(url, "rerank_tokenizer", "max_text_bytes")
        return valid, st.one_of(query_cases(valid, limit, "query[0]"),
                                texts_cases(valid, "passages", parameter(url, "rerank_tokenizer", "max_texts"), limit))
    if model in ("embedder", "reranker"):
        return tokens(2), token_cases(token_limits(model), config(url, model)["max_batch_size"])
    if model == "retriever":
        unit = np.full((1, 384), 384 ** -0.5, np.float32)
        valid = {"embedding": (unit, "FP32"), "top_k": (np.array([3], np.int32), "INT32")}
        return valid, embedding_cases(valid, 384, parameter(url, "retriever", "max_top_k"))
    if model == "prompt_builder":
        valid = {"query": texts_array([b"a question"]), "passages": texts_array([b"p one", b"p two"]),
                 "sources": texts_array([b"a.md", b"b.md"]), "passage_ids": texts_array([b"a#0", b"b#0"]),
                 "scores": (np.array([[0.5], [0.2]], np.float32), "FP32"), "top_n": (np.array([2], np.int32), "INT32")}
        return valid, prompt_builder_cases(valid, *(parameter(url, model, key) for key in (
            "max_query_chars", "max_passages", "max_passage_bytes", "max_top_n")))
    valid = {"query": texts_array([b"How is the KV cache divided into blocks?"]),
             "top_k": (np.array([4], np.int32), "INT32"), "top_n": (np.array([2], np.int32), "INT32")}
    return valid, st.one_of(query_cases(valid, parameter(url, "embed_tokenizer", "max_text_bytes"), "text[0]"),
                            out_of_range(valid, "top_k", parameter(url, "retriever", "max_top_k")),
                            out_of_range(valid, "top_n", parameter(url, "prompt_builder", "max_top_n")))


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("model", MODELS)
def test_bad_input_is_refused_and_the_model_keeps_serving(triton_server, model, protocol):
    module = grpcclient if protocol == "grpc" else httpclient
    client = module.InferenceServerClient(triton_server.grpc_url if protocol == "grpc" else triton_server.http_url)
    valid, values = cases_for(model, triton_server.http_url)

    @bounded(EXAMPLES.get(model, DEFAULT_EXAMPLES))
    @given(case=st.one_of(triton_cases(valid, config(triton_server.http_url, model)), values))
    def refused(case):
        TRIED[f"{model} {protocol}"] += 1
        error = send(client, model, case.tensors)
        check_refused(error and error.message(), case, error is not None and is_invalid_arg(error))

    try:
        refused()
        assert send(client, model, valid) is None, "a valid request failed after the bad ones"
    finally:
        client.close()
