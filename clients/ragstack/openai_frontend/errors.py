"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with the status a client
can act on: 400 naming the parameter, 401/403 for keys, 404 for a model, 413 for a body, 503 with
Retry-After for overload and what is not ready, 500 only for a failure of the server's own.

Triton's errors arrive with a status code (unary calls) or, inside a gRPC stream, with only their
message (Triton 2.51); ragstack.error_codes reads the code back from the message's family.
"""
from __future__ import annotations

import json
import re

from ragstack.error_codes import code_from_grpc, code_from_message

_TYPES = {401: "authentication_error", 403: "permission_error", 500: "server_error", 503: "server_error"}
_STATUS = {"INVALID_ARG": 400, "UNSUPPORTED": 400, "NOT_FOUND": 404, "ALREADY_EXISTS": 409, "CANCELLED": 499,
           "UNAVAILABLE": 503, "INTERNAL": 500}
# Seconds a 503 asks a client to wait before its retry: an overload (code "overloaded": max_inflight, a full
# queue) clears as requests finish; anything else (an engine restarting, a model loading, Triton away) takes
# seconds (the demo engine restarts in about 3 s), which the SDKs' two retries must outlast.
RETRY_AFTER_OVERLOADED_S = 1
RETRY_AFTER_S = 5
# What Triton and our models put before a step's message.
_WRAPPER = re.compile(r"^(?:in ensemble '[^']*', |Model \S+ - Error when running inference: )+")
# A key the llm names as unknown (the first; a long name cut to 61 characters) or not implemented:
# "unknown sampling parameter(s) ['foo']",
# "sampling_parameters: 'best_of' is a vLLM sampling parameter this engine does not implement".
_NAMED_KEY = re.compile(r"parameter\(s\) \['([^'\\]+?)(?:\.\.\.)?'|^(?:sampling_parameters|parameters): '(\w+)'")
# The llm's two refusals of a prompt and max_tokens past its context (llm_engine/engine/input_processor.py),
# and rag's (ragstack.prompt_budget: "the llm's max_model_len=N minus max_tokens=M leaves ...").
_CONTEXT = re.compile(r"shorter than max_model_len=(\d+)|max_model_len=(\d+) minus")


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": _TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}

    def response(self):
        """A starlette JSONResponse (imported here: `ragstack serve` reads keys.py, which raises these)."""
        from starlette.responses import JSONResponse  # noqa: PLC0415

        wait = RETRY_AFTER_OVERLOADED_S if self.code == "overloaded" else RETRY_AFTER_S
        headers = {"Retry-After": str(wait)} if self.status == 503 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)

    def event(self) -> bytes:
        """The error as an SSE event, for a stream whose 200 is already sent."""
        return f"data: {json.dumps(self.body())}\n\n".encode()


def model_not_found(model: str) -> APIError:
    return APIError(404, f"The model '{model[:200]}' does not exist or is not ready", "model", "model_not_found")


def not_ready(detail: str) -> APIError:
    """A model loading or unloading (it, or one it runs): a few seconds' wait, which the SDKs' retries
    (Retry-After) give it."""
    return APIError(503, detail, code="unavailable")


def from_triton(message: str, grpc_status: str | None, params: dict[str, str] | None = None) -> APIError:
    """A Triton error; `grpc_status` None for one inside a stream. `params` maps a field a message may
    name (the llm's `max_tokens`, the rag ensemble's `query`) to the request parameter it came from."""
    code = code_from_grpc(grpc_status) if grpc_status is not None else "UNKNOWN"
    if code == "UNKNOWN":
        code = code_from_message(message) or "UNKNOWN"
    status = _STATUS.get(code, 500)
    step = _WRAPPER.sub("", message)   # what the model said, without the ensemble's and Triton's framing
    if status == 404:
        return APIError(404, message, "model", "model_not_found")
    # the llm's full queue, rag_generate's max_inflight; Triton's own queue (a model's max_queue_size)
    if status == 503 and (step.endswith("retry later") or "Exceeds maximum queue size" in step):
        return APIError(503, step, code="overloaded")
    if status != 400:
        return APIError(status, step, code=code.lower())
    param = _param(step, params or {})
    step = _in_request_words(step, params or {})
    context = _CONTEXT.search(step)
    if context:  # in OpenAI's words and code, which clients look for to shorten a conversation
        return APIError(400, f"This model's maximum context length is {context.group(1) or context.group(2)} "
                             f"tokens: {step}", param, "context_length_exceeded")
    return APIError(400, step, param)


def _in_request_words(message: str, params: dict[str, str]) -> str:
    """The message with a model's own name for a field put in the request's, where it names the field as
    its subject ("logprobs must be ..." for chat's top_logprobs; "text[0] is ..." for rag's question) or as an
    input ("input 'prompt_token_ids' holds ..." for detokenize's tokens)."""
    def renamed(match: re.Match) -> str:
        word = match.group(2)
        return f"{match.group(1)}{params.get(word, word)}{match.group(3)}"
    message = re.sub(r"^()(\w+)( must )", renamed, message, count=1)
    message = re.sub(r"^(\w+)(\[\d+\])?(: | is )(?=\d)", lambda m: _sized(m, params), message, count=1)
    return re.sub(r"(input ')(\w+)(')", renamed, message)


def _sized(match: re.Match, params: dict[str, str]) -> str:
    """A size against a limit, its subject renamed ("text[0] is 18000 bytes" from rag's embedder on the
    question, "query: 2001 characters"): an item kept where the request's field is a list of them (rerank's
    passages[3] is documents[3]), dropped where it is one value (rag's text[0] is messages[1].content)."""
    word, item, joint = match.groups()
    field = params.get(word, word)
    if field == word:
        return match.group(0)
    return f"{field}{item if item and not field.endswith(']') and '.' not in field else ''}{joint}"


def _param(message: str, params: dict[str, str]) -> str | None:
    """The request parameter a model's message names: an unknown key it quotes, else the first word
    of the message that is a field of `params` ("top_p must be ...", "input 'text_input' is ..."), with
    the path into it where the field keeps its name ("messages[0].role: ...")."""
    named = _NAMED_KEY.search(message)
    if named:
        return named.group(1) or named.group(2)
    for word, path in re.findall(r"([A-Za-z_]\w*)((?:\[\d+\])(?:\[\d+\]|\.[A-Za-z_]\w*)*)?", message.split(";")[0]):
        if word in params:
            return params[word] + (path if params[word] == word else "")
    return None


def internal(exc: Exception) -> APIError:
    """A failure of the frontend's own (logged by the caller): a 500 that names it."""
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}"[:500])


def unreachable(address: str, detail: str) -> APIError:
    return APIError(503, f"tritonserver at {address} did not answer: {detail}", code="unavailable")
