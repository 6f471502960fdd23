"""Triton's status code of a failed request: from the gRPC status, the HTTP status, or, where Triton 2.51
drops the code, from the message.

Triton drops it twice: an error inside a gRPC stream carries only its message (the llm, `rag`: UNKNOWN),
and HTTP `generate` answers any error of a decoupled model with 400. The messages of this project's models
(docs/operations.md's error tables) and a few of Triton's own come in families, each raised in one place
with one code; `code_from_message` knows those families and nothing else (None for any other message).
"""
from __future__ import annotations

import re

# TRITONSERVER_Error_Code names, as the two protocols carry them.
_GRPC_CODES = {
    "INVALID_ARGUMENT": "INVALID_ARG", "NOT_FOUND": "NOT_FOUND", "UNAVAILABLE": "UNAVAILABLE",
    "INTERNAL": "INTERNAL", "CANCELLED": "CANCELLED", "UNIMPLEMENTED": "UNSUPPORTED",
    "ALREADY_EXISTS": "ALREADY_EXISTS", "DEADLINE_EXCEEDED": "UNAVAILABLE", "UNKNOWN": "UNKNOWN",
}
# 413, 429 and 502 are the HTTP gateway's own answers (a body over its limit, too many connections,
# tritonserver not answering).
_HTTP_CODES = {400: "INVALID_ARG", 404: "NOT_FOUND", 409: "ALREADY_EXISTS", 413: "INVALID_ARG", 429: "UNAVAILABLE",
               499: "CANCELLED", 500: "INTERNAL", 501: "UNSUPPORTED", 502: "UNAVAILABLE", 503: "UNAVAILABLE"}

# What Triton puts before a step's message: the ensemble, and a Python model's BLS call.
_WRAPPERS = re.compile(r"^(?:in ensemble '[^']*', |Model \S+ - Error when running inference: )+")
# llm_engine.SamplingParams' fields, each of whose messages starts "<field> must" (test_client_errors checks
# that every field is here).
_SAMPLING_FIELDS = ("temperature|top_p|top_k|min_p|repetition_penalty|presence_penalty|frequency_penalty|max_tokens|"
                    "min_tokens|logprobs|seed|stop|stop_token_ids|ignore_eos|skip_special_tokens|structured_outputs|"
                    "logit_bias|allowed_token_ids|truncate_prompt_tokens|prompt_logprobs|include_stop_str_in_output")
_STEP_INPUTS = ("text|query|passages|passage_ids|sources|scores|embedding|top_k|top_n|input_ids|attention_mask|"
                "token_type_ids|mode|locations")

# (code, the message families that have it), each family matched at the start of the step's message.
_FAMILIES = [
    ("UNAVAILABLE", [
        r"waiting queue is full \(max_waiting=",                      # llm_engine/engine/admission.py
        r"the engine process \(pid \d+\) ", r"the engine process is gone",   # the llm's engine died
        r"the engine is (?:shutting down|restarting after a failure)", r"the engine was shut down",
        r"the model is being unloaded; request aborted",              # backends/triton_llm
        r"rag_generate: \d+ requests in flight, the limit", r"rag_generate: no response from \S+ for",
        r"Exceeds maximum queue size",                                # Triton: a dynamic batcher's queue
        r"prompt_builder: (?:no version folder of|cannot read the settings of)",  # the llm's settings unread
    ]),
    ("CANCELLED", [r"request cancelled by the client"]),             # the llm, rag_generate
    ("NOT_FOUND", [
        r"Request for unknown model: ",                               # Triton: not loaded, or no such version
        r"Failed for execute the inference request\. Model '[^']+' is not ready",   # the same, through BLS
    ]),
    ("INTERNAL", [
        r"Stub process '[^']+' is not healthy",                       # Triton: a Python model's stub died
        r"triton_llm: \w+: ",                                         # a failure of the llm's own code
        r"request '[^']+' failed: ",                                  # the engine failed the request's step
        r"rag_generate: the answer does not follow answer_format",    # a JSON answer the schema should have made
    ]),
    ("INVALID_ARG", [
        # the llm: its inputs (backends/triton_llm/llm_request.py, sampling_values.py; llm_engine's checks)
        r"input '\w+' ", r"messages\[\d+\]", r"missing input: give 'text_input'", r"give either 'text_input', ",
        r"tools\[\d+\]", r"messages: the model's chat template refused them",   # chat_tools.py, the tokenizer
        r"'\w+' must be a JSON object", r"(?:sampling_parameters|parameters): '?\w+'? ", r"unknown sampling parameter",
        rf"(?:{_SAMPLING_FIELDS}) must ", r"(?:logit_bias|allowed_token_ids)[ \[]",
        r"prompt has \d+ tokens; it must be shorter than max_model_len", r"prompt token ids must be ",
        r"prompt must not be empty", r"prompt \+ max_tokens = \d+ tokens needs \d+ KV blocks",
        r"When streaming, `exclude_input_in_output` = False is not allowed", r"LoRA feature is not enabled",
        r"structured output", r"unknown structured output key",       # llm_engine's structured output
        r"(?:rag_generate: )?(?:answer_format|max_answer_chars)[: ]",  # rag_generate's answer_format
        # the other models' inputs: tokenizers, retriever, prompt_builder, rag_generate, the ONNX models
        rf"(?:{_STEP_INPUTS})(?:\[\d+\])?(?::| is )", r"query is empty", r"passages, sources, passage_ids and scores",
        r"max_tokens: with the chat template the question takes",   # prompt_builder (ragstack.prompt_budget)
        r"rag_generate: missing input", r"input_ids, attention_mask and token_type_ids must",
        # Triton's checks before any model runs
        r"inference input '[^']+' data-type is", r"unexpected shape for input", r"inference request batch-size must be",
        r"unexpected deadlock, at least one output is not set",
    ]),
]
_PATTERNS = [(code, re.compile("|".join(f"(?:{family})" for family in families))) for code, families in _FAMILIES]


def code_from_grpc(status: str | None) -> str:
    name = (status or "").rsplit(".", 1)[-1]   # "StatusCode.INVALID_ARGUMENT"
    return _GRPC_CODES.get(name, "UNKNOWN")


def code_from_http(status: int | str | None) -> str:
    try:
        return _HTTP_CODES.get(int(status), "UNKNOWN")
    except (TypeError, ValueError):
        return "UNKNOWN"


def code_from_message(message: str) -> str | None:
    """The code of a message of a known family, also inside an ensemble's or a BLS call's wrapping;
    None for any other message."""
    step = _WRAPPERS.sub("", message)
    return next((code for code, pattern in _PATTERNS if pattern.match(step)), None)
