"""`POST /v1/chat/completions`: an llm model, which applies its chat template to the messages, or a
rag model, which answers the last user message from the index and returns its sources in the
extension field `sources` (on the message; streaming, on each choice's first chunk's delta):
`[{"n": 1, "source": "faiss.html", "passage_id": "...", "score": 0.61}, ...]`, `n` the citation
number `[n]` in the answer. `rag` returns no token counts: its `usage` is null."""
from __future__ import annotations

import time
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ragstack.openai_frontend import generation, metrics, models, streaming
from ragstack.openai_frontend.disconnect import unless_gone
from ragstack.openai_frontend.errors import APIError
from ragstack.openai_frontend.frontend import Frontend
from ragstack.openai_frontend.generation import Piece
from ragstack.openai_frontend.logprobs import chat_content
from ragstack.openai_frontend.request_body import parse
from ragstack.openai_frontend.schemas import SAMPLING_KEYS, ChatRequest
from ragstack.openai_frontend.usage import Usage


async def chat_completions(request: Request, frontend: Frontend) -> Response:
    body = await parse(request, ChatRequest, frontend.limits)
    served = await models.served(frontend.triton, body.model, "chat.completions")
    metrics.served_model(request, served.name)
    messages = body.chat(frontend.limits)
    sampling = body.sampling()
    params = {**{key: key for key in SAMPLING_KEYS}, "messages": "messages", "text_input": "messages",
              "prompt": "messages", "query": "messages", "logprobs": "top_logprobs",
              "max_tokens": "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"}
    if served.kind == "rag":
        if body.logprobs:
            raise APIError(400, f"logprobs are not available from model '{served.name}' (rag returns text and "
                                "sources)", "logprobs")
        query = next((m["content"] for m in reversed(messages) if m["role"] == "user"), None)
        if query is None:
            raise APIError(400, f"model '{served.name}' answers the last user message, and there is none", "messages")
        requests = [generation.Request(served.name, generation.rag_inputs(query, s, body.stream), params, rag=True)
                    for s in generation.seeded(sampling, body.n)]
    else:
        top = sampling.get("logprobs") if body.logprobs else None
        requests = [generation.Request(served.name, generation.llm_inputs(messages, s, body.stream, body.logprobs),
                                       params, top_logprobs=top) for s in generation.seeded(sampling, body.n)]
    usage = Usage(served.kind != "rag", prompts=1, n=body.n)
    answer = Answer(f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), served.name, usage,
                    body.stream_options is not None and body.stream_options.include_usage)
    if body.stream:
        return await streaming.answer(request, generation.merged(frontend.triton, requests), len(requests), answer)
    choices = await unless_gone(request, generation.collected(frontend.triton, requests))
    return JSONResponse(answer.whole(choices))


class Answer:
    """The answer's JSON: whole, or chunk by chunk."""

    def __init__(self, completion_id: str, created: int, model: str, usage: Usage, usage_chunk: bool):
        self.head = {"id": completion_id, "created": created, "model": model}
        self.usage, self.usage_chunk = usage, usage_chunk
        self._started: set[int] = set()

    def whole(self, choices: list[Piece]) -> dict:
        for index, choice in enumerate(choices):
            self.usage.add(index, choice.prompt_tokens, choice.completion_tokens)
        return {**self.head, "object": "chat.completion", "choices": [{
            "index": index, "message": {"role": "assistant", "content": choice.text,
                                        **({"sources": choice.sources} if choice.sources is not None else {})},
            "logprobs": {"content": chat_content(choice.logprobs)} if choice.logprobs is not None else None,
            "finish_reason": choice.finish_reason} for index, choice in enumerate(choices)],
            "usage": self.usage.as_dict()}

    def piece(self, index: int, piece: Piece) -> dict | None:
        self.usage.add(index, piece.prompt_tokens, piece.completion_tokens)
        delta = {}
        if index not in self._started:
            self._started.add(index)
            delta["role"] = "assistant"
        if piece.text or "role" in delta:
            delta["content"] = piece.text
        if piece.sources is not None:
            delta["sources"] = piece.sources
        if not delta and piece.finish_reason is None and not piece.logprobs:
            return None
        return self._chunk([{"index": index, "delta": delta,
                             "logprobs": {"content": chat_content(piece.logprobs)} if piece.logprobs else None,
                             "finish_reason": piece.finish_reason}])

    def end(self) -> list[dict]:
        return [self._chunk([], self.usage.as_dict())] if self.usage_chunk else []

    def _chunk(self, choices: list[dict], usage: dict | None = None) -> dict:
        chunk = {**self.head, "object": "chat.completion.chunk", "choices": choices}
        if self.usage_chunk:
            chunk["usage"] = usage
        return chunk
