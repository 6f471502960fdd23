"""The OpenAI frontend's limits: what each guards, its default, and its flag. `ragstack serve` and
`python -m ragstack.openai_frontend` take the same flags (add_arguments); the launcher passes them on
(to_args). A request past one is answered 400 naming the field, its size and the limit's name
(413 for the body, 408 for a stalled one, 503 with Retry-After for max_inflight)."""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field, fields


# The llm's own limits on each JSON input (sampling_parameters, messages, chat_template_kwargs): its
# MAX_JSON_BYTES (backends/triton_llm/llm_request.py) and MAX_DEPTH (backends/triton_llm/strict_json.py:
# levels, the input's own list or object the first, scalars included).
LLM_JSON_BYTES = 64 << 10
LLM_JSON_DEPTH = 16


def _knob(default, help_text: str, choices: tuple[str, ...] | None = None):
    return field(default=default, metadata={"help": help_text, "choices": choices})


@dataclass(frozen=True)
class FrontendLimits:
    # A 1 MiB prompt (the llm's max_prompt_bytes) escaped in JSON at up to 3 bytes a byte, plus the rest:
    # the HTTP gateway's cap. Checked before a byte is parsed.
    max_body_bytes: int = _knob(4 << 20, "largest request body in bytes (413 beyond)")
    # Python's JSON parser recurses; OpenAI bodies nest 5 deep (messages, content parts, ...).
    max_json_depth: int = _knob(32, "deepest JSON nesting of a request body")
    # A stalled body holds one of max_inflight's places: bounded as the gateway bounds it.
    body_timeout_s: float = _knob(30.0, "longest pause in a request body in seconds (408 beyond)")
    # A stream whose client reads nothing holds a place of max_inflight too (nginx's send_timeout: 60 s).
    write_timeout_s: float = _knob(60.0, "longest a streamed answer waits on a client that reads none of it, in "
                                   "seconds (the stream ends)")
    # From a connection's opening and from each answer's end to the next request's whole head (connection.py):
    # above the 60 s that nginx and AWS load balancers keep an idle upstream connection for reuse, so that the
    # frontend never closes one as a proxy sends on it (a POST they do not retry: a 502).
    idle_timeout_s: float = _knob(75.0, "seconds a connection may go without a complete request head: idle between "
                                  "requests, or sending one slowly (the connection is closed)")
    max_inflight: int = _knob(1024, "requests served at once, per worker (the workers hold N x it together); past "
                              "it 503 with Retry-After")
    # Each choice is one llm request: n, or prompts x n for completions.
    max_choices: int = _knob(64, "choices one request may ask for (n, or prompts x n)")
    max_messages: int = _knob(1024, "chat messages per request")
    max_text_chars: int = _knob(1 << 20, "characters of one text: a message, a prompt, an input, a document")
    max_stop: int = _knob(16, "stop strings (and stop_token_ids) per request")
    # Each biased or allowed token is written into every step's logits of the request.
    max_logit_bias: int = _knob(1024, "token ids in one request's logit_bias, and in its allowed_token_ids")
    max_embedding_inputs: int = _knob(2048, "inputs of one embeddings request")
    max_rerank_documents: int = _knob(1024, "documents of one rerank request")
    # Four times a 64k-token context: the text decoded stays within some MiBs.
    max_detokenize_tokens: int = _knob(1 << 18, "token ids of one detokenize request")
    # The embed and rerank tokenizers' max_texts: larger requests are sent in batches of this size.
    embed_batch: int = _knob(32, "texts per request to the embed ensemble")
    rerank_batch: int = _knob(64, "documents per request to the rerank ensemble")
    # Browsers ask before a page of another origin may call the API (CORS); none is let by default.
    allowed_origins: str = _knob("", "comma-separated origins whose web pages may call the API (CORS), e.g. "
                                 "https://app.example.com, or * for any; empty: none")
    # Processes serving the API on one port (one event loop each: one streams at most about 10,000 chunks/s on
    # a 2 GHz core, benchmarks/bench_openai_frontend.py); their /metrics add up (prometheus_client's
    # multiprocess mode).
    workers: int = _knob(1, "processes serving the API on the one port, each its own event loop and gRPC "
                         "channel; give a GPU host 4 or more (docs/operations.md)")
    # How tool_choice "auto" reads tool calls (docs/openai.md): auto, the format the llm's chat template uses.
    tool_call_parser: str = _knob("auto", "tool-call format of tool_choice auto: auto (from the model's chat "
                                  "template), hermes (Qwen2.5), llama3_json (Llama 3.1+), mistral",
                                  ("auto", "hermes", "llama3_json", "mistral"))

    def __post_init__(self):
        for knob in fields(self):
            value, choices = getattr(self, knob.name), knob.metadata["choices"]
            if choices is not None:
                if value not in choices:
                    raise ValueError(f"OpenAI frontend setting {knob.name} must be one of {list(choices)}, got {value!r}")
            elif isinstance(value, str):
                continue
            elif not value > 0:
                raise ValueError(f"OpenAI frontend limit {knob.name} must be > 0, got {value!r}")
        for origin in self.origins():
            if origin != "*" and not re.fullmatch(r"https?://[^/\s*]+", origin):
                raise ValueError(f"OpenAI frontend setting allowed_origins: {origin!r} is not * nor an origin such "
                                 "as https://app.example.com (scheme and host, no path, no wildcard)")

    def origins(self) -> list[str]:
        return [origin.strip() for origin in self.allowed_origins.split(",") if origin.strip()]

    def to_args(self) -> list[str]:
        return [arg for knob in fields(self) for arg in (_flag(knob.name), str(getattr(self, knob.name)))]


def _flag(name: str) -> str:
    return "--openai-" + name.removesuffix("_s").replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("OpenAI frontend limits (docs/operations.md)")
    for knob in fields(FrontendLimits):
        group.add_argument(_flag(knob.name), dest=f"openai_{knob.name}", type=type(knob.default),
                           choices=knob.metadata["choices"], default=knob.default,
                           help=f"{knob.metadata['help']} (default {knob.default})")


def from_args(args: argparse.Namespace) -> FrontendLimits:
    return FrontendLimits(**{knob.name: getattr(args, f"openai_{knob.name}") for knob in fields(FrontendLimits)})
