"""Turn one Triton request's tensors into a validated generation request.

Tensor names, dtypes and semantics follow vllm_backend (and TensorRT-LLM's `max_tokens`) so their
clients work unchanged; `messages` (chat) and `prompt_token_ids` (a prompt already tokenized, as vLLM's
TokensPrompt) are this project's own, as are `tools` and `chat_template_kwargs` (vLLM's
chat request's template arguments, chat_template_kwargs.py). Sampling values are read as vLLM
reads them (sampling_values.py). Every error names the tensor (or sampling key), the value and the
limit; the caller answers INVALID_ARG.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

import strict_json
from chat_template_kwargs import parse_template_kwargs
from chat_tools import TEMPLATE_INFO_KEY, Invalid, parse_messages, parse_tools
from sampling_values import SamplingValueError, coerce

# Inputs the model declares (auto_complete_config adds those the config lacks).
# vllm_backend's optional outputs, each sent only when its input asks for it (docs/additional_outputs.md),
# and this project's prompt_logprobs and stop_reason (vLLM's RequestOutput.prompt_logprobs and
# CompletionOutput.stop_reason), which vllm_backend lacks.
RETURNS = ("return_finish_reason", "return_cumulative_logprob", "return_logprobs", "return_num_input_tokens",
           "return_num_output_tokens", "return_prompt_logprobs", "return_stop_reason")
INPUTS = [
    {"name": "text_input", "data_type": "TYPE_STRING", "dims": [1], "optional": True},
    {"name": "prompt_token_ids", "data_type": "TYPE_INT32", "dims": [-1], "optional": True},
    {"name": "messages", "data_type": "TYPE_STRING", "dims": [1], "optional": True},
    {"name": "tools", "data_type": "TYPE_STRING", "dims": [1], "optional": True},
    {"name": "chat_template_kwargs", "data_type": "TYPE_STRING", "dims": [1], "optional": True},
    {"name": "image", "data_type": "TYPE_STRING", "dims": [-1], "optional": True},
    {"name": "stream", "data_type": "TYPE_BOOL", "dims": [1], "optional": True},
    {"name": "sampling_parameters", "data_type": "TYPE_STRING", "dims": [1], "optional": True},
    {"name": "max_tokens", "data_type": "TYPE_INT32", "dims": [1], "optional": True},
    {"name": "exclude_input_in_output", "data_type": "TYPE_BOOL", "dims": [1], "optional": True},
    *({"name": name, "data_type": "TYPE_BOOL", "dims": [1], "optional": True} for name in RETURNS),
]
OUTPUTS = [
    {"name": "text_output", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "finish_reason", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "cumulative_logprob", "data_type": "TYPE_FP32", "dims": [-1]},
    {"name": "logprobs", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "num_input_tokens", "data_type": "TYPE_UINT32", "dims": [1]},
    {"name": "num_output_tokens", "data_type": "TYPE_UINT32", "dims": [-1]},
    {"name": "prompt_logprobs", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "stop_reason", "data_type": "TYPE_STRING", "dims": [-1]},  # JSON: a stop string, a token id or null
    # JSON {"code", "message"}: an error sent as data, only to a caller that asks (ERRORS_IN_BAND).
    {"name": "error", "data_type": "TYPE_STRING", "dims": [-1]},
]
MAX_JSON_BYTES = 64 << 10
# Request parameters between our own models (rag_generate calls the llm by BLS), never sampling keys.
# Triton 2.51's BLS cannot cancel a request it sent, and loses a decoupled callee's error response
# after its first response: the caller names its request (CANCEL_KEY) to abort it later with a
# request of its own (ABORT_KEY, no inputs), and asks for errors as data (ERRORS_IN_BAND).
CANCEL_KEY, ABORT_KEY, ERRORS_IN_BAND = "ragstack_cancel_key", "ragstack_abort", "ragstack_errors_in_band"


class InvalidRequest(ValueError):
    """Bad input from the client: answered with INVALID_ARG."""


@dataclass
class LLMRequest:
    prompt: str | None                     # plain text, used as is
    messages: list[dict[str, Any]] | None  # chat messages, rendered with the model's template
    stream: bool
    sampling: dict[str, Any]               # keys of llm_engine.SamplingParams
    exclude_input_in_output: bool
    returns: frozenset[str] = frozenset()  # the RETURNS asked for
    cancel_key: str | None = None          # CANCEL_KEY: an ABORT_KEY request with it aborts this one
    errors_in_band: bool = False           # ERRORS_IN_BAND: errors go out as the `error` output
    tools: list[dict[str, Any]] | None = None  # OpenAI tools for the chat template (chat_tools.py)
    prompt_token_ids: list[int] | None = None  # the prompt as token ids, used as they are
    # Tokenizer.apply_chat_template's keyword arguments for `messages` (chat_template_kwargs.py); none: its defaults
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


def _scalar(get: Callable[[str], np.ndarray | None], name: str, kind: type):
    array = get(name)
    if array is None:
        return None
    if array.size != 1:
        raise InvalidRequest(f"input '{name}' must hold exactly one element, got shape {list(array.shape)}")
    value = array.reshape(-1)[0]
    if kind is bytes:
        if not isinstance(value, (bytes, np.bytes_, str)):
            raise InvalidRequest(f"input '{name}' must be BYTES, got {array.dtype}")
        return value.encode() if isinstance(value, str) else bytes(value)
    if kind is bool:
        if array.dtype != np.bool_:
            raise InvalidRequest(f"input '{name}' must be BOOL, got {array.dtype}")
        return bool(value)
    if not np.issubdtype(array.dtype, np.integer):
        raise InvalidRequest(f"input '{name}' must be an integer tensor, got {array.dtype}")
    return int(value)


def token_ids_of(array: np.ndarray | None) -> list[int] | None:
    """The engine checks each id against the vocabulary and the count against max_model_len."""
    if array is None:
        return None
    if not np.issubdtype(array.dtype, np.integer):
        raise InvalidRequest(f"input 'prompt_token_ids' must be an integer tensor, got {array.dtype}")
    if array.size == 0:
        raise InvalidRequest("input 'prompt_token_ids' is empty")
    return array.reshape(-1).tolist()


def _utf8(raw: bytes, name: str, limit: int) -> str:
    if len(raw) > limit:
        raise InvalidRequest(f"input '{name}' is {len(raw)} bytes; the limit is {limit}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"input '{name}' is not valid UTF-8 (byte {exc.start})") from None


def _json(text: str, name: str) -> Any:
    try:
        return strict_json.loads(text)
    except strict_json.Refused as exc:
        raise InvalidRequest(f"input '{name}' {exc}") from None


def _parse_chat(text: str, name: str, parse: Callable[[Any], Any]) -> Any:
    try:
        return parse(_json(text, name))
    except Invalid as exc:
        raise InvalidRequest(str(exc)) from None


def _template_kwargs(raw: bytes | None, messages: list[dict[str, Any]] | None) -> dict[str, Any]:
    if raw is None:
        return {}
    if messages is None:
        raise InvalidRequest("input 'chat_template_kwargs' needs 'messages': the chat template renders them")
    return _parse_chat(_utf8(raw, "chat_template_kwargs", MAX_JSON_BYTES), "chat_template_kwargs",
                       lambda value: parse_template_kwargs(value, messages))


def parse_request(get: Callable[[str], np.ndarray | None], request_parameters: str,
                  max_prompt_bytes: int, empty_prompt: bool = False) -> LLMRequest:
    """`get(name)` returns the input tensor as numpy or None; `request_parameters` is the request's
    parameters JSON, where the HTTP generate endpoint puts its "parameters" object; a text_input or
    messages larger than `max_prompt_bytes` is refused before tokenization. An empty text_input is refused
    unless `empty_prompt` (tokenize's: vLLM tokenizes "" to no tokens, or a BOS)."""
    raw_text = _scalar(get, "text_input", bytes)
    raw_messages = _scalar(get, "messages", bytes)
    token_ids = token_ids_of(get("prompt_token_ids"))
    given = [name for name, value in (("text_input", raw_text), ("messages", raw_messages),
                                      ("prompt_token_ids", token_ids)) if value is not None]
    if not given:
        raise InvalidRequest("missing input: give 'text_input' (a prompt), 'messages' (chat JSON) or "
                             "'prompt_token_ids'")
    if len(given) > 1:
        raise InvalidRequest(f"give either 'text_input', 'messages' or 'prompt_token_ids', not {' and '.join(given)}")
    prompt = _utf8(raw_text, "text_input", max_prompt_bytes) if raw_text is not None else None
    messages = (_parse_chat(_utf8(raw_messages, "messages", max_prompt_bytes), "messages", parse_messages)
                if raw_messages is not None else None)
    raw_tools = _scalar(get, "tools", bytes)
    if raw_tools is not None and messages is None:
        raise InvalidRequest("input 'tools' needs 'messages': the chat template renders them")
    tools = _parse_chat(_utf8(raw_tools, "tools", max_prompt_bytes), "tools", parse_tools) \
        if raw_tools is not None else None
    template_kwargs = _template_kwargs(_scalar(get, "chat_template_kwargs", bytes), messages)
    if prompt is not None and not prompt and not empty_prompt:
        raise InvalidRequest("input 'text_input' is empty")

    parameters = _json(request_parameters or "{}", "parameters")
    if not isinstance(parameters, dict):
        raise InvalidRequest(f"'parameters' must be a JSON object, got {type(parameters).__name__}")
    cancel_key, errors_in_band = parameters.pop(CANCEL_KEY, None), parameters.pop(ERRORS_IN_BAND, False)
    if get("image") is not None:
        raise InvalidRequest("input 'image' is not supported: this model is not a multimodal model")
    raw_params = _scalar(get, "sampling_parameters", bytes)
    if raw_params is not None:
        sampling = _json(_utf8(raw_params, "sampling_parameters", MAX_JSON_BYTES), "sampling_parameters")
        source = "sampling_parameters"
    else:
        sampling, source = parameters, "parameters"
    if not isinstance(sampling, dict):
        raise InvalidRequest(f"'{source}' must be a JSON object, got {type(sampling).__name__}")
    try:
        sampling = coerce(sampling, source)
    except SamplingValueError as exc:
        raise InvalidRequest(str(exc)) from None

    max_tokens = _scalar(get, "max_tokens", int)
    if max_tokens is not None:
        sampling["max_tokens"] = max_tokens
    stream = bool(_scalar(get, "stream", bool))
    exclude = _scalar(get, "exclude_input_in_output", bool)
    if stream and exclude is False:  # vllm_backend's rule, in its words
        raise InvalidRequest("When streaming, `exclude_input_in_output` = False is not allowed.")
    return LLMRequest(
        prompt=prompt, messages=messages, tools=tools, chat_template_kwargs=template_kwargs,
        prompt_token_ids=token_ids, stream=stream, sampling=sampling,
        # As vllm_backend: a streamed answer never repeats the prompt; a single answer does unless told.
        exclude_input_in_output=True if stream else bool(exclude),
        returns=frozenset(name for name in RETURNS if _scalar(get, name, bool)),
        cancel_key=str(cancel_key) if cancel_key is not None else None, errors_in_band=errors_in_band is True)


def abort_key(request_parameters: str) -> str | None:
    """The CANCEL_KEY a control request (ABORT_KEY, no inputs) asks to abort, or None for a request
    to generate."""
    key = control(request_parameters, ABORT_KEY)
    return str(key) if key is not None else None


def asks_template_info(request_parameters: str) -> bool:
    """A control request (TEMPLATE_INFO_KEY, no inputs) for the chat template's tool-call format."""
    return control(request_parameters, TEMPLATE_INFO_KEY) is not None


def control(request_parameters: str, name: str) -> Any:
    """The value of the request parameter `name` (a control request's key), or None."""
    if name not in (request_parameters or ""):
        return None
    try:
        parameters = strict_json.loads(request_parameters)
    except strict_json.Refused:
        return None
    return parameters.get(name) if isinstance(parameters, dict) else None
