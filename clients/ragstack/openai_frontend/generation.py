"""Choices: one llm or `rag` request each, read as Pieces; n of them run at once.

An llm request is cancelled by closing its gRPC stream (Triton cancels it, the llm frees its KV). Triton
2.51's ensemble does not pass a mid-stream cancellation to rag_generate's running step, so a `rag`
request also carries a cancel key, and a choice given up sends the llm behind it an abort by that key.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np

from ragstack.openai_frontend import triton as t
from ragstack.openai_frontend.errors import APIError
from ragstack.openai_frontend.limits import LLM_JSON_BYTES, LLM_JSON_DEPTH
from ragstack.openai_frontend.logprobs import Matcher, TokenLogprob
from ragstack.openai_frontend.models import Served
from ragstack.openai_frontend.triton import Triton

CANCEL_KEY, ABORT_KEY = "ragstack_cancel_key", "ragstack_abort"   # backends/triton_llm/llm_request.py
OWN_RETURNS = ("return_stop_reason",)   # asked of every model that declares it, vllm_backend's flags of all
_ABORTS: set[asyncio.Task] = set()   # aborts under way: asyncio keeps only weak references to tasks


@dataclass
class Piece:
    """What one response adds to a choice; pieces added up (`add`) are the whole choice."""
    text: str = ""
    finish_reason: str | None = None
    stop_reason: int | str | None = None   # vLLM's: the stop string or stop token id that ended the choice
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list | None = None   # the llm's prompt_logprobs output (vLLM's shape), on the first piece
    sources: list[dict] | None = None

    def add(self, piece: Piece) -> None:
        self.text += piece.text
        self.finish_reason = piece.finish_reason or self.finish_reason
        self.stop_reason = piece.stop_reason if piece.stop_reason is not None else self.stop_reason
        self.prompt_tokens = piece.prompt_tokens if piece.prompt_tokens is not None else self.prompt_tokens
        self.completion_tokens += piece.completion_tokens
        if piece.logprobs is not None:
            self.logprobs = (self.logprobs or []) + piece.logprobs
        self.sources = piece.sources if piece.sources is not None else self.sources
        self.prompt_logprobs = self.prompt_logprobs if self.prompt_logprobs is not None else piece.prompt_logprobs


def _text(outputs: dict, name: str) -> str:
    value = outputs.get(name)
    if value is None:
        return ""
    return "".join(v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v) for v in value.reshape(-1))


def _count(outputs: dict, name: str) -> int | None:
    value = outputs.get(name)
    return int(np.asarray(value).reshape(-1)[0]) if value is not None and value.size else None


def _piece(outputs: dict, matcher: Matcher | None) -> Piece:
    text = _text(outputs, "text_output")
    reason = _text(outputs, "finish_reason")
    sources = _text(outputs, "sources")
    raw, raw_prompt = outputs.get("logprobs"), outputs.get("prompt_logprobs")
    stop_reason = _text(outputs, "stop_reason")
    return Piece(text=text, finish_reason=reason if reason not in ("", "None") else None,
                 stop_reason=json.loads(stop_reason) if stop_reason else None,
                 prompt_tokens=_count(outputs, "num_input_tokens"),
                 completion_tokens=_count(outputs, "num_output_tokens") or 0,
                 logprobs=matcher.add(raw.reshape(-1)[0], text) if matcher is not None and raw is not None else None,
                 prompt_logprobs=json.loads(raw_prompt.reshape(-1)[0]) if raw_prompt is not None else None,
                 sources=json.loads(sources) if sources else None)


@dataclass
class Request:
    """One choice's request: the model, its input tensors, and the request fields its errors may name."""
    model: str
    inputs: dict[str, np.ndarray]
    params: dict[str, str]
    top_logprobs: int | None = None   # set: the llm returns logprobs
    rag: bool = False


def llm_inputs(prompt_or_messages: str | list[int] | list[dict], sampling: dict, stream: bool, logprobs: bool,
               prompt_logprobs: bool = False, tools: np.ndarray | None = None,
               template_kwargs: dict | None = None) -> dict:
    """A text prompt, a prompt of token ids, or chat messages; `tools`: the llm's `tools` input (JSON of
    OpenAI tools) for its chat template, with messages, and `template_kwargs` its chat_template_kwargs input;
    `prompt_logprobs`: the prompt's scores too."""
    if isinstance(prompt_or_messages, str):
        inputs = {"text_input": t.text(prompt_or_messages)}
    elif isinstance(prompt_or_messages[0], int):
        inputs = {"prompt_token_ids": np.array(prompt_or_messages, dtype=np.int32)}
    else:
        inputs = {"messages": t.text(json.dumps(prompt_or_messages, ensure_ascii=False))}
    if tools is not None:
        inputs["tools"] = tools
    if template_kwargs is not None:
        inputs["chat_template_kwargs"] = t.text(json.dumps(template_kwargs, ensure_ascii=False))
    inputs.update(stream=t.flag(stream), sampling_parameters=t.text(json.dumps(sampling)),
                  exclude_input_in_output=t.flag(True), return_finish_reason=t.flag(True),
                  return_num_input_tokens=t.flag(True), return_num_output_tokens=t.flag(True),
                  return_stop_reason=t.flag(True))
    if logprobs:
        inputs["return_logprobs"] = t.flag(True)
    if prompt_logprobs:
        inputs["return_prompt_logprobs"] = t.flag(True)
    return inputs


def rag_inputs(query: str, sampling: dict, stream: bool) -> dict:
    """The rag ensemble's inputs; it relays the llm's token counts and stop reason when asked, as the llm
    sends them."""
    return {"query": t.text(query), "stream": t.flag(stream), "sampling_parameters": t.text(json.dumps(sampling)),
            "return_num_input_tokens": t.flag(True), "return_num_output_tokens": t.flag(True),
            "return_stop_reason": t.flag(True)}


def declared(inputs: dict, served: Served) -> dict:
    """The inputs without this project's own return flags that the model does not declare (a model of one's
    own, or a Triton not yet upgraded beside this frontend): Triton refuses an input its model lacks."""
    return {name: value for name, value in inputs.items() if name not in OWN_RETURNS or name in served.inputs}


def check_sampling_size(sampling: dict, asked: dict, constrained_by: str | None) -> None:
    """The llm's sampling_parameters input within its JSON limits, else a 400 naming the field: one nested
    too deep, or the largest; a key of `asked` (the request's own sampling fields) by its name, any other
    (the output constraint's keys) by `constrained_by`."""
    for key, value in sampling.items():
        if _depth(value) > LLM_JSON_DEPTH - 2:   # the object holding it, and the value itself, are two levels
            param = key if key in asked or constrained_by is None else constrained_by
            raise APIError(400, f"{param} nests {_depth(value)} levels of lists and objects; the llm takes at most "
                                f"{LLM_JSON_DEPTH - 2} (its sampling_parameters input)", param)
    size = len(json.dumps(sampling).encode())
    if size > LLM_JSON_BYTES:
        largest = max(sampling, key=lambda key: len(json.dumps(sampling[key]).encode()))
        param = largest if largest in asked or constrained_by is None else constrained_by
        raise APIError(400, f"the sampling fields take {size} bytes of JSON, {param} the most; the llm takes at "
                            f"most {LLM_JSON_BYTES} (its sampling_parameters input)", param)


def _depth(value) -> int:
    """Levels below a JSON value: 0 for a scalar or an empty list or object (the request's own depth limit
    bounds the recursion). Counted on the value, not with gateway.json_depth on its text: the llm's parser
    counts a scalar as a level of its own, and a count of brackets cannot tell a scalar from an empty list."""
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
    return 0 if not children else 1 + max(map(_depth, children))


def seeded(sampling: dict, n: int) -> list[dict]:
    """n choices' sampling keys: with a seed, seed + i for choice i, so they differ and repeat (wrapping
    within int64's range, which the llm takes, so any valid seed works with any n)."""
    seed = sampling.get("seed")
    if seed is None:
        return [sampling] * n
    if isinstance(seed, int) and not -2**63 <= seed < 2**63:   # refused before wrapping turns it into another
        given = str(seed) if len(str(seed)) <= 40 else f"{str(seed)[:37]}..."
        raise APIError(400, f"seed must fit in 64 bits ({-2**63} to {2**63 - 1}), got {given}", "seed")
    return [{**sampling, "seed": (seed + i + 2**63) % 2**64 - 2**63} for i in range(n)]


async def pieces(triton: Triton, request: Request) -> AsyncIterator[Piece]:
    matcher = Matcher(request.top_logprobs) if request.top_logprobs is not None else None
    key = uuid.uuid4().hex if request.rag else None
    try:
        async with contextlib.aclosing(triton.stream(request.model, request.inputs,
                                                     {CANCEL_KEY: key} if key else None, request.params)) as responses:
            async for outputs in responses:
                yield _piece(outputs, matcher)
    except (asyncio.CancelledError, GeneratorExit):
        if key is not None:
            task = asyncio.get_running_loop().create_task(_abort(triton, request.model, key))
            _ABORTS.add(task)
            task.add_done_callback(_ABORTS.discard)
        raise


async def _abort(triton: Triton, model: str, key: str) -> None:
    """An llm request of ours without inputs, naming the key: the llm behind `model` aborts that request."""
    with contextlib.suppress(APIError):   # Triton going away: nothing left to abort
        for llm in await triton.llms_behind(model):
            async for _ in triton.stream(llm, {}, {ABORT_KEY: key}):
                pass


async def merged(triton: Triton, requests: list[Request]) -> AsyncIterator[list[tuple[int, Piece]]]:
    """Every choice's pieces as they come, with the choice's index, in batches: a batch holds every piece
    that came while its consumer was busy with the one before (at least one piece), in order, so a consumer
    that falls behind catches up in one step (streaming.py sends a batch as one write). The first error
    ends them all and is raised after the pieces before it; closing the iterator cancels every choice
    still running."""
    queue: asyncio.Queue = asyncio.Queue()

    async def run(index: int, request: Request) -> None:
        async for piece in pieces(triton, request):
            queue.put_nowait((index, piece))

    tasks = [asyncio.ensure_future(run(i, r)) for i, r in enumerate(requests)]
    for task in tasks:
        task.add_done_callback(queue.put_nowait)
    running = len(tasks)
    try:
        while running:
            batch, error = [], None
            item = await queue.get()
            while True:
                if isinstance(item, asyncio.Future):
                    running -= 1
                    if not item.cancelled() and item.exception() is not None:
                        error = item.exception()
                        break
                else:
                    batch.append(item)
                if queue.empty():
                    break
                item = queue.get_nowait()
            if batch:
                yield batch
            if error is not None:
                raise error
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def coalesced(batch: list[tuple[int, Piece]]) -> list[tuple[int, Piece]]:
    """A batch's pieces with each choice's added up into one (in the order the choices first came), as
    vLLM merges the deltas a slow reader has not taken yet: the same text, counts and logprobs in fewer
    chunks."""
    if len(batch) == 1:
        return batch
    by_choice: dict[int, Piece] = {}
    copied: set[int] = set()   # the pieces themselves stay as they came
    for index, piece in batch:
        whole = by_choice.get(index)
        if whole is None:
            by_choice[index] = piece
            continue
        if index not in copied:
            copied.add(index)
            by_choice[index] = Piece()
            by_choice[index].add(whole)
        by_choice[index].add(piece)
    return list(by_choice.items())


async def collected(triton: Triton, requests: list[Request]) -> list[Piece]:
    """Each choice whole."""
    choices = [Piece() for _ in requests]
    async with contextlib.aclosing(merged(triton, requests)) as stream:
        async for batch in stream:
            for index, piece in batch:
                choices[index].add(piece)
    return choices
