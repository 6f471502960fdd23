"""Structured output: a request's constraint (SamplingParams.structured_outputs) compiled by xgrammar,
followed token by token by a matcher, and each step's token masks.

xgrammar over llguidance (benchmarks/bench_grammar.py: both covered every constraint tried; xgrammar's
per-token mask took 4 us against 63 us, the cost each guided row pays every step).

Compiling runs in a small thread pool, so a slow constraint never holds up the batch: the request
waits for its grammar, and one whose compile outlasts `compile_timeout_s` fails with ValueError
(INVALID_ARG) naming the limit. Compiled grammars are kept in a bounded LRU keyed by the constraint
(one compiler per engine, so per tokenizer). A matcher advances with each accepted token; preemption
keeps a sequence's tokens (recompute), so its matcher needs no rollback; a terminated grammar ends
the sequence.
"""
from __future__ import annotations

import json
import os
import re
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from llm_engine.engine.schema_patterns import enforceable
from llm_engine.sampling_params import StructuredOutputs

CACHE_SIZE = 256           # compiled grammars kept
COMPILE_THREADS = 2
MAX_MASK_THREADS = 8       # a step's masks, filled in parallel: ~160 us a row on one core at 128k tokens


def mask_threads() -> int:
    """Threads for a step's masks: the cores this process may use, less two (the step loop and the
    serving process), at most MAX_MASK_THREADS; one on a small machine."""
    return max(1, min(MAX_MASK_THREADS, len(os.sched_getaffinity(0)) - 2))


class GrammarCompiler:
    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: tuple[int, ...], compile_timeout_s: float) -> None:
        import xgrammar  # noqa: PLC0415 - only engines that see a structured request pay for the import

        self._xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer.hf_tokenizer, vocab_size=vocab_size,
                                                      stop_token_ids=list(eos_token_ids))
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.vocab_size = vocab_size
        self.words = -(-vocab_size // 32)
        self.compile_timeout_s = compile_timeout_s
        self._pool = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="grammar-compile")
        self._cache: OrderedDict[tuple[str, str], Future] = OrderedDict()
        self._batch = xgrammar.BatchGrammarMatcher(max_threads=mask_threads())
        self._filler = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")

    def submit(self, spec: StructuredOutputs) -> Future:
        """The compiled grammar of `spec`, as a future (done at once when cached)."""
        key = spec.key
        future = self._cache.get(key)
        if future is not None and not (future.done() and future.exception() is not None):
            self._cache.move_to_end(key)
            return future
        future = self._pool.submit(self._compile, spec)
        self._cache[key] = future
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return future

    def _compile(self, spec: StructuredOutputs):
        compiler, xgr = self._compiler, self._xgr
        try:
            if spec.json is not None:
                return compiler.compile_grammar(_json_schema_grammar(xgr, spec.json))
            if spec.json_object:  # any object, as OpenAI's json_object (the builtin grammar takes any value)
                return compiler.compile_grammar(_json_schema_grammar(xgr, '{"type": "object"}'))
            if spec.regex is not None:
                return compiler.compile_regex(spec.regex)
            if spec.choice is not None:
                return compiler.compile_grammar(xgr.Grammar.from_regex("|".join(map(_regex_literal, spec.choice))))
            if spec.structural_tag is not None:
                return compiler.compile_grammar(_structural_tag_grammar(xgr, spec.structural_tag))
            return compiler.compile_grammar(spec.grammar)
        except (RuntimeError, ValueError) as exc:  # xgrammar's parse, schema and structural-tag errors
            raise ValueError(f"structured output: the {spec.key[0]} constraint is invalid: {_xgrammar_reason(exc)}") from None

    def matcher(self, compiled) -> RequestGrammar:
        return RequestGrammar(self._xgr.GrammarMatcher(compiled))

    def masks(self, grammars: list[RequestGrammar | None]) -> torch.Tensor | None:
        """Packed masks [rows, words] int32 for a step's sampled rows, all tokens allowed where a row has
        no grammar; None when none has."""
        if all(g is None for g in grammars):
            return None
        masks = torch.full((len(grammars), self.words), -1, dtype=torch.int32)
        # A finished grammar's row is left all-allowed: its sequence ends with this step.
        rows = [row for row, g in enumerate(grammars) if g is not None and not g.terminated]
        if rows:
            self._batch.batch_fill_next_token_bitmask([grammars[row].matcher for row in rows], masks, rows)
        return masks

    def fill_masks(self, grammars: list[RequestGrammar | None]) -> Future:
        """masks() in a thread of its own (xgrammar fills them without the GIL), so the caller can
        do other work meanwhile; the future's result is masks()'s."""
        return self._filler.submit(self.masks, grammars)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._filler.shutdown(wait=False, cancel_futures=True)


class RequestGrammar:
    """One request's place in its grammar."""

    def __init__(self, matcher) -> None:
        self.matcher = matcher

    def accept(self, token_id: int) -> bool:
        return self.matcher.accept_token(token_id)

    @property
    def terminated(self) -> bool:
        return self.matcher.is_terminated()


class PendingGrammar:
    """A request waiting for its grammar; `failed()` once the compile failed or outlasted the limit."""

    def __init__(self, future: Future, timeout_s: float) -> None:
        self.future = future
        self.deadline = time.monotonic() + timeout_s
        self.timeout_s = timeout_s

    def failed(self) -> Exception | None:
        if self.future.done():
            return self.future.exception()
        if time.monotonic() > self.deadline:
            return ValueError(f"structured output: compiling the constraint took longer than {self.timeout_s:g} s "
                              "(structured_output_compile_timeout_s); simplify it")
        return None


# xgrammar 0.2.8 writes a string's characters as a class that lets through what JSON text cannot hold:
# with minLength/maxLength it excludes only quote, backslash, CR and LF (other control characters pass),
# and both classes take UTF-8 encodings of UTF-16 surrogates (a random model wrote ED B9 84). Both are
# replaced by the class of JSON's unescaped characters.
_STRING_CHARS = (r'[^\"\\\r\n]', r'[^\0-\x1f\"\\\r\n]')
_JSON_STRING_CHAR = r'[^\0-\x1f\"\\\uD800-\uDFFF]'


def _json_schema_grammar(xgr, schema: str):
    """The schema's grammar, compact (with free whitespace a model may pad forever before closing
    the object), its patterns enforced (schema_patterns.py) and emitting only valid JSON strings."""
    schema = json.dumps(enforceable(json.loads(schema)))
    text = str(xgr.Grammar.from_json_schema(schema, any_whitespace=False))
    for chars in _STRING_CHARS:
        text = text.replace(chars, _JSON_STRING_CHAR)
    return xgr.Grammar.from_ebnf(text)


def _structural_tag_grammar(xgr, text: str):
    """A structural tag's grammar: xgrammar's current form `{"type": "structural_tag", "format": {...}}`
    or the legacy one vLLM also takes (`{"structures": [{"begin", "schema", "end"}], "triggers": [...]}`).
    Each `json_schema` region (JSON style, no options of its own) is written as the json constraint is:
    compact, with valid JSON strings only."""
    tag = json.loads(text)
    if "structures" in tag:
        structures, triggers = tag.get("structures"), tag.get("triggers")
        if not isinstance(structures, list) or not all(isinstance(s, dict) for s in structures) \
                or not isinstance(triggers, list):
            raise ValueError("a legacy structural tag needs 'structures' (a list of {\"begin\", \"schema\", \"end\"}) "
                             "and 'triggers' (a list of strings)")
        tag = {"type": "structural_tag", "format": {
            "type": "triggered_tags", "triggers": triggers,
            "tags": [{"type": "tag", "begin": s.get("begin"), "end": s.get("end"),
                      "content": {"type": "json_schema", "json_schema": s.get("schema")}} for s in structures]}}
    return xgr.Grammar.from_structural_tag(json.dumps(_compact_json_regions(xgr, tag)))


def _compact_json_regions(xgr, value):
    if isinstance(value, list):
        return [_compact_json_regions(xgr, item) for item in value]
    if not isinstance(value, dict):
        return value
    if value.get("type") == "json_schema":   # a region, not a format holding others
        if set(value) <= {"type", "json_schema", "style"} and value.get("style", "json") == "json" \
                and isinstance(value.get("json_schema"), dict):
            return {"type": "grammar", "grammar": str(_json_schema_grammar(xgr, json.dumps(value["json_schema"])))}
        return value
    return {key: _compact_json_regions(xgr, item) for key, item in value.items()}


def _xgrammar_reason(exc: Exception) -> str:
    """xgrammar's message without its time stamp, source location and check expression."""
    text = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", str(exc).strip())
    return re.sub(r"^Check failed: \(.*?\) is false: ", "", text)


def _regex_literal(text: str) -> str:
    return "".join("\\" + c if c in r".^$*+?{}[]\|()/" else c for c in text)
