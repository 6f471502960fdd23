"""The request bodies, as OpenAI (and vLLM, for its extra sampling keys and rerank) define them, and
their size checks. Types are strict (a string is not a number); the values' ranges are the llm's to
check, so a request means the same here as through Triton's own doors.

An explicit null means the field's default, as OpenAI's nullable fields do (the SDKs send null for a
None). Chat and completions requests keep keys they do not declare (`model_extra`): they go to the llm as
sampling keys, which names the ones it does not know or implement (vLLM's guided_* keys among them).
`response_format` (structured.py) and the tools (tools.py) are checked where they are used.
"""
from __future__ import annotations

import json
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator

from ragstack.openai_frontend.errors import APIError
from ragstack.openai_frontend.limits import LLM_JSON_BYTES, FrontendLimits
from ragstack.openai_frontend.tools import tool_calls_message

# Sampling keys the llm takes under their OpenAI / vLLM names.
SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "stop", "seed", "presence_penalty", "frequency_penalty",
                 "top_k", "min_p", "repetition_penalty", "ignore_eos", "min_tokens", "stop_token_ids",
                 "skip_special_tokens", "logit_bias", "allowed_token_ids", "prompt_logprobs",
                 "include_stop_str_in_output")
# OpenAI's deprecated forms of tools: refused, pointing to tools.
LEGACY = {"functions": "tools", "function_call": "tool_choice"}
# Chat and completions fields (OpenAI's, vLLM's) for what this server does not do: refused naming the field
# unless null or false, never sent to the llm as unknown sampling keys.
NOT_SERVED = {"audio": "audio output", "reasoning_effort": "a reasoning model's effort",
              "verbosity": "a reasoning model's verbosity", "web_search_options": "web search",
              "cache_salt": "prefix-cache isolation by salt", "chat_template": "a request's own chat template: the "
              "model's is used", "return_token_ids": "token ids in the answer", "logits_processors":
              "custom logits processors", "kv_transfer_params": "disaggregated prefill", "mm_processor_kwargs":
              "multimodal input"}
TOOL_KEYS = ("tools", "tool_choice", "parallel_tool_calls")
ROLES = ("system", "developer", "user", "assistant", "tool")   # OpenAI's chat roles; developer is system here
MAX_REQUEST_ID_CHARS = 256
# vLLM's fields served at one value only: (name, that value, why no other).
FIFO = ("priority", 0, "the llm schedules first come, first served")
TOKEN_TEXT = ("return_tokens_as_token_ids", False, "logprobs name tokens by their text")
ONE_SEQUENCE = ("best_of", 1, "each choice is one sequence; ask for more choices with n")


class NullMeansDefault(BaseModel):
    @model_validator(mode="before")
    @classmethod
    def _nulls_to_defaults(cls, data: Any) -> Any:
        """A null given for a field that has a default other than null is that default."""
        if not isinstance(data, dict):
            return data
        nulls = [name for name, field in cls.model_fields.items()
                 if data.get(name, 0) is None and not field.is_required() and field.default is not None]
        return {k: v for k, v in data.items() if k not in nulls} if nulls else data


class Strict(NullMeansDefault):
    model_config = ConfigDict(strict=True, extra="forbid")


class StreamOptions(Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False   # vLLM's: usage so far on every chunk (with include_usage)
    include_obfuscation: bool | None = None   # OpenAI's padding against length side channels: none here


class Generation(NullMeansDefault):
    """What chat and completions requests share."""
    model_config = ConfigDict(strict=True, extra="allow")

    model: str | None = None   # vLLM's rule: none given, the one model that serves the endpoint
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    user: str | None = None   # accepted, as OpenAI does; not used
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = None
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None   # vLLM's: the stop string stays at the text's end
    logit_bias: dict[str, float] | None = None   # token id (JSON's string key) -> bias; the llm reads the ids
    allowed_token_ids: list[int] | None = None
    prompt_logprobs: int | None = None   # vLLM's: the prompt's tokens scored, in a `prompt_logprobs` field
    response_format: Any = None   # structured.py
    request_id: str | None = None   # vLLM's: the answer's id ends with it
    priority: int = 0
    return_tokens_as_token_ids: bool = False
    best_of: int = 1
    FIXED: ClassVar[tuple] = (FIFO, TOKEN_TEXT, ONE_SEQUENCE)

    def sampling(self) -> dict[str, Any]:
        """The llm's sampling keys: those given, and the undeclared ones as they came (a null as not given)."""
        values = {key: getattr(self, key) for key in SAMPLING_KEYS if getattr(self, key) is not None}
        return {**values, **{key: value for key, value in (self.model_extra or {}).items()
                             if value is not None and key not in NOT_SERVED}}

    def usage_chunks(self) -> tuple[bool, bool]:
        """(a last chunk with the usage, the usage so far on every chunk): stream_options' include_usage,
        and with it vLLM's continuous_usage_stats."""
        options = self.stream_options
        last = options is not None and options.include_usage
        return last, last and options.continuous_usage_stats

    def returns_prompt_logprobs(self) -> bool:
        """vLLM's `prompt_logprobs` asked for: the answer carries them (not streamed, as in vLLM)."""
        if self.prompt_logprobs is not None and self.stream:
            raise APIError(400, "prompt_logprobs are not available when stream is true", "prompt_logprobs")
        return self.prompt_logprobs is not None

    def check_sizes(self, limits: FrontendLimits, choices: int, choices_param: str = "n") -> None:
        for name, what in NOT_SERVED.items():
            value = (self.model_extra or {}).get(name)
            if value is not None and value is not False:   # JSON's false: not asked for (0 is no false)
                raise APIError(400, f"'{name}' is not supported by this server ({what})", name)
        for name, default, what in self.FIXED:
            if getattr(self, name) != default:
                raise APIError(400, f"{name}: only {json.dumps(default)} is supported ({what}), got "
                                    f"{json.dumps(getattr(self, name))[:80]}", name)
        if self.request_id is not None and len(self.request_id) > MAX_REQUEST_ID_CHARS:   # in every chunk's id
            raise APIError(400, f"request_id is {len(self.request_id)} characters; the limit is {MAX_REQUEST_ID_CHARS}",
                           "request_id")
        if self.stream_options is not None and not self.stream:   # OpenAI's and vLLM's rule
            raise APIError(400, "stream_options is only allowed when stream is true", "stream_options")
        if self.n < 1:
            raise APIError(400, f"n must be at least 1, got {self.n}", "n")
        if choices > limits.max_choices:
            raise APIError(400, f"{choices} choices requested; the limit is {limits.max_choices} (max_choices)",
                           choices_param)
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        for name, values in (("stop", stops), ("stop_token_ids", self.stop_token_ids or [])):
            if len(values) > limits.max_stop:
                raise APIError(400, f"{name} has {len(values)} items; the limit is {limits.max_stop} (max_stop)", name)
        for i, stop in enumerate(stops):
            check_text(stop, f"stop[{i}]", limits)
        for name, ids in (("logit_bias", self.logit_bias or ()), ("allowed_token_ids", self.allowed_token_ids or ())):
            if len(ids) > limits.max_logit_bias:
                raise APIError(400, f"{name} has {len(ids)} token ids; the limit is {limits.max_logit_bias} "
                                    "(max_logit_bias)", name)
        for name, instead in LEGACY.items():
            if (self.model_extra or {}).get(name) is not None:
                raise APIError(400, f"'{name}' is OpenAI's deprecated form of '{instead}': send '{instead}' instead",
                               name)


class Message(NullMeansDefault):
    # Keys beyond these (refusal, audio, annotations, reasoning_content: what OpenAI's and vLLM's answers
    # carry when a client sends its history back) mean nothing to the chat template: ignored.
    model_config = ConfigDict(strict=True, extra="ignore")

    role: str
    content: str | list[Any] | None = None   # a list of parts: _text_of
    name: str | None = None           # the speaker's name: to the chat template, as vLLM passes it
    tool_call_id: str | None = None   # a tool message's, likewise
    tool_calls: list[Any] | None = None


class ChatRequest(Generation):
    messages: list[Message]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: Any = None                # tools.py
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    # OpenAI fields that change no answer here, accepted as `user` is: the metadata of a stored completion
    # (store false), a service tier, caching and safety hints, a predicted output (a latency hint).
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    prediction: dict[str, Any] | None = None
    modalities: list[str] | None = None
    # vLLM's: what reaches the chat template (the llm's chat_template_kwargs input), and request fields
    # taken at the values that change nothing here.
    add_generation_prompt: bool | None = None   # default true; false when continue_final_message (the llm's rule)
    continue_final_message: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    documents: list[dict[str, Any]] | None = None
    include_reasoning: bool | None = None   # vLLM's, for its reasoning parsers: none here, so no reasoning to part
    add_special_tokens: bool = False
    echo: bool = False
    FIXED: ClassVar[tuple] = (("add_special_tokens", False, "the chat template writes the special tokens"),
                              ("echo", False, "a chat answer does not repeat the last message"), FIFO, TOKEN_TEXT,
                              ONE_SEQUENCE)

    def sampling(self) -> dict[str, Any]:
        values = super().sampling()
        if self.max_completion_tokens is not None:
            values["max_tokens"] = self.max_completion_tokens
        elif self.max_tokens is None:
            values["max_tokens"] = None   # as OpenAI and vLLM: up to the context's end, not the llm's 16
        if self.logprobs:
            values["logprobs"] = self.top_logprobs or 0
        elif self.top_logprobs:
            raise APIError(400, "top_logprobs needs logprobs set to true", "top_logprobs")
        return values

    def template_kwargs(self) -> dict[str, Any] | None:
        """The llm's chat_template_kwargs: vLLM's chat_template_kwargs with its own fields for the template
        over them, values that change nothing left out; None when nothing is left."""
        return {key: value for _, key, value in self._template_values()} or None

    def template_fields(self) -> list[str]:
        """The request fields that change the template's rendering."""
        return list(dict.fromkeys(field for field, _, _ in self._template_values()))

    def _template_values(self) -> list[tuple[str, str, Any]]:
        """(request field, template argument, value) of each that changes the rendering."""
        given = {key: ("chat_template_kwargs", value) for key, value in (self.chat_template_kwargs or {}).items()}
        for key in ("add_generation_prompt", "continue_final_message", "documents"):
            if getattr(self, key) is not None:
                given[key] = (key, getattr(self, key))
        unchanged = {"add_generation_prompt": True, "continue_final_message": False, "documents": []}
        return [(field, key, value) for key, (field, value) in given.items()
                if key not in unchanged or value != unchanged[key]]

    def chat(self, limits: FrontendLimits) -> list[dict[str, Any]]:
        """The messages as the llm takes them (role, content, tool_calls, tool_call_id), every size checked."""
        self.check_sizes(limits, self.n)
        if self.store:
            raise APIError(400, "store: this server does not store completions; send false or leave it out", "store")
        if self.modalities is not None and self.modalities != ["text"]:
            raise APIError(400, f"modalities: the models here answer in text only, got {str(self.modalities)[:80]}",
                           "modalities")
        if not self.messages:
            raise APIError(400, "messages must hold at least one message", "messages")
        if len(self.messages) > limits.max_messages:
            raise APIError(400, f"messages has {len(self.messages)} items; the limit is {limits.max_messages} "
                                "(max_messages)", "messages")
        if self.continue_final_message and self.add_generation_prompt:   # both given: vLLM's rule, in its words
            raise APIError(400, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                           "continue_final_message")
        if self.continue_final_message and self.messages[-1].role != "assistant":
            raise APIError(400, f"continue_final_message needs the last message to be an assistant message; "
                                f"messages[{len(self.messages) - 1}] is a {self.messages[-1].role[:20]!r} message",
                           "continue_final_message")
        size = len(json.dumps(self.template_kwargs() or {}, ensure_ascii=False).encode())   # as sent
        if size > LLM_JSON_BYTES:
            fields = self.template_fields()
            raise APIError(400, f"{' and '.join(fields)} take {size} bytes of JSON; the limit is {LLM_JSON_BYTES} "
                                "(the llm's chat_template_kwargs input)", fields[0])
        return [_message(message, f"messages[{i}]", limits) for i, message in enumerate(self.messages)]


class CompletionRequest(Generation):
    prompt: Any
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    add_special_tokens: bool = True
    FIXED: ClassVar[tuple] = (("add_special_tokens", True, "the llm encodes a text prompt with its special tokens"),
                              FIFO, TOKEN_TEXT, ONE_SEQUENCE)

    def echo_only(self) -> bool:
        """vLLM's and OpenAI's scoring form: echo with max_tokens 0 answers the prompt alone (one token is
        generated and left out)."""
        return self.echo and self.max_tokens == 0

    def sampling(self) -> dict[str, Any]:
        values = super().sampling()
        if self.logprobs is not None:
            values["logprobs"] = self.logprobs
        if self.echo_only():
            values["max_tokens"] = 1
        return values

    def prompts(self, limits: FrontendLimits) -> list[str | list[int]]:
        """OpenAI's four forms: a string, a list of strings, a list of token ids, a list of such lists."""
        prompts = [self.prompt] if isinstance(self.prompt, str) or token_ids(self.prompt) else self.prompt
        if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) or token_ids(p)
                                                                   for p in prompts):
            raise APIError(400, "prompt must be a string, a list of strings, a list of token ids or a list of "
                                "lists of token ids, none empty", "prompt")
        self.check_sizes(limits, len(prompts) * max(self.n, 1), "prompt" if len(prompts) > 1 else "n")
        for i, prompt in enumerate(prompts):
            param = f"prompt[{i}]" if len(prompts) > 1 else "prompt"
            if isinstance(prompt, str):
                if not prompt:   # vLLM's rule: nothing to continue from
                    raise APIError(400, f"{param} is empty; give at least one character or token id", param)
                check_text(prompt, param, limits)
            elif not all(0 <= t < 1 << 31 for t in prompt):
                raise APIError(400, f"{param}: token ids must be in [0, 2^31), got {min(prompt)} to {max(prompt)}",
                               param)
        if self.suffix:
            raise APIError(400, "suffix is not supported (no fill-in-the-middle)", "suffix")
        for name in TOOL_KEYS:
            if (self.model_extra or {}).get(name) is not None:
                raise APIError(400, f"'{name}' is for chat completions (/v1/chat/completions)", name)
        return prompts


def token_ids(value: Any) -> bool:
    """A prompt of token ids: a non-empty list of ints."""
    return isinstance(value, list) and bool(value) and all(type(t) is int for t in value)


def check_text(text: str, param: str, limits: FrontendLimits) -> None:
    if len(text) > limits.max_text_chars:
        raise APIError(400, f"{param} is {len(text)} characters; the limit is {limits.max_text_chars} "
                            "(max_text_chars)", param)


def _message(message: Message, param: str, limits: FrontendLimits) -> dict[str, Any]:
    if message.role not in ROLES:   # named here, where the API's list is known (the llm's lacks "developer")
        raise APIError(400, f"{param}.role: {message.role[:40]!r} is not one of {list(ROLES)}", f"{param}.role")
    out: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role}  # OpenAI's newer name
    if message.tool_calls:
        if message.role != "assistant":
            raise APIError(400, f"{param}.tool_calls: only assistant messages carry tool calls", f"{param}.tool_calls")
        out["tool_calls"] = tool_calls_message(message.tool_calls, f"{param}.tool_calls")
        for i, call in enumerate(out["tool_calls"]):
            check_text(json.dumps(call["function"]["arguments"]), f"{param}.tool_calls[{i}].function.arguments",
                        limits)
    if message.tool_call_id is not None:
        check_text(message.tool_call_id, f"{param}.tool_call_id", limits)
        if message.role == "tool":
            out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        check_text(message.name, f"{param}.name", limits)
        out["name"] = message.name
    if message.content is None or message.content == []:
        if "tool_calls" not in out:
            raise APIError(400, f"{param}.content is missing" if message.content is None else
                                f"{param}.content must hold at least one part", f"{param}.content")
        content = ""
    elif isinstance(message.content, str):
        content = message.content
    else:
        content = "\n".join(_text_of(part, f"{param}.content[{j}]") for j, part in enumerate(message.content))
    check_text(content, f"{param}.content", limits)
    return {**out, "content": content}


def _text_of(part: Any, param: str) -> str:
    """A content part's text: only `{"type": "text", "text": ...}` parts here (vLLM joins them with newlines)."""
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise APIError(400, f"{param} must be an object with a string 'type', such as {{\"type\": \"text\", "
                            f"\"text\": \"...\"}}; got {json.dumps(part)[:60]}", param)
    if part["type"] != "text":
        raise APIError(400, f"{param}: only text parts are supported (this model is not multimodal), got type "
                            f"{part['type'][:40]!r}", param)
    if not isinstance(part.get("text"), str):
        raise APIError(400, f"{param}.text must be a string, got {json.dumps(part.get('text'))[:60]}", f"{param}.text")
    return part["text"]
