"""`POST /v1/completions`: an llm model on a prompt used as it is (no chat template), text or token
ids; a list of prompts gives n choices each, prompt by prompt. `echo` puts the prompt before the answer
(token ids decoded, by the llm: it scores the prompt for their text), and with `logprobs` its tokens'
logprobs before the answer's, the first token's null (as OpenAI and vLLM answer lm-eval's loglikelihood
requests); with `max_tokens` 0 it answers the prompt alone (vLLM's and OpenAI's scoring form). vLLM's
`prompt_logprobs` N adds its field to each choice. `response_format` and vLLM's guided_*
keys constrain the output (structured.py). Every choice carries vLLM's `stop_reason`, as in chat.py."""
from __future__ import annotations

import time
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ragstack.openai_frontend import generation, metrics, models, streaming, structured
from ragstack.openai_frontend.disconnect import unless_gone
from ragstack.openai_frontend.errors import APIError
from ragstack.openai_frontend.frontend import Frontend
from ragstack.openai_frontend.generation import Piece
from ragstack.openai_frontend.logprobs import (
    TokenLogprob,
    completion_logprobs,
    prompt_scores,
    vllm_prompt_logprobs,
)
from ragstack.openai_frontend.request_body import parse
from ragstack.openai_frontend.schemas import SAMPLING_KEYS, CompletionRequest
from ragstack.openai_frontend.usage import Usage


async def completions(request: Request, frontend: Frontend) -> Response:
    body = await parse(request, CompletionRequest, frontend.limits)
    served = await models.served(frontend.triton, body.model, "completions")
    metrics.served_model(request, served.name)
    prompts = body.prompts(frontend.limits)
    asked = body.sampling()
    sampling, constrained_by = structured.constrained(asked, body.model_extra, body.response_format, {}, None)
    generation.check_sampling_size(sampling, asked, constrained_by)
    params = {**{key: key for key in (*SAMPLING_KEYS, *asked)}, "prompt": "prompt", "text_input": "prompt",
              "prompt_token_ids": "prompt", "logprobs": "logprobs",
              **{word: constrained_by for word in structured.PARAM_WORDS if constrained_by}}
    logprobs = body.logprobs is not None
    vllm_field = body.returns_prompt_logprobs()
    if logprobs and body.echo and not vllm_field:
        params["prompt_logprobs"] = "logprobs"
    requests = [generation.Request(served.name, generation.declared(llm_inputs(body, prompt, s, vllm_field), served),
                                   params, top_logprobs=body.logprobs)
                for prompt in prompts for s in generation.seeded(sampling, body.n)]
    answer = Answer(f"cmpl-{body.request_id or uuid.uuid4().hex}", int(time.time()), served.name,
                    [p if isinstance(p, str) else None for p in prompts for _ in range(body.n)] if body.echo
                    else None,
                    Usage(True, prompts=len(prompts), n=body.n), *body.usage_chunks(), body.logprobs, vllm_field,
                    body.echo_only(), cut_to(sampling))
    if body.stream:
        return await streaming.answer(request, generation.merged(frontend.triton, requests), len(requests), answer,
                                      frontend.limits.write_timeout_s)
    choices = await unless_gone(request, generation.collected(frontend.triton, requests))
    return JSONResponse(answer.whole(choices))


def llm_inputs(body: CompletionRequest, prompt: str | list[int], sampling: dict, vllm_field: bool) -> dict:
    """The llm's inputs for one prompt: the prompt's scores asked for where the answer shows them (`vllm_field`,
    echo with logprobs: as many as `logprobs`, vLLM's rule) or where echoing needs the prompt's tokens' text (token
    ids, or a prompt cut to its last tokens)."""
    echo_scored = body.echo and (body.logprobs is not None or not isinstance(prompt, str)
                                 or cut_to(sampling) is not None)
    if echo_scored and sampling.get("prompt_logprobs") is None:
        sampling = {**sampling, "prompt_logprobs": body.logprobs or 0}
    return generation.llm_inputs(prompt, sampling, body.stream, body.logprobs is not None, vllm_field or echo_scored)


def cut_to(sampling: dict) -> int | None:
    """vLLM's `truncate_prompt_tokens` k where it may cut: the llm reads only a prompt's last k tokens, and echo
    shows those (-1, max_model_len of them, cuts no prompt the llm takes)."""
    keep = sampling.get("truncate_prompt_tokens")
    return keep if isinstance(keep, int) and keep >= 1 else None


class Answer:
    """The answer's JSON: whole, or chunk by chunk."""

    def __init__(self, completion_id: str, created: int, model: str, echoed: list[str | None] | None,
                 usage: Usage, usage_chunk: bool, usage_always: bool = False, top_logprobs: int | None = None,
                 prompt_logprobs: bool = False, echo_only: bool = False, cut_to: int | None = None):
        """`echoed`: per choice, the text prompt to put first (None: token ids, decoded by the llm); `usage_chunk`:
        a last chunk with the usage, `usage_always`: the usage so far on every chunk too; `top_logprobs`: the
        request's `logprobs`; `prompt_logprobs`: each choice carries vLLM's field; `echo_only`: the generated
        token is left out (echo with max_tokens 0); `cut_to`: truncate_prompt_tokens, where it may cut."""
        self.head = {"id": completion_id, "object": "text_completion", "created": created, "model": model,
                     "system_fingerprint": None}
        self.echoed, self.usage, self.usage_chunk, self.usage_always = echoed, usage, usage_chunk, usage_always
        self.top_logprobs, self.prompt_logprobs, self.echo_only = top_logprobs, prompt_logprobs, echo_only
        self.cut_to = cut_to
        self._token_at: dict[int, int] = {}   # per choice started: where its next token starts in its text

    def whole(self, choices: list[Piece]) -> dict:
        out = []
        for index, choice in enumerate(choices):
            choice = self._shown(choice)
            self.usage.add(index, choice.prompt_tokens, choice.completion_tokens)
            echo, prompt_tokens = self._echo(index, choice)
            logprobs = None
            if choice.logprobs is not None:
                logprobs = completion_logprobs(choice.logprobs, len(echo), prompt_tokens, echo)
            out.append({"index": index, "text": echo + choice.text, "logprobs": logprobs,
                        "finish_reason": choice.finish_reason, "stop_reason": choice.stop_reason})
            if self.prompt_logprobs:
                out[-1]["prompt_logprobs"] = vllm_prompt_logprobs(choice.prompt_logprobs or [])
        return {**self.head, "choices": out, "usage": self.usage.as_dict()}

    def piece(self, index: int, piece: Piece) -> list[dict]:
        piece = self._shown(piece)
        self.usage.add(index, piece.prompt_tokens, piece.completion_tokens)
        text, echo, echoed = piece.text, "", []
        if index not in self._token_at:
            echo, echoed = self._echo(index, piece)
            text = echo + text
            self._token_at[index] = len(echo)
        if not text and piece.finish_reason is None and not piece.logprobs and not echoed:
            return []
        logprobs = None
        if piece.logprobs is not None and (piece.logprobs or echoed):
            # offsets by the tokens' lengths, as the whole answer counts them (a stop string cut from the
            # text keeps its token)
            logprobs = completion_logprobs(piece.logprobs, self._token_at[index], echoed, echo)
            self._token_at[index] += sum(len(t.token) for t in piece.logprobs)
        return [self._chunk([{"index": index, "text": text, "logprobs": logprobs,
                              "finish_reason": piece.finish_reason, "stop_reason": piece.stop_reason}],
                            self.usage.of_choice(index, self.usage_always))]

    def _shown(self, piece: Piece) -> Piece:
        """The piece as the answer shows it: with echo_only, without the generated token."""
        if not self.echo_only:
            return piece
        return Piece(finish_reason="length" if piece.finish_reason else None, prompt_tokens=piece.prompt_tokens,
                     logprobs=[] if piece.logprobs is not None else None, prompt_logprobs=piece.prompt_logprobs)

    def _echo(self, index: int, first: Piece) -> tuple[str, list[TokenLogprob]]:
        """The choice's echoed text and, with logprobs, its tokens (from the choice's first piece)."""
        if not self.echoed:
            return "", []
        echo = self.echoed[index]
        if first.prompt_logprobs is None:  # a model of one's own without the llm's prompt_logprobs output
            if echo is None or self.top_logprobs is not None:
                raise APIError(400, "echo of token ids, or with logprobs, needs the prompt's logprobs, and this model "
                                    "does not return them (the llm's prompt_logprobs output)", "echo")
            return echo, []
        tokens = prompt_scores(first.prompt_logprobs, self.top_logprobs or 0)
        read = "".join(t.token for t in tokens)
        if echo is None or (len(tokens) == self.cut_to and not read.endswith(echo)):   # ids, or a prompt cut
            echo = read
        return echo, tokens if self.top_logprobs is not None else []

    def end(self) -> list[dict]:
        return [self._chunk([], self.usage.as_dict(), last=True)] if self.usage_chunk else []

    def _chunk(self, choices: list[dict], usage: dict | None, last: bool = False) -> dict:
        """`usage`: what the chunk carries with continuous usage (the choice's own, as vLLM), or the last's."""
        chunk = {**self.head, "choices": choices}
        if self.usage_chunk:
            chunk["usage"] = usage if last or self.usage_always else None
        return chunk
