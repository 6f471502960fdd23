"""The llm's tokenize and detokenize control requests (vLLM's /tokenize and /detokenize, asked by the OpenAI
frontend): answered by the tokenizer at once, without the engine, as JSON in `text_output` (as the chat
template info is, chat_tools.py).

- TOKENIZE_KEY: true in the request parameters (Triton's take scalars only), beside them the bools
  `add_special_tokens` and `return_token_strs` (each optional), with a generation request's prompt inputs:
  `text_input`, or `messages` with `tools` and `chat_template_kwargs`, read by parse_request and rendered as a
  generation renders them. The answer is vLLM's TokenizeResponse: {"count", "max_model_len", "tokens",
  "token_strs"}.
- DETOKENIZE_KEY: true, the ids in `prompt_token_ids`. The answer is vLLM's DetokenizeResponse: {"prompt"}.
"""
from __future__ import annotations

import json
from typing import Any, Callable

import numpy as np

import strict_json
from chat_tools import for_template
from llm_request import InvalidRequest, control, parse_request, token_ids_of

TOKENIZE_KEY, DETOKENIZE_KEY = "ragstack_tokenize", "ragstack_detokenize"
OPTIONS = ("add_special_tokens", "return_token_strs")


def answer(get: Callable[[str], np.ndarray | None], request_parameters: str, tokenizer, max_model_len: int,
           max_prompt_bytes: int) -> bytes | None:
    """The JSON answer of a tokenize or detokenize control request; None for any other request. Bad input
    raises InvalidRequest."""
    if control(request_parameters, TOKENIZE_KEY) is not None:
        return _json(tokenize(get, _options(request_parameters), tokenizer, max_model_len, max_prompt_bytes))
    if control(request_parameters, DETOKENIZE_KEY) is not None:
        ids = token_ids_of(get("prompt_token_ids"))
        if ids is None:
            raise InvalidRequest("input 'prompt_token_ids' is missing: detokenize decodes the token ids it holds")
        return _json({"prompt": detokenize(ids, tokenizer)})
    return None


def _options(request_parameters: str) -> dict[str, bool]:
    """The request parameters beside TOKENIZE_KEY (control() has read them as a JSON object)."""
    options = {k: v for k, v in strict_json.loads(request_parameters).items() if k != TOKENIZE_KEY}
    for key, value in options.items():
        if key not in OPTIONS or not isinstance(value, bool):
            raise InvalidRequest(f"parameters: '{key[:40]}' is not an option of a tokenize request, which takes "
                                 f"{' and '.join(OPTIONS)}, each true or false; got {json.dumps(value)[:40]}")
    return options


def tokenize(get: Callable[[str], np.ndarray | None], options: dict[str, bool], tokenizer, max_model_len: int,
             max_prompt_bytes: int) -> dict[str, Any]:
    if get("prompt_token_ids") is not None:
        raise InvalidRequest("input 'prompt_token_ids' is already tokenized: tokenize takes 'text_input' or "
                             "'messages'")
    req = parse_request(get, "", max_prompt_bytes, empty_prompt=True)
    if req.messages is not None:
        try:
            text = tokenizer.apply_chat_template(for_template(req.messages, tokenizer.hf_tokenizer.chat_template),
                                                 tools=req.tools, tokenize=False,
                                                 **req.chat_template_kwargs)
        except ValueError as exc:  # the template refused them, in words error_codes reads as INVALID_ARG
            raise InvalidRequest(str(exc)) from None
        special = options.get("add_special_tokens", False)  # vLLM's default: the template wrote them
    else:
        text, special = req.prompt, options.get("add_special_tokens", True)
    ids = tokenizer.encode(text, add_special_tokens=special)
    strs = tokenizer.hf_tokenizer.convert_ids_to_tokens(ids) if options.get("return_token_strs") else None
    return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": strs}


def detokenize(ids: list[int], tokenizer) -> str:
    """The text of `ids` as vLLM's detokenize gives it: special tokens kept, every id in the vocabulary."""
    size = tokenizer.vocab_size
    for index, token in enumerate(ids):
        if not 0 <= token < size:
            raise InvalidRequest(f"input 'prompt_token_ids' holds {token} at index {index}; the vocabulary has "
                                 f"{size} tokens (ids 0 to {size - 1})")
    return tokenizer.decode(ids, skip_special_tokens=False)


def _json(value: dict[str, Any]) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()
