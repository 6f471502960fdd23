"""Calls of the text models (`embed`, `rerank`) with either tritonclient (gRPC or HTTP) client."""
from __future__ import annotations

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient


def module(client):
    return grpcclient if isinstance(client, grpcclient.InferenceServerClient) else httpclient


def text_input(client, name: str, texts: list[str]):
    tensor = module(client).InferInput(name, [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object))
    return tensor


def embed(client, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(embedding [N, D], truncated [N])"""
    result = client.infer("embed", [text_input(client, "text", texts)])
    return result.as_numpy("embedding"), result.as_numpy("truncated")


def rerank(client, query: str, passages: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(scores [N], truncated [N])"""
    result = client.infer("rerank", [text_input(client, "query", [query]), text_input(client, "passages", passages)])
    return result.as_numpy("scores")[:, 0], result.as_numpy("truncated")
