"""xgrammar vs llguidance, the two grammar engines structured output could use: compile time (cold and
cached), per-token mask time while a constraint is followed, and schema coverage, on one tokenizer.

The tokenizer is a byte-level BPE of up to 128,256 tokens (Llama 3's vocabulary size) trained on the Python
standard library's sources, since no real model's tokenizer may be downloaded here; pass `--tokenizer
FOLDER` to use a model's own. The constraints are JSON schemas covering the features structured output
meets (nesting, arrays, enums, patterns, lengths, numbers' ranges, anyOf, $ref, formats), a regex and a
choice. Each library follows the same token sequence: the tokens of a valid instance of the constraint.

    python -m benchmarks.bench_grammar [--tokenizer FOLDER] [--record FILE]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from benchmarks import bpe_tokenizer, record
from benchmarks.provenance import machine
from benchmarks.table import markdown

SCHEMAS = {
    "flat object": ({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                     "required": ["name", "age"]}, {"name": "Ada", "age": 36}),
    "nested arrays": ({"type": "object", "properties": {"rows": {"type": "array", "items": {
        "type": "array", "items": {"type": "number"}}}}, "required": ["rows"]}, {"rows": [[1.5, 2], [3]]}),
    "enum": ({"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]},
             {"color": "green"}),
    "pattern": ({"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}},
                 "required": ["code"]}, {"code": "ABC-1234"}),
    "string lengths": ({"type": "object", "properties": {"s": {"type": "string", "minLength": 2, "maxLength": 5}},
                        "required": ["s"]}, {"s": "abc"}),
    "number range": ({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 99}},
                      "required": ["n"]}, {"n": 42}),
    "array lengths": ({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3}, [1, 2]),
    "anyOf": ({"anyOf": [{"type": "integer"}, {"type": "object", "properties": {"x": {"type": "string"}},
                                                "required": ["x"]}]}, {"x": "y"}),
    "$ref": ({"$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                                  "required": ["x", "y"]}},
              "type": "object", "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}},
              "required": ["a", "b"]}, {"a": {"x": 1, "y": 2}, "b": {"x": 3, "y": 4}}),
    "no extra keys": ({"type": "object", "properties": {"k": {"type": "boolean"}}, "required": ["k"],
                       "additionalProperties": False}, {"k": True}),
    "format date-time": ({"type": "object", "properties": {"t": {"type": "string", "format": "date-time"}},
                          "required": ["t"]}, {"t": "2026-12-04T10:00:00Z"}),
    "citations": ({"type": "object", "properties": {
        "answer": {"type": "string"}, "sources": {"type": "array", "items": {"type": "integer", "minimum": 1}}},
        "required": ["answer", "sources"], "additionalProperties": False},
        {"answer": "Blocks of 16 tokens hold the KV cache.", "sources": [1, 3]}),
}

TRAINED = f"a {bpe_tokenizer.VOCAB}-token byte-level BPE trained on the stdlib"


def tokenizer(folder: str | None):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(folder or bpe_tokenizer.train())


class XGrammar:
    name = "xgrammar"

    def __init__(self, tok):
        import xgrammar as xgr

        self.xgr = xgr
        self.info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1)
        self.mask = xgr.allocate_token_bitmask(1, self.info.vocab_size)

    def compile(self, kind: str, spec):
        if kind == "json":
            return self.compiler.compile_json_schema(json.dumps(spec))
        if kind == "regex":
            return self.compiler.compile_regex(spec)
        return self.compiler.compile_grammar(self.xgr.Grammar.from_regex("|".join(map(_escape, spec))))

    def follow(self, compiled, tokens: list[int]) -> list[float]:
        matcher, times = self.xgr.GrammarMatcher(compiled), []
        for token in tokens:
            start = time.perf_counter()
            matcher.fill_next_token_bitmask(self.mask)
            times.append(time.perf_counter() - start)
            if not matcher.accept_token(token):
                raise ValueError(f"token {token} refused")
        return times


class LLGuidance:
    name = "llguidance"

    def __init__(self, tok):
        import llguidance
        import llguidance.hf
        import llguidance.numpy

        self.llg, self.np = llguidance, llguidance.numpy
        self.tok = llguidance.hf.from_tokenizer(tok)
        self.mask = self.np.allocate_token_bitmask(1, self.tok.vocab_size)

    def compile(self, kind: str, spec):
        matcher_cls = self.llg.LLMatcher
        grammar = (matcher_cls.grammar_from_json_schema(json.dumps(spec)) if kind == "json" else
                   matcher_cls.grammar_from_regex(spec if kind == "regex" else "|".join(map(_escape, spec))))
        matcher = matcher_cls(self.tok, grammar)
        if matcher.get_error():
            raise ValueError(matcher.get_error())
        return grammar

    def follow(self, grammar, tokens: list[int]) -> list[float]:
        matcher, times = self.llg.LLMatcher(self.tok, grammar), []
        for token in tokens:
            start = time.perf_counter()
            self.np.fill_next_token_bitmask(matcher, self.mask, 0)
            times.append(time.perf_counter() - start)
            if not matcher.consume_token(token):
                raise ValueError(f"token {token} refused: {matcher.get_error()}")
        return times


def _escape(text: str) -> str:
    return "".join("\\" + c if c in r".^$*+?{}[]\|()" else c for c in text)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", help="a model folder's tokenizer (default: a 128,256-token BPE trained here)")
    record.add_argument(parser, "grammar")
    args = parser.parse_args(argv)
    tok = tokenizer(args.tokenizer)
    cases = [("json", name, schema, json.dumps(instance)) for name, (schema, instance) in SCHEMAS.items()]
    cases += [("regex", "regex", r"[0-9]{3}-[a-z]+", "123-abc"), ("choice", "choice", ["yes", "no", "maybe"], "maybe")]
    rows = []
    for engine in (XGrammar(tok), LLGuidance(tok)):
        covered, cold, cached, per_token = 0, [], [], []
        for kind, _, spec, text in cases:
            try:
                start = time.perf_counter()
                compiled = engine.compile(kind, spec)
                cold.append(time.perf_counter() - start)
                start = time.perf_counter()
                engine.compile(kind, spec)
                cached.append(time.perf_counter() - start)
                per_token += engine.follow(compiled, tok.encode(text))
                covered += 1
            except Exception as exc:  # noqa: BLE001 - a feature the library refuses counts against it
                print(f"{engine.name}: {kind} {text[:30]!r}: {type(exc).__name__}: {str(exc)[:120]}", file=sys.stderr)
        rows.append({"library": engine.name, "covered": f"{covered}/{len(cases)}",
                     "compile ms p50": round(statistics.median(cold) * 1e3, 2),
                     "compile ms max": round(max(cold) * 1e3, 2),
                     "again ms p50": round(statistics.median(cached) * 1e3, 3),
                     "mask us p50": round(statistics.median(per_token) * 1e6, 1),
                     "mask us p99": round(sorted(per_token)[int(len(per_token) * 0.99)] * 1e6, 1)})
    print(markdown(rows))
    if args.record:
        record.write(args.record, __file__, argv, args, machine("cpu"), rows,
                     [f"tokenizer: {args.tokenizer or TRAINED}, {len(tok)} tokens"])


if __name__ == "__main__":
    main(sys.argv[1:])
