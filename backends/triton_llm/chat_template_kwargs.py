"""The llm's `chat_template_kwargs` input: what vLLM's ChatCompletionRequest hands the chat template.

A JSON object, with `messages` only: `add_generation_prompt` (true unless `continue_final_message`),
`continue_final_message` (false; true leaves the last message, an assistant's, open for the model to
continue: vLLM's prefill), `documents` (a list of objects, for templates that render RAG documents, as
HF's `apply_chat_template(documents=...)`), and any other key as a template variable (vLLM's
`chat_template_kwargs`, e.g. Qwen3's `enable_thinking`). Names of apply_chat_template's own arguments
are refused: as variables they would replace what the backend passes, or fail the call.
Every message starts "input 'chat_template_kwargs' " (ragstack.error_codes reads it as INVALID_ARG).
"""
from __future__ import annotations

from typing import Any

from chat_tools import Invalid

NAME = "chat_template_kwargs"
FLAGS = ("add_generation_prompt", "continue_final_message")
# transformers' PreTrainedTokenizerBase.apply_chat_template parameters other than the three keys above (a test
# checks against the installed signature), the names its renderer gives the template, and vLLM's `tokenizer`.
RESERVED = frozenset({
    "self", "conversation", "tools", "chat_template", "tokenize", "sanitize_control_tokens", "padding",
    "truncation", "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask",
    "tokenizer_kwargs", "messages", "conversations", "tokenizer"})
_WHERE = f"input '{NAME}'"


def parse_template_kwargs(value: Any, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Keyword arguments for Tokenizer.apply_chat_template(messages, tools=..., **them); `messages`
    are the request's, already parsed."""
    if not isinstance(value, dict):
        raise Invalid(f"{_WHERE} must be a JSON object, got {type(value).__name__}")
    for key in value:
        if key in RESERVED:
            hint = ": give tools as the 'tools' input" if key == "tools" else ""
            raise Invalid(f"{_WHERE} key {key[:40]!r} is an argument of apply_chat_template itself, not a "
                          f"template variable{hint}")
    out = {k: v for k, v in value.items() if k not in (*FLAGS, "documents")}
    flags = {}
    for key in FLAGS:
        given = value.get(key)
        if given is not None and not isinstance(given, bool):
            raise Invalid(f"{_WHERE} key '{key}' must be true or false, got {_shown(given)}")
        flags[key] = given
    continue_final = flags["continue_final_message"] is True
    if continue_final and flags["add_generation_prompt"] is True:
        raise Invalid(f"{_WHERE} is refused: Cannot set both `continue_final_message` and "
                      "`add_generation_prompt` to True.")  # vLLM's words
    if continue_final and messages[-1]["role"] != "assistant":
        raise Invalid(f"{_WHERE} key 'continue_final_message' needs the last message to be an assistant "
                      f"message; messages[{len(messages) - 1}] is a {messages[-1]['role']!r} message")
    # Absent (or null), add_generation_prompt is vLLM's default, true, unless the last message is continued.
    out["add_generation_prompt"] = not continue_final if flags["add_generation_prompt"] is None \
        else flags["add_generation_prompt"]
    out["continue_final_message"] = continue_final
    documents = value.get("documents")
    if documents is not None:
        if not isinstance(documents, list):
            raise Invalid(f"{_WHERE} key 'documents' must be a list of JSON objects, got {type(documents).__name__}")
        for i, document in enumerate(documents):
            if not isinstance(document, dict):
                raise Invalid(f"{_WHERE} key 'documents': documents[{i}] must be a JSON object, "
                              f"got {type(document).__name__}")
        out["documents"] = documents
    return out


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
