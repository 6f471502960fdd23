"""Which Triton models the OpenAI API serves, and through which endpoint: read from each model's
tensors, so a model of one's own with the same tensors is served too.

- llm: `text_input` and `messages` in, `text_output` out (backend triton_llm): chat, completions and
  vLLM's tokenize and detokenize (endpoint "tokenize")
- rag: `query` in, `text_output` and `sources` out (the `rag` ensemble): chat, with sources
- embed: `text` in, `embedding` out (the `embed` ensemble): embeddings
- rerank: `query` and `passages` in, `scores` out (the `rerank` ensemble; `activated_scores` too where the
  model has it): rerank and vLLM's score
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from ragstack.openai_frontend.errors import APIError, model_not_found, not_ready
from ragstack.openai_frontend.triton import CHANGING, CONFIG_CACHE_S, Triton

ENDPOINTS = {"llm": ("chat.completions", "completions", "tokenize"), "rag": ("chat.completions",),
             "embed": ("embeddings",), "rerank": ("rerank", "score")}
CREATED = int(time.time())   # OpenAI's model objects carry a creation time: the frontend's start
_ONLY: dict[str, tuple[float, str]] = {}   # endpoint -> (when, the one model serving it) for requests without one
# A Triton model's name is its folder's: no longer than a file name. A longer one is no model, and is not sent
# on: Triton's error repeats it, past gRPC's metadata limit (16 KiB) at about 12k characters.
MAX_NAME_BYTES = 255


@dataclass(frozen=True)
class Served:
    name: str
    kind: str
    dimensions: int | None = None   # an embed model's
    inputs: frozenset[str] = frozenset()   # the inputs its config declares
    outputs: frozenset[str] = frozenset()   # and its outputs


def kind_of(config: dict) -> Served | None:
    inputs = {i["name"] for i in config.get("input", [])}
    outputs = {o["name"]: o for o in config.get("output", [])}
    name = config.get("name", "")
    if {"text_input", "messages"} <= inputs and "text_output" in outputs:
        return Served(name, "llm", inputs=frozenset(inputs))
    if "query" in inputs and {"text_output", "sources"} <= set(outputs):
        return Served(name, "rag", inputs=frozenset(inputs))
    if inputs == {"text"} and "embedding" in outputs:
        return Served(name, "embed", int(outputs["embedding"]["dims"][-1]), frozenset(inputs))
    if inputs == {"query", "passages"} and "scores" in outputs:
        return Served(name, "rerank", inputs=frozenset(inputs), outputs=frozenset(outputs))
    return None


async def served(triton: Triton, model: str | None, endpoint: str) -> Served:
    """The model, if it is loaded and serves `endpoint`; else 404 (no such model), 503 (loading or unloading)
    or 400 (another kind). None or "": the one model that serves `endpoint` (an llm before rag, for chat), as
    vLLM serves its one model."""
    if not model:
        model = await _only_model(triton, endpoint)
    config = await triton.config(checked_name(model))
    if config is None:   # not loaded when last asked (cached): loading, unloading, or loaded since?
        state = await _index_state(triton, model)
        if state in CHANGING:   # there, or gone, in a few seconds
            raise not_ready(f"model '{model}' is {state.lower()}; retry in a few seconds")
        if state == "READY":
            config = await triton.config(model, fresh=True)
    found = kind_of(config) if config is not None else None
    if found is None:
        raise model_not_found(model)
    if endpoint not in ENDPOINTS[found.kind]:
        raise APIError(400, f"model '{model}' serves {', '.join(ENDPOINTS[found.kind])}, not {endpoint}", "model")
    return found


async def _index_state(triton: Triton, model: str) -> str | None:
    """The model's state in Triton's repository index (READY, LOADING, UNLOADING; READY first among its
    versions), None where it is in none of them or Triton refuses the index."""
    states = [m.get("state") for m in await triton.recent_index() or () if m.get("name") == model]
    return next((state for state in ("READY", *CHANGING) if state in states), None)


def checked_name(name: str) -> str:
    """`name`, or 404 for one longer than any model's."""
    if len(name.encode()) > MAX_NAME_BYTES:
        raise model_not_found(name)
    return name


async def _only_model(triton: Triton, endpoint: str) -> str:
    """The one model that serves `endpoint` (cached as configs are: each lookup reads the repository index)."""
    cached = _ONLY.get(endpoint)
    if cached is not None and time.monotonic() - cached[0] < CONFIG_CACHE_S:
        return cached[1]
    serving = [found for found, _ in await _loaded(triton) if endpoint in ENDPOINTS[found.kind]]
    candidates = [found.name for found in ([f for f in serving if f.kind == "llm"] or serving)]
    if not candidates:
        if await triton.changing():   # perhaps the one it will be
            raise not_ready(f"model is missing, and no loaded model serves {endpoint} while Triton loads or unloads "
                            "one; retry in a few seconds")
        raise APIError(400, f"model is missing, and no loaded model serves {endpoint}", "model")
    if len(candidates) > 1:
        raise APIError(400, f"model is missing, and {len(candidates)} models serve {endpoint}: "
                            f"{', '.join(candidates[:20])}; name one", "model")
    _ONLY[endpoint] = (time.monotonic(), candidates[0])
    return candidates[0]


async def listing(triton: Triton) -> list[dict]:
    """The ready models the API serves, as OpenAI's model objects."""
    return [await described(triton, found.name, config) for found, config in await _loaded(triton)]


async def described(triton: Triton, name: str, config: dict) -> dict:
    """The model object of a served model: an llm's `max_model_len` from its config, rag's that of the llm
    it runs."""
    length = _max_model_len(config)
    if length is None and kind_of(config).kind == "rag":
        lengths = [_max_model_len(await triton.config(llm)) for llm in await triton.llms_behind(name)]
        length = next((n for n in lengths if n is not None), None)
    return model_object(name, length)


async def _loaded(triton: Triton) -> list[tuple[Served, dict]]:
    """The ready models the API serves, with their configs."""
    names = sorted({m["name"] for m in await triton.index() if m.get("state") == "READY"})
    configs = await asyncio.gather(*(triton.config(name) for name in names))
    return [(kind_of(config), config) for config in configs if config is not None and kind_of(config) is not None]


def _max_model_len(config: dict | None) -> int | None:
    length = (config or {}).get("parameters", {}).get("max_model_len", {}).get("string_value", "")
    return int(length) if length.isdigit() else None


def model_object(name: str, max_model_len: int | None = None) -> dict:
    """OpenAI's model object, with vLLM's `root`, `parent`, `permission` and, where known, `max_model_len`:
    clients size their context by it."""
    found = {"id": name, "object": "model", "created": CREATED, "owned_by": "ragstack", "root": name,
             "parent": None, "permission": []}
    return {**found, "max_model_len": max_model_len} if max_model_len is not None else found
