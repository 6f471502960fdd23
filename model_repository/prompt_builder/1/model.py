"""prompt_builder: the question and its reranked passages -> chat messages with numbered
citations [1], [2], ..., and a JSON list of the sources they cite.

The passages are sorted by the reranker's scores (best first) here; of the top_n best, as many go in
as the served llm's context leaves room for, counted in the llm's own tokens with its chat template
(ragstack.prompt_budget): budget = max_model_len - the request's max_tokens. Filling stops at the first
passage that does not fit whole, which is trimmed to the room left (if enough is left), so the context's
order is always the reranked order. A question that leaves too little room is INVALID_ARG with the numbers.

The llm's max_model_len and tokenizer are read from its repository files (config.pbtxt, then model.json /
engine.json of the served version: backends/triton_llm/engine_settings.py, the code the llm itself runs):
the newest version Triton reports ready, else the newest version folder; re-checked once a second.
"""
import faulthandler
import importlib.util
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from ragstack.prompt_budget import Candidate, PromptBudget, PromptTooLong, effective_max_tokens

# Triton logs no word when a stub dies: a segfault here prints every thread's stack to the server log
faulthandler.enable()


class _LLMUnknown(Exception):
    """The llm's settings cannot be read: UNAVAILABLE."""


def _llm_settings(root: Path, name: str, version_dir: Path):
    """The llm version's EngineConfig, by the llm's own settings code (backends/triton_llm)."""
    from google.protobuf import text_format  # noqa: PLC0415
    from tritonclient.grpc import model_config_pb2  # noqa: PLC0415

    # The checkout's backends/ (this file's, resolved: a repository may link to it), or the image's.
    places = [Path(__file__).resolve().parents[3] / "backends" / "triton_llm", root.parent / "backends" / "triton_llm",
              Path("/opt/tritonserver/backends/triton_llm")]
    backend = str(next((p for p in places if (p / "engine_settings.py").is_file()), places[0]))
    if backend not in sys.path:
        sys.path.append(backend)   # appended: none of its modules shadows another
    from engine_settings import load_settings  # noqa: PLC0415

    parsed = text_format.Parse((root / name / "config.pbtxt").read_text(), model_config_pb2.ModelConfig(),
                               allow_unknown_field=True)
    config = {"parameters": {key: {"string_value": value.string_value} for key, value in parsed.parameters.items()}}
    return load_settings(config, version_dir)[0]


def _json_instruction(root: Path) -> str:
    """What rag_generate appends to the user message for answer_format json (its structured_answer.py)."""
    path = root / "rag_generate" / "1" / "structured_answer.py"
    try:
        spec = importlib.util.spec_from_file_location("_rag_structured_answer", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.INSTRUCTION
    except (OSError, AttributeError, ImportError, SyntaxError):
        return " " * 256   # not found: reserve about as much


def _location(raw: str) -> dict:
    try:
        where = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    if not isinstance(where, dict):
        return {}
    return {k: where[k] for k in ("chunk", "lines", "pages") if k in where}


def _span(where: dict) -> str:
    for key in ("pages", "lines"):
        span = where.get(key)
        if isinstance(span, list) and len(span) == 2:
            word = key if span[0] != span[1] else key[:-1]
            return f", {word} {span[0]}-{span[1]}" if span[0] != span[1] else f", {word} {span[0]}"
    return ""


def _int(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    values = tensor.as_numpy().reshape(-1)
    if values.size != 1:
        raise ValueError(f"{name}: {values.size} values; send one")
    return int(values[0])


def _text(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    value = tensor.as_numpy().reshape(-1)[0]
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _required(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:  # Triton 2.51 lets a required input go missing when a model has optional ones
        raise ValueError(f"{name}: missing input")
    return tensor


def _texts(request, name, required=True):
    tensor = _required(request, name) if required else pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    texts = []
    for i, value in enumerate(tensor.as_numpy().reshape(-1)):
        try:  # refused, not replaced: the text goes into the prompt and back to the client
            texts.append(value.decode("utf-8") if isinstance(value, bytes) else str(value))
        except UnicodeDecodeError:
            raise ValueError(f"{name}[{i}] is not valid UTF-8") from None
    return texts


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        self.default_top_n = int(params.get("default_top_n", "4"))
        self.max_top_n = int(params.get("max_top_n", "16"))
        self.max_passages = int(params.get("max_passages", "64"))
        self.max_passage_bytes = int(params.get("max_passage_bytes", "16384"))
        self.max_query_chars = int(params.get("max_query_chars", "2000"))
        self.system_prompt = params.get("system_prompt", "")
        self.min_context_tokens = int(params.get("min_context_tokens", "64"))
        self.min_passage_tokens = int(params.get("min_passage_tokens", "32"))
        self.unbounded_answer_tokens = int(params.get("unbounded_answer_tokens", "256"))
        self.llm = params.get("llm_model", "llm")
        self.root = Path(args["model_repository"]).parent
        self.json_instruction = _json_instruction(self.root)
        self._budgets: dict = {}          # (llm version folder, settings files' mtimes) -> PromptBudget
        self._served = (0.0, None)        # (checked at, key)
        self._lock = threading.Lock()

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                messages, sources = self._build(request)
            except ValueError as error:   # PromptTooLong included
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(str(error), pb_utils.TritonError.INVALID_ARG)))
                continue
            except _LLMUnknown as error:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(str(error), pb_utils.TritonError.UNAVAILABLE)))
                continue
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("messages", np.array([json.dumps(messages).encode()], dtype=object)),
                pb_utils.Tensor("sources", np.array([json.dumps(sources).encode()], dtype=object)),
            ]))
        return responses

    def _build(self, request):
        (query,) = _texts(request, "query")
        query = query.strip()
        if not query:
            raise ValueError("query is empty")
        if len(query) > self.max_query_chars:
            raise ValueError(f"query: {len(query)} characters; the limit is {self.max_query_chars}")
        passages, sources = _texts(request, "passages"), _texts(request, "sources")
        ids = _texts(request, "passage_ids", required=False)
        ids = [""] * len(passages) if ids is None else ids
        scores = _required(request, "scores").as_numpy().reshape(-1)
        counts = {"passages": len(passages), "sources": len(sources), "passage_ids": len(ids), "scores": len(scores)}
        if len(set(counts.values())) != 1:
            raise ValueError("passages, sources, passage_ids and scores must have one entry per passage; got "
                             + ", ".join(f"{name} {n}" for name, n in counts.items()))
        if len(passages) > self.max_passages:
            raise ValueError(f"passages: {len(passages)} in the request; the limit is {self.max_passages}")
        for i, passage in enumerate(passages):
            if len(passage.encode()) > self.max_passage_bytes:
                raise ValueError(f"passages[{i}] is {len(passage.encode())} bytes; the limit is {self.max_passage_bytes}")
        if not np.isfinite(scores).all():  # NaN would sort anywhere and is not JSON in `sources`
            raise ValueError(f"scores[{int(np.argmax(~np.isfinite(scores)))}] is not a finite number")
        top_n = self._top_n(request)
        locations = _texts(request, "locations", required=False)
        if locations is not None and len(locations) != len(passages):
            raise ValueError(f"locations: {len(locations)} entries for {len(passages)} passages")
        where = [_location(raw) for raw in locations] if locations is not None else [{}] * len(passages)

        order = [int(i) for i in np.argsort(-scores, kind="stable")[:top_n]]
        candidates = [Candidate(passages[i], f"(source: {sources[i]}{_span(where[i])})") for i in order]
        max_tokens = effective_max_tokens(_int(request, "max_tokens"), _text(request, "sampling_parameters"),
                                          request.parameters(), self.unbounded_answer_tokens)
        suffix = self.json_instruction if _text(request, "answer_format") == "json" else ""
        prompt = self._budget().build(self.system_prompt, query, candidates, max_tokens, suffix)
        cited = []
        for n, placed in enumerate(prompt.placed, 1):
            i = order[placed.index]
            entry = {"n": n, "source": sources[i], "passage_id": ids[i], "score": float(scores[i]), **where[i]}
            if placed.trimmed:
                entry["trimmed"] = True
            cited.append(entry)
        return prompt.messages, cited

    def _budget(self) -> PromptBudget:
        """The PromptBudget of the served llm version (re-checked at most once a second)."""
        with self._lock:
            checked, key = self._served
            if key is None or time.monotonic() - checked > 1.0:
                key = self._llm_key()
                self._served = (time.monotonic(), key)
            if key not in self._budgets:
                self._budgets = {key: self._load_budget(key[0])}
            return self._budgets[key]

    def _llm_key(self):
        folder = self.root / self.llm
        versions = sorted((int(p.name) for p in folder.iterdir() if p.name.isdigit()), reverse=True) \
            if folder.is_dir() else []
        if not versions:
            raise _LLMUnknown(f"prompt_builder: no version folder of {self.llm!r} in {self.root}, so the prompt's "
                              "token budget is unknown")
        ready = next((v for v in versions if pb_utils.is_model_ready(self.llm, str(v))), versions[0])
        version_dir = folder / str(ready)
        files = [folder / "config.pbtxt", version_dir / "model.json", version_dir / "engine.json"]
        return version_dir, tuple(f.stat().st_mtime_ns if f.is_file() else 0 for f in files)

    def _load_budget(self, version_dir: Path) -> PromptBudget:
        try:
            config = _llm_settings(self.root, self.llm, version_dir)
            from llm_engine.model.tokenizer import Tokenizer  # noqa: PLC0415 - transformers: loaded once

            tokenizer = Tokenizer(config.model)
        except Exception as error:  # noqa: BLE001 - the llm's own load would fail the same way
            raise _LLMUnknown(f"prompt_builder: cannot read the settings of {self.llm} ({version_dir}): "
                              f"{type(error).__name__}: {error}") from None
        return PromptBudget(tokenizer, config.max_model_len, min_context_tokens=self.min_context_tokens,
                            min_passage_tokens=self.min_passage_tokens)

    def _top_n(self, request):
        tensor = pb_utils.get_input_tensor_by_name(request, "top_n")
        if tensor is None:
            return self.default_top_n
        values = tensor.as_numpy().reshape(-1)
        if values.size != 1:
            raise ValueError(f"top_n: {values.size} values; send one")
        top_n = int(values[0])
        if not 1 <= top_n <= self.max_top_n:
            raise ValueError(f"top_n: {top_n} is out of range; it must be 1 to {self.max_top_n}")
        return top_n
