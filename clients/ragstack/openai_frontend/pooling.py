"""What embeddings and rerank share on the way to their ensemble: the tokenizer step's own checks done here
first (its `max_text_bytes`, read from its config, and no blank text), so that a refusal names the request's
field and its index in the request rather than the ensemble's tensor and an index within one batch; the
batches run beside their token counts (tokens.py); and the rule for a text longer than the model reads.
"""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Awaitable, Callable, TypeVar

import numpy as np
from starlette.requests import Request

from ragstack.openai_frontend import tokens
from ragstack.openai_frontend.disconnect import unless_gone
from ragstack.openai_frontend.errors import APIError
from ragstack.openai_frontend.frontend import Gate
from ragstack.openai_frontend.triton import Triton

T = TypeVar("T")


async def max_text_bytes(triton: Triton, model: str) -> int | None:
    """The `max_text_bytes` of the model's first step (backends/tokenizer); None for a model without one."""
    steps = (await triton.config(model) or {}).get("ensemble_scheduling", {}).get("step", [])
    first = await triton.config(steps[0]["model_name"]) if steps else None
    value = (first or {}).get("parameters", {}).get("max_text_bytes", {}).get("string_value")
    return int(value) if value else None


def check_texts(texts: list[tuple[str, str]], model: str, most_bytes: int | None) -> None:
    """Each (param, text) as the tokenizer step checks it, before any batch is sent."""
    for param, text in texts:
        size = len(text.encode("utf-8"))   # request_body.parse refused lone surrogates
        if most_bytes is None:
            continue
        if size > most_bytes:
            raise APIError(400, f"{param} is {size} bytes; model '{model}' reads at most {most_bytes} "
                                "(max_text_bytes)", param)
        if not text.strip():
            raise APIError(400, f"{param} is empty; every text needs at least one non-blank character", param)


@dataclass(frozen=True)
class Ran:
    outputs: list[dict[str, np.ndarray]]   # each batch's
    counts: np.ndarray | None   # tokens of each text as the model read it; None: not countable (tokens.py)
    truncated: np.ndarray   # each text cut at the model's limit (false where the model does not say)

    def used(self) -> int:
        return int(self.counts.sum()) if self.counts is not None else 0


async def run(request: Request, triton: Triton, model: str, batches: list[dict[str, np.ndarray]],
              params: dict[str, str], gate: Gate | None = None) -> Ran:
    """Every batch with its token counts; with a `gate`, each batch in flight holds a slot of this request's
    own and one of the worker's (Gate). The first batch that fails cancels the others, sent or waiting: the
    request's answer is its error, and the rest would only load the model (and its queue) for nothing."""
    own = asyncio.Semaphore(gate.size) if gate else None

    async def one(inputs: dict[str, np.ndarray]) -> tuple[dict, np.ndarray | None]:
        # the request's own slots first: its batches past them wait here, not among the worker's waiters
        async with own or contextlib.nullcontext(), gate.shared if gate else contextlib.nullcontext():
            return await _together(triton.infer(model, inputs, params), tokens.counts(triton, model, inputs, params))

    done = await unless_gone(request, _together(*(one(b) for b in batches)))
    counts = None if any(c is None for _, c in done) else np.concatenate([c for _, c in done])
    return Ran([o for o, _ in done], counts, np.concatenate([_truncated(o) for o, _ in done]))


async def _together(*work: Awaitable[T]) -> list[T]:
    """Every result of `work`, run side by side; the first failure cancels the rest and is raised as it is."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(w) for w in work]
    except BaseExceptionGroup as failed:
        raise _first(failed) from None
    return [task.result() for task in tasks]


def _first(failed: BaseException) -> BaseException:
    return _first(failed.exceptions[0]) if isinstance(failed, BaseExceptionGroup) else failed


def _truncated(outputs: dict[str, np.ndarray]) -> np.ndarray:
    """The model's `truncated` output; all false for a model without one (as many rows as its outputs)."""
    if "truncated" in outputs:
        return outputs["truncated"].reshape(-1).astype(bool)
    return np.zeros(len(next(iter(outputs.values()))), bool)


def check_cut(ran: Ran, cut: int | None, model: str, label: Callable[[int], str], must_ask: bool,
              param: Callable[[int], str] | None = None) -> None:
    """A text longer than the model reads is cut at its limit (`truncated`; its count is then that limit).
    `must_ask` (embeddings and score: vLLM refuses an input over the limit): only with truncate_prompt_tokens;
    the refusal names `param(i)` (default: the label). A `cut` below a text's count is refused: the
    tokenizer step cuts at the model's limit only."""
    if cut is not None and cut > 0 and ran.counts is not None:
        over = np.flatnonzero(ran.counts > cut)
        if over.size:
            i = int(over[0])
            limit = f", its limit ({ran.counts[i]} tokens)" if ran.truncated[i] else ""
            raise APIError(400, f"truncate_prompt_tokens: {label(i)} keeps {ran.counts[i]} tokens, more than "
                                f"{cut}; model '{model}' cuts only at its own limit{limit}: send -1 to cut there",
                           "truncate_prompt_tokens")
    if must_ask and cut is None and ran.truncated.any():
        i = int(np.flatnonzero(ran.truncated)[0])
        limit = f" ({ran.counts[i]} tokens)" if ran.counts is not None else ""
        raise APIError(400, f"{label(i)} is longer than model '{model}' reads{limit}; send truncate_prompt_tokens: "
                            "-1 to have it cut there", (param or label)(i))
