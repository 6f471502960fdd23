"""vLLM's `POST /tokenize` and `POST /detokenize` (also under /v1) for llm models. The frontend has no
tokenizer: the llm answers both as control requests (backends/triton_llm/tokenize_control.py), rendering a
chat as a generation request renders it, so a tokenized prompt's `count` is a completion's
`usage.prompt_tokens`.

- tokenize: vLLM's TokenizeCompletionRequest {prompt, add_special_tokens (true), return_token_strs} or
  TokenizeChatRequest {messages, add_generation_prompt, continue_final_message, add_special_tokens (false),
  chat_template_kwargs, tools, return_token_strs}, told apart by which of prompt and messages is given; the
  answer is {count, max_model_len, tokens, token_strs (null unless asked)}.
- detokenize: {tokens} -> {prompt}, with special tokens; an id out of the vocabulary is refused by its index.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse

from ragstack.openai_frontend import metrics, models, tools
from ragstack.openai_frontend import triton as t
from ragstack.openai_frontend.errors import APIError
from ragstack.openai_frontend.frontend import Frontend
from ragstack.openai_frontend.limits import FrontendLimits
from ragstack.openai_frontend.request_body import parse
from ragstack.openai_frontend.schemas import ChatRequest, Message, Strict, check_text

TOKENIZE_KEY, DETOKENIZE_KEY = "ragstack_tokenize", "ragstack_detokenize"   # backends/triton_llm/tokenize_control.py
# The llm's inputs, by the request fields its error messages may name.
PARAMS = {"text_input": "prompt", "messages": "messages", "tools": "tools",
          "chat_template_kwargs": "chat_template_kwargs", "prompt_token_ids": "tokens"}
CHAT_ONLY = ("add_generation_prompt", "continue_final_message", "chat_template_kwargs", "tools")


class TokenizeRequest(Strict):
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    add_special_tokens: bool | None = None   # vLLM's defaults: true for a prompt, false for messages
    return_token_strs: bool = False
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: Any = None   # tools.py

    def inputs(self, limits: FrontendLimits) -> dict[str, np.ndarray]:
        """The llm's inputs for the prompt, or for the messages as chat completions sends them; sizes checked."""
        if (self.prompt is None) == (self.messages is None):
            raise APIError(400, "give either prompt (a text) or messages (a chat), not both nor neither",
                           "prompt" if self.prompt is None else "messages")
        if self.prompt is not None:
            for name in CHAT_ONLY:
                if getattr(self, name) is not None:
                    raise APIError(400, f"{name} is for messages: a prompt is tokenized as it is", name)
            check_text(self.prompt, "prompt", limits)
            return {"text_input": t.text(self.prompt)}
        chat = ChatRequest(messages=self.messages, add_generation_prompt=self.add_generation_prompt,
                           continue_final_message=self.continue_final_message,
                           chat_template_kwargs=self.chat_template_kwargs)
        inputs = {"messages": t.text(json.dumps(chat.chat(limits), ensure_ascii=False))}
        llm_tools = tools.llm_tools(tools.plan(self.tools, None, None))
        if llm_tools is not None:
            inputs["tools"] = llm_tools
        if chat.template_kwargs() is not None:
            inputs["chat_template_kwargs"] = t.text(json.dumps(chat.template_kwargs(), ensure_ascii=False))
        return inputs

    def options(self) -> dict[str, bool]:
        given = {"add_special_tokens": self.add_special_tokens, "return_token_strs": self.return_token_strs}
        return {key: value for key, value in given.items() if value is not None}


class DetokenizeRequest(Strict):
    model: str | None = None
    tokens: list[int]

    def ids(self, limits: FrontendLimits) -> np.ndarray:
        if len(self.tokens) > limits.max_detokenize_tokens:
            raise APIError(400, f"tokens has {len(self.tokens)} items; the limit is {limits.max_detokenize_tokens} "
                                "(max_detokenize_tokens)", "tokens")
        for index, token in enumerate(self.tokens):
            if not 0 <= token < 1 << 31:   # the llm's prompt_token_ids are int32
                raise APIError(400, f"tokens[{index}] is {token}; token ids are in [0, 2^31)", f"tokens[{index}]")
        return np.array(self.tokens, dtype=np.int32)


async def tokenize(request: Request, frontend: Frontend) -> JSONResponse:
    body = await parse(request, TokenizeRequest, frontend.limits)
    served = await models.served(frontend.triton, body.model, "tokenize")
    metrics.served_model(request, served.name)
    inputs = body.inputs(frontend.limits)
    return JSONResponse(await _ask(frontend, served.name, inputs, {TOKENIZE_KEY: True, **body.options()}))


async def detokenize(request: Request, frontend: Frontend) -> JSONResponse:
    body = await parse(request, DetokenizeRequest, frontend.limits)
    served = await models.served(frontend.triton, body.model, "tokenize")
    metrics.served_model(request, served.name)
    ids = body.ids(frontend.limits)
    if not ids.size:   # nothing to decode (the llm refuses an empty prompt_token_ids)
        return JSONResponse({"prompt": ""})
    return JSONResponse(await _ask(frontend, served.name, {"prompt_token_ids": ids}, {DETOKENIZE_KEY: True}))


async def _ask(frontend: Frontend, model: str, inputs: dict[str, np.ndarray], parameters: dict) -> dict:
    """The llm's JSON answer to a control request."""
    answer = None
    async for outputs in frontend.triton.stream(model, inputs, parameters, PARAMS):
        text = outputs.get("text_output")
        if text is not None and text.size:
            answer = json.loads(text.reshape(-1)[0])
    if answer is None:
        raise APIError(500, f"model '{model}' sent no answer to a {next(iter(parameters))} request")
    return answer
