"""What the frontend answers while Triton loads or unloads a model, against a Triton whose repository index and
configs this test sets (no server: the index's states are hard to catch in flight): 503 with Retry-After while a
model changes, a model loaded since its config was cached served at once, one index read shared by every
request that needs it, and a model a request's model runs missing for good a 500 naming it."""
from __future__ import annotations

import asyncio

import pytest

from ragstack.openai_frontend import models
from ragstack.openai_frontend.errors import APIError
from ragstack.openai_frontend.triton import Triton

LLM_CONFIG = {"name": "llm", "backend": "triton_llm", "input": [{"name": "text_input"}, {"name": "messages"}],
              "output": [{"name": "text_output"}]}


class StagedTriton(Triton):
    """Triton's client calls answered from `states` (the index) and `configs`, counting the index reads."""

    def __init__(self, states: dict[str, str], configs: dict[str, dict] | None = None, refuse: bool = False):
        super().__init__("127.0.0.1:1", None)
        self.states, self.configs, self.refuse, self.index_reads = states, configs or {}, refuse, 0

    async def index(self) -> list[dict]:
        self.index_reads += 1
        await asyncio.sleep(0.01)
        if self.refuse:
            raise APIError(403, "the repository index needs the admin key")
        return [{"name": name, "version": "1", "state": state} for name, state in self.states.items()]

    async def _fetch_config(self, model: str) -> dict | None:
        self._configs[model] = (0.0, self.configs.get(model))
        return self.configs.get(model)


def run(body, *args):
    """body(*args) in an event loop of its own (Triton's gRPC client needs one to be made)."""
    return asyncio.run(body(*args))


async def refused_by(states: dict[str, str], model: str | None) -> APIError:
    return await _refused(StagedTriton(states), model)


@pytest.mark.parametrize("state, word", [("LOADING", "loading"), ("UNLOADING", "unloading")])
def test_a_model_changing_is_503_with_retry_after(state, word):
    error = run(refused_by, {"llm": state}, "llm")
    assert (error.status, error.code, error.message) == (503, "unavailable",
                                                         f"model 'llm' is {word}; retry in a few seconds")
    assert error.response().headers["retry-after"] == "5"


def test_an_unknown_or_unavailable_model_is_404():
    for states in ({}, {"llm": "UNAVAILABLE"}):
        assert run(refused_by, states, "llm").status == 404


def test_a_model_loaded_since_its_config_was_cached_is_served_at_once():
    async def scenario():
        triton = StagedTriton({"llm": "LOADING"})
        assert (await _refused(triton, "llm")).status == 503   # its config cached as absent meanwhile
        triton.states["llm"], triton.configs["llm"] = "READY", LLM_CONFIG
        await asyncio.sleep(0.3)   # the index read again
        return await models.served(triton, "llm", "chat.completions")
    assert run(scenario).kind == "llm"


def test_one_index_read_serves_a_burst_and_a_refusal_is_kept():
    async def burst(refuse: bool):
        triton = StagedTriton({}, refuse=refuse)
        errors = await asyncio.gather(*(_refused(triton, "gpt-4o") for _ in range(200)))
        return {e.status for e in errors}, triton.index_reads
    assert run(burst, False) == ({404}, 1)
    assert run(burst, True) == ({404}, 1)


def test_no_model_named_while_the_only_one_loads_is_503():
    error = run(refused_by, {"llm": "LOADING"}, None)
    assert (error.status, error.code) == (503, "unavailable") and "while Triton loads or unloads" in error.message


@pytest.mark.parametrize("states, status", [({"rag": "READY", "llm": "LOADING"}, 503), ({"rag": "READY"}, 500)])
def test_a_model_a_request_runs_missing_is_503_while_one_changes_else_500(states, status):
    async def ran(failure: APIError) -> APIError:
        return await StagedTriton(states)._ran("rag", failure)
    missing = APIError(404, "Request for unknown model: 'llm' is not found", "model", "model_not_found")
    error = run(ran, missing)
    assert error.status == status and "'llm' is not found" in error.message and error.param is None
    other = APIError(400, "top_p must be in (0, 1], got 2", "top_p")
    assert run(ran, other) is other


async def _refused(triton: Triton, model: str | None) -> APIError:
    with pytest.raises(APIError) as refused:
        await models.served(triton, model, "chat.completions")
    return refused.value
