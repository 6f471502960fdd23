"""`POST /v1/chat/completions`: an llm model, which applies its chat template to the messages, or a
rag model, which answers the last user message from the index and returns its sources in the
extension field `sources` (on the message; streaming, on each choice's first chunk's delta):
`[{"n": 1, "source": "faiss.html", "passage_id": "...", "score": 0.61}, ...]`, `n` the citation
number `[n]` in the answer. `usage` counts the llm's tokens behind rag too: the prompt it was given (the
retrieved passages with the question) and the answer.

`response_format` and vLLM's guided_* keys constrain an llm's output (structured.py); `tools` reach its
chat template and its answer is read for tool calls (tools.py, tool_parsers.py): `message.tool_calls`,
`tool_calls` in stream deltas, finish_reason `tool_calls`. Every choice carries vLLM's `stop_reason`: the stop
string or stop token id that ended it, else null (streamed: on the chunk with its finish_reason, null before)."""
from __future__ import annotations

import time
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ragstack.openai_frontend import generation, metrics, models, streaming, structured, tool_parsers, tools
from ragstack.openai_frontend.disconnect import unless_gone
from ragstack.openai_frontend.errors import APIError
from ragstack.openai_frontend.frontend import Frontend
from ragstack.openai_frontend.generation import Piece
from ragstack.openai_frontend.logprobs import chat_content, vllm_prompt_logprobs
from ragstack.openai_frontend.request_body import parse
from ragstack.openai_frontend.schemas import SAMPLING_KEYS, ChatRequest
from ragstack.openai_frontend.tool_parsers import Reader, collect
from ragstack.openai_frontend.tools import ToolPlan
from ragstack.openai_frontend.usage import Usage


async def chat_completions(request: Request, frontend: Frontend) -> Response:
    body = await parse(request, ChatRequest, frontend.limits)
    served = await models.served(frontend.triton, body.model, "chat.completions")
    metrics.served_model(request, served.name)
    messages = body.chat(frontend.limits)
    tool_plan = tools.plan(body.tools, body.tool_choice, body.parallel_tool_calls)
    if tool_plan is not None and served.kind != "rag":
        await tools.resolve(frontend, served.name, tool_plan)   # auto's format, which its strict constraint needs
    asked = body.sampling()
    sampling, constrained_by = structured.constrained(
        asked, body.model_extra, body.response_format, tool_plan.constraint() if tool_plan else {},
        "tool_choice", tool_plan.strict_constraint() if tool_plan else {}, "tools")
    if tool_plan is not None and served.kind != "rag":
        sampling = {**tool_plan.sampling(), **sampling}   # the request's own keys win
        tool_plan.structural = constrained_by == "tools"   # strict tools' tag holds the answer (not one of its own)
    params = {**{key: key for key in (*SAMPLING_KEYS, *asked)}, "messages": "messages", "text_input": "messages",
              "prompt": "messages", "query": "messages", "text": "messages", "logprobs": "top_logprobs",
              "tools": "tools", "chat_template_kwargs": "chat_template_kwargs",
              "max_tokens": "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens",
              **{word: constrained_by for word in structured.PARAM_WORDS if constrained_by}}
    generation.check_sampling_size(sampling, asked, constrained_by)
    prompt_logprobs = body.returns_prompt_logprobs()
    if served.kind == "rag":
        for name, value in (("logprobs", body.logprobs), ("prompt_logprobs", prompt_logprobs)):
            if value:
                raise APIError(400, f"{name} are not available from model '{served.name}' (rag returns text and "
                                    "sources)", name)
        # A constraining response_format is constrained_by; {"type": "text"} (OpenAI's default) constrains nothing.
        given = [name for name, value in (("tools", body.tools), (constrained_by, constrained_by)) if value is not None]
        for name in given + body.template_fields():
            raise APIError(400, f"{name} is not available from model '{served.name}' (rag answers with text and "
                                "sources)", name)
        at, query = _question(served.name, messages)
        params = {**params, "query": f"messages[{at}].content", "text": f"messages[{at}].content"}
        requests = [generation.Request(served.name, generation.declared(generation.rag_inputs(query, s, body.stream),
                                                                      served), params, rag=True)
                    for s in generation.seeded(sampling, body.n)]
    else:
        top = sampling.get("logprobs") if body.logprobs else None
        # The choices share the prompt: the first alone scores it for the answer's prompt_logprobs.
        choices = [s if i == 0 else {k: v for k, v in s.items() if k != "prompt_logprobs"}
                   for i, s in enumerate(generation.seeded(sampling, body.n))]
        requests = [generation.Request(served.name, generation.declared(generation.llm_inputs(
                        messages, s, body.stream, body.logprobs, prompt_logprobs and i == 0, tools.llm_tools(tool_plan),
                        body.template_kwargs()), served), params, top_logprobs=top) for i, s in enumerate(choices)]
    usage = Usage(True, prompts=1, n=body.n)
    answer = Answer(f"chatcmpl-{body.request_id or uuid.uuid4().hex}", int(time.time()), served.name, usage,
                    *body.usage_chunks(), tool_plan, prompt_logprobs)
    if body.stream:
        return await streaming.answer(request, generation.merged(frontend.triton, requests), len(requests), answer,
                                      frontend.limits.write_timeout_s)
    choices = await unless_gone(request, generation.collected(frontend.triton, requests))
    return JSONResponse(answer.whole(choices))


def _question(model: str, messages: list[dict]) -> tuple[int, str]:
    """The last user message's place and text: what a rag model answers."""
    at = next((i for i in reversed(range(len(messages))) if messages[i]["role"] == "user"), None)
    if at is None:
        raise APIError(400, f"model '{model}' answers the last user message, and there is none", "messages")
    query = messages[at]["content"] or ""
    if not query.strip():
        raise APIError(400, f"messages[{at}].content is blank; model '{model}' answers it as the question, so it "
                            "needs at least one non-blank character", f"messages[{at}].content")
    return at, query


class Answer:
    """The answer's JSON: whole, or chunk by chunk. With tools, each choice's text goes through a
    tool-call reader (`tool_plan.reader()`): content and tool calls."""

    def __init__(self, completion_id: str, created: int, model: str, usage: Usage, usage_chunk: bool,
                 usage_always: bool = False, tool_plan: ToolPlan | None = None, prompt_logprobs: bool = False):
        """`usage_chunk`: a last chunk with the usage; `usage_always`: the usage so far on every chunk too;
        `prompt_logprobs`: the answer carries vLLM's `prompt_logprobs` field (the choices share the prompt)."""
        self.head = {"id": completion_id, "created": created, "model": model, "system_fingerprint": None}
        self.usage, self.usage_chunk, self.usage_always = usage, usage_chunk, usage_always
        self.tool_plan = tool_plan
        self.prompt_logprobs = prompt_logprobs
        self._started: set[int] = set()
        self._readers: dict[int, Reader] = {}

    def whole(self, choices: list[Piece]) -> dict:
        out = []
        for index, choice in enumerate(choices):
            self.usage.add(index, choice.prompt_tokens, choice.completion_tokens)
            message = {"role": "assistant", "content": choice.text, "refusal": None}
            reason = choice.finish_reason
            if self.tool_plan is not None:
                content, calls = collect(self.tool_plan.reader(), choice.text)
                message["content"] = content if content or not calls else None
                if calls:
                    message["tool_calls"] = calls
                    reason = _finish_reason(reason, choice.stop_reason, self.tool_plan)
            if choice.sources is not None:
                message["sources"] = choice.sources
            out.append({"index": index, "message": message,
                        "logprobs": {"content": chat_content(choice.logprobs)} if choice.logprobs is not None else None,
                        "finish_reason": reason, "stop_reason": choice.stop_reason})
        answer = {**self.head, "object": "chat.completion", "choices": out, "usage": self.usage.as_dict()}
        if self.prompt_logprobs:
            answer["prompt_logprobs"] = vllm_prompt_logprobs(choices[0].prompt_logprobs or [])
        return answer

    def piece(self, index: int, piece: Piece) -> list[dict]:
        """A choice's first piece is preceded by a chunk of its role alone (with rag's sources), as OpenAI
        and vLLM start each choice."""
        self.usage.add(index, piece.prompt_tokens, piece.completion_tokens)
        chunks = []
        if index not in self._started:
            self._started.add(index)
            start = {"role": "assistant", "content": ""}
            if piece.sources is not None:
                start["sources"] = piece.sources
            chunks.append(self._chunk([{"index": index, "delta": start, "logprobs": None, "finish_reason": None,
                                        "stop_reason": None}],
                                      self.usage.of_choice(index, self.usage_always, started=False)))
        delta = {}
        text, calls, reason = piece.text, [], piece.finish_reason
        if self.tool_plan is not None:
            reader = self._readers.setdefault(index, self.tool_plan.reader())
            read = reader.feed(piece.text)
            if piece.finish_reason is not None:
                read.add(reader.finish())
            text, calls = read.content, read.tool_calls
            if reason is not None and reader.calls:
                reason = _finish_reason(reason, piece.stop_reason, self.tool_plan)
        if text:
            delta["content"] = text
        if calls:
            delta["tool_calls"] = tool_parsers.joined(calls)
        if delta or reason is not None or piece.logprobs:
            chunks.append(self._chunk([{"index": index, "delta": delta, "finish_reason": reason,
                                        "stop_reason": piece.stop_reason,
                                        "logprobs": {"content": chat_content(piece.logprobs)} if piece.logprobs
                                        else None}], self.usage.of_choice(index, self.usage_always)))
        return chunks

    def end(self) -> list[dict]:
        return [self._chunk([], self.usage.as_dict(), last=True)] if self.usage_chunk else []

    def _chunk(self, choices: list[dict], usage: dict | None, last: bool = False) -> dict:
        """`usage`: what the chunk carries with continuous usage (the choice's own, as vLLM), or the last's."""
        chunk = {**self.head, "object": "chat.completion.chunk", "choices": choices}
        if self.usage_chunk:
            chunk["usage"] = usage if last or self.usage_always else None
        return chunk


def _finish_reason(reason: str | None, stop_reason: int | str | None, plan: ToolPlan) -> str | None:
    """A choice that called tools ends with `tool_calls`, except a named function's, which keeps `stop` as in
    OpenAI's and vLLM's answers. One cut at max_tokens keeps `length`, and a required call that a stop string
    or stop token cut keeps `stop`: that call is not whole (auto's reader takes whole calls only)."""
    cut = stop_reason is not None and plan.choice == "required"
    return "tool_calls" if reason == "stop" and not cut and plan.choice != "function" else reason
