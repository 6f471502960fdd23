"""What the running server serves, for tests that cross its limits: a model's config as the HTTP
API returns it, a config parameter, and the input limits a served ONNX graph records."""
from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import tritonclient.http as httpclient

REPOSITORY = Path(__file__).resolve().parents[1] / "model_repository"


@cache
def config(http_url: str, model: str) -> dict:
    client = httpclient.InferenceServerClient(http_url)
    try:
        return client.get_model_config(model)
    finally:
        client.close()


def parameter(http_url: str, model: str, key: str) -> int:
    return int(config(http_url, model)["parameters"][key]["string_value"])


@cache
def token_limits(model: str) -> dict:
    import onnx  # noqa: PLC0415 - only these cases need it

    graph = onnx.load(str(REPOSITORY / model / "1" / "model.onnx"), load_external_data=False)
    return json.loads({p.key: p.value for p in graph.metadata_props}["token_inputs"])
