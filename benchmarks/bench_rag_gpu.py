"""The RAG pipeline with the 8B-shaped LLM on one GPU (issue 24): the `rag` ensemble through Triton (ONNX
int8 embedder and reranker on the CPU, the retriever's FAISS index, prompt_builder, rag_generate, the llm
on the GPU with its `gpu` config: 8 response instances), against the llm alone with the same prompts,
in one run. At each concurrency: rag's end-to-end TTFT p50/p99, ITL p50/p99, e2e, output tok/s, and the
per-step breakdown from the server's per-model metrics (request / queue ms per call, the llm engine's own
TTFT); then the llm alone, sent the exact chat messages prompt_builder built for the same questions (read
from `rag_context` with the same max_tokens; the prompt token counts of both sides are in the table and
must agree). Issue 24's target: at concurrency 1 the steps before the llm add <= 15 ms to TTFT p50.

On the GPU machine, from the repository root, in two device calls (the artifacts and .carry do not fit
into one 64 MiB copy): the first with `carry: [".carry"]` runs `source .carry/on-device.sh` (it makes
the venv /tmp/carry-venv with the bundled tritonserver); the second, with `carry: [".carry-rag"]`, runs

    RAGSTACK_COMMIT=<hash> bash benchmarks/gpu_rag.sh

(`.carry-rag/` is built here beforehand by `python -m benchmarks.pack_rag_gpu`: the int8 ONNX models, the
index, the faiss-cpu wheel's files). On the CPU, the same path with the tiny llm and small counts:

    MODE=cpu CARRY_VENV=.venv bash benchmarks/gpu_rag.sh
    python -m benchmarks.bench_rag_gpu --model checkpoints/tiny-llama --llm-config default \\
        --concurrency 1,4 --requests 4,8 --max-tokens 16 --engine '{"max_model_len": 2048}'

Engine settings: prefix caching is off (rag's prompts and the llm-alone copies of them are the same text:
the second would find the first's KV blocks cached). Answers are greedy, ignore_eos, --max-tokens long. The
8B checkpoint's word-level tokenizer covers the whole vocabulary (every sampled id has text, so every token
is a response) and gets a ChatML chat template here (rag sends chat messages): prompt tokens are words.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmarks import record
from benchmarks.bench_serving import per_level
from benchmarks.provenance import machine
from benchmarks.table import markdown, rounded

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / ".carry-rag"
MODELS_ARCHIVE = "rag-models.tar.xz"      # embedder/<v>, reranker/<v>, retriever/<v> version folders
FAISS_ARCHIVE = "faiss-cpu.tar.xz"        # the faiss-cpu wheel's files, for a site-packages folder
ARTIFACT_MODELS = ("embedder", "reranker", "retriever")
TARGET_ADDED_TTFT_MS = 15.0               # issue 24: rag TTFT p50 - llm-alone TTFT p50 at concurrency 1
SAMPLING = {"temperature": 0.0, "ignore_eos": True}
PRE_LLM_STEPS = ("embed_tokenizer", "embedder", "retriever", "rag_rerank", "rerank_tokenizer", "reranker",
                 "prompt_builder")
DEFAULT_ENGINE = {"max_model_len": 4096, "enable_prefix_caching": False}


# ----------------------------------------------------------------------------------------- the repository
def unpack(archive: Path, dest: Path) -> None:
    with tarfile.open(archive, "r:xz") as tar:
        tar.extractall(dest, filter="data")


def _versions(folder: Path) -> list[str]:
    return sorted((p.name for p in folder.iterdir() if p.is_dir() and p.name.isdigit()), key=int) \
        if folder.is_dir() else []


def _patch(text: str, old: str, new: str, where: str) -> str:
    """`old` (a regex) replaced by `new`; the config must have it (a changed config fails here, loudly)."""
    patched, count = re.subn(old, new, text)
    if not count:
        raise SystemExit(f"{where}: no {old!r} to replace; update benchmarks/bench_rag_gpu.py's write_repository")
    return patched


def write_repository(dest: Path, llm: Path | None = None, settings: dict | None = None) -> dict[str, list[str]]:
    """dest: a model repository of the project's models (model_repository/) around the built version
    folders already unpacked into it (embedder/<v>, reranker/<v>, retriever/<v>). Their configs serve
    those versions, on the CPU (KIND_CPU: the carried onnxruntime has no CUDA provider, and KIND_AUTO
    would place them on the GPU), the tokenizers read those versions' tokenizer files; code versions
    (prompt_builder/1, ...) are links to the checkout's files, so what they import from it resolves; the
    llm (with `llm`) serves that checkpoint with `settings` (1/engine.json; its configs/gpu.pbtxt comes
    along for --model-config-name=gpu). Returns the built models' versions."""
    source = ROOT / "model_repository"
    built = {name: _versions(dest / name) for name in ARTIFACT_MODELS}
    for model in sorted(p for p in source.iterdir() if (p / "config.pbtxt").is_file()):
        name, out = model.name, dest / model.name
        if name == "llm" and llm is None:
            continue
        if name in built and not built[name]:
            continue   # not built (yet): the pack step indexes with the embedder before a retriever exists
        out.mkdir(parents=True, exist_ok=True)
        config = (model / "config.pbtxt").read_text()
        where = f"model_repository/{name}/config.pbtxt"
        if name in ("embedder", "reranker"):
            config = _patch(config, r"kind: KIND_AUTO", "kind: KIND_CPU", where)
        if name == "embedder":
            config = _patch(config, r"versions: \[ *\d+ *\]", f"versions: [ {built[name][-1]} ]", where)
        if name == "embed_tokenizer" and built["embedder"]:
            config = _patch(config, r'"embedder/\d+"', f'"embedder/{built["embedder"][-1]}"', where)
        if name == "rerank_tokenizer" and built["reranker"]:
            config = _patch(config, r'"reranker/\d+"', f'"reranker/{built["reranker"][-1]}"', where)
        (out / "config.pbtxt").write_text(config)
        if (model / "configs").is_dir():
            shutil.copytree(model / "configs", out / "configs", dirs_exist_ok=True)
        if name in built:
            continue
        if name == "llm":
            (out / "1").mkdir(exist_ok=True)
            (out / "1" / "engine.json").write_text(json.dumps({"model": str(Path(llm).resolve()), **(settings or {})}))
            continue
        for version in _versions(model):
            (out / version).mkdir(exist_ok=True)
            for file in (model / version).glob("*.py"):
                link = out / version / file.name
                if not link.exists():
                    link.symlink_to(file.resolve())
    return built


CHAT_TEMPLATE_NOTE = "chat template added by benchmarks/bench_rag_gpu.py"


def chat_checkpoint(base: Path, work: Path) -> Path:
    """`base` if its tokenizer has a chat template; else a folder of links to its files with the
    tokenizer config given a ChatML template (ragstack.tiny_checkpoints'), which rag's chat messages need
    (make_random_model's word-level tokenizer has none). `base` itself is left as it is."""
    config_path = base / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    if config.get("chat_template") or (base / "chat_template.jinja").is_file():
        return base
    from ragstack.tiny_checkpoints import CHAT_TEMPLATE

    out = work / f"{base.name}-chat"
    out.mkdir(parents=True, exist_ok=True)
    for file in base.iterdir():
        if file.name != "tokenizer_config.json" and not (out / file.name).exists():
            (out / file.name).symlink_to(file.resolve())
    config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    (out / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": CHAT_TEMPLATE,
                                                           "ragstack_note": CHAT_TEMPLATE_NOTE}))
    return out


# ------------------------------------------------------------------------------------------- the client
@dataclass
class Stream:
    ttft: float | None = None          # s to the first response with tokens
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0
    prompt_tokens: int | None = None
    e2e: float = 0.0
    error: str | None = None


def _tensor(grpc, name: str, value: np.ndarray):
    dtype = {np.dtype(object): "BYTES", np.dtype(bool): "BOOL", np.dtype(np.int32): "INT32"}[value.dtype]
    t = grpc.InferInput(name, list(value.shape), dtype)
    t.set_data_from_numpy(value)
    return t


def _bytes(text: str) -> np.ndarray:
    return np.array([text.encode()], dtype=object)


def rag_request(question: str, max_tokens: int) -> dict[str, np.ndarray]:
    return {"query": _bytes(question), "stream": np.array([True]), "sampling_parameters": _bytes(json.dumps(SAMPLING)),
            "max_tokens": np.array([max_tokens], np.int32), "return_num_input_tokens": np.array([True]),
            "return_num_output_tokens": np.array([True])}


def llm_request(messages: str, max_tokens: int) -> dict[str, np.ndarray]:
    """What rag_generate sends the llm for the same query (its PASSED_TO_LLM inputs)."""
    return {"messages": _bytes(messages), "stream": np.array([True]), "sampling_parameters": _bytes(json.dumps(SAMPLING)),
            "max_tokens": np.array([max_tokens], np.int32), "return_num_input_tokens": np.array([True]),
            "return_num_output_tokens": np.array([True])}


def _first(result, name: str):
    value = result.as_numpy(name)
    return None if value is None or value.size == 0 else value.reshape(-1)[0]


async def run_streams(url: str, model: str, requests: list[dict], concurrency: int,
                      timeout_s: float) -> tuple[list[Stream], float]:
    """The requests, `concurrency` at a time, each on its own gRPC stream of one asyncio client. A
    response with num_output_tokens > 0 is a token time (rag's last response, the empty FINAL, carries
    none); a stream ends at its FINAL flag or when the server closes it."""
    import tritonclient.grpc.aio as grpc

    client = grpc.InferenceServerClient(url)
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int, tensors: dict) -> Stream:
        async with sem:
            s = Stream()
            inputs = [_tensor(grpc, name, value) for name, value in tensors.items()]

            async def gen():
                yield {"model_name": model, "inputs": inputs, "request_id": f"{model}-{i}"}
            start = time.perf_counter()
            last = None
            try:
                async for result, error in client.stream_infer(gen()):
                    now = time.perf_counter()
                    if error is not None:
                        s.error = str(error)
                        break
                    if s.prompt_tokens is None and (n := _first(result, "num_input_tokens")) is not None:
                        s.prompt_tokens = int(n)
                    tokens = result.as_numpy("num_output_tokens")
                    count = int(tokens.sum()) if tokens is not None else 0
                    if count > 0:
                        s.tokens += count
                        if s.ttft is None:
                            s.ttft = now - start
                        else:
                            s.gaps.append(now - last)
                        last = now
                    parameters = result.get_response().parameters
                    if "triton_final_response" in parameters and parameters["triton_final_response"].bool_param:
                        break
            except Exception as exc:  # noqa: BLE001 - a failed request is counted and reported, the level goes on
                s.error = f"{type(exc).__name__}: {exc}"
            s.e2e = time.perf_counter() - start
            if s.error is None and s.ttft is None:
                s.error = "no token in the answer"
            return s

    t0 = time.perf_counter()
    try:
        results = await asyncio.wait_for(asyncio.gather(*(one(i, r) for i, r in enumerate(requests))), timeout_s)
    finally:
        await client.close()
    return results, time.perf_counter() - t0


def percentile_ms(values, q):
    return float(np.percentile(values, q) * 1e3) if values else float("nan")


def summarize(system: str, concurrency: int, streams: list[Stream], elapsed: float, steps: dict | None) -> dict:
    ok = [s for s in streams if s.error is None]
    gaps = [g for s in ok for g in s.gaps]
    prompts = [s.prompt_tokens for s in ok if s.prompt_tokens is not None]
    return {"system": system, "concurrency": concurrency, "requests": len(streams), "ok": len(ok),
            "errors": sorted({s.error for s in streams if s.error})[:3], "seconds": elapsed,
            "output_tokens": sum(s.tokens for s in ok), "tok_s": sum(s.tokens for s in ok) / elapsed,
            "prompt_tokens_mean": float(np.mean(prompts)) if prompts else float("nan"),
            "ttft_p50_ms": percentile_ms([s.ttft for s in ok], 50), "ttft_p99_ms": percentile_ms([s.ttft for s in ok], 99),
            "itl_p50_ms": percentile_ms(gaps, 50), "itl_p99_ms": percentile_ms(gaps, 99),
            "e2e_p50_ms": percentile_ms([s.e2e for s in ok], 50), "e2e_p99_ms": percentile_ms([s.e2e for s in ok], 99),
            "steps": steps or {}}


def table_row(r: dict) -> dict:
    row = {"system, concurrency": f"{r['system']} c={r['concurrency']}", "requests ok": f"{r['ok']}/{r['requests']}",
           "prompt tokens (mean)": rounded(r["prompt_tokens_mean"]), "output tok/s": rounded(r["tok_s"]),
           **{f"{name} {q} ms": rounded(r[f"{key}_{q}_ms"], 1)
              for name, key in (("TTFT", "ttft"), ("ITL", "itl"), ("end-to-end", "e2e")) for q in ("p50", "p99")}}
    steps = r["steps"]
    if steps:
        pre = [steps[m]["request_ms"] for m in PRE_LLM_STEPS
               if m in steps and m not in ("rerank_tokenizer", "reranker")]   # those two run inside rag_rerank
        row["steps before the llm ms (sum of requests)"] = rounded(sum(pre), 1)
        for model in ("embed_tokenizer", "embedder", "retriever", "rag_rerank", "rerank_tokenizer", "reranker",
                      "prompt_builder", "rag_generate", "llm"):
            s = steps.get(model)
            row[f"{model} request (queue) ms"] = f"{s['request_ms']:.1f} ({s['queue_ms']:.1f})" if s else None
        llm = steps.get("llm", {})
        row["llm engine TTFT ms"] = rounded(llm.get("ttft_ms"), 1)
    return row


def verdict(rows: list[dict]) -> str:
    by = {(r["system"], r["concurrency"]): r for r in rows}
    rag, alone = by.get(("rag", 1)), by.get(("llm alone", 1))
    if not rag or not alone or not rag["ok"] or not alone["ok"]:
        return "Target (rag TTFT p50 at concurrency 1 <= llm alone + 15 ms): not measured (a level is missing)."
    added = rag["ttft_p50_ms"] - alone["ttft_p50_ms"]
    same = (abs(rag["prompt_tokens_mean"] - alone["prompt_tokens_mean"]) < 0.5)
    return (f"Target (issue 24): at concurrency 1 the steps before the llm add {added:.1f} ms to TTFT p50 "
            f"(rag {rag['ttft_p50_ms']:.1f} ms, llm alone {alone['ttft_p50_ms']:.1f} ms; <= {TARGET_ADDED_TTFT_MS:g} "
            f"ms: {'met' if added <= TARGET_ADDED_TTFT_MS else 'MISSED'}); prompts "
            f"{'the same' if same else 'DIFFERENT'} ({rag['prompt_tokens_mean']:.0f} / "
            f"{alone['prompt_tokens_mean']:.0f} tokens on average).")


# ----------------------------------------------------------------------------------------------- the run
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="the llm's HF checkpoint folder (e.g. /tmp/l8b)")
    parser.add_argument("--artifacts", type=Path, default=ARTIFACTS,
                        help=f"the folder with {MODELS_ARCHIVE} (benchmarks/pack_rag_gpu.py; default: %(default)s)")
    parser.add_argument("--llm-config", choices=["gpu", "default"], default="gpu",
                        help="gpu: --model-config-name=gpu (the llm's configs/gpu.pbtxt, 8 instances); default: "
                             "config.pbtxt (1 instance)")
    parser.add_argument("--engine", default="{}", help=f"JSON EngineConfig settings over {DEFAULT_ENGINE}")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--requests", default="32,96,192", help="rag queries per level: one count or one per level")
    parser.add_argument("--llm-concurrency", default=None,
                        help="levels of the llm alone with the same prompts (default: as --concurrency; '1' for "
                             "the target alone)")
    parser.add_argument("--max-tokens", type=int, default=128, help="answer tokens (greedy, ignore_eos)")
    parser.add_argument("--warmup", type=int, default=16, help="untimed rag queries first, 8 at a time")
    parser.add_argument("--budget-s", type=float, default=0.0,
                        help="stop starting levels when this many seconds have passed since the start (0: none)")
    parser.add_argument("--work-dir", type=Path, default=None, help="default: a temporary folder, removed at the end")
    parser.add_argument("--json", type=Path, help="all rows with their step breakdowns, rewritten after each level")
    record.add_argument(parser, "rag_gpu")
    args = parser.parse_args(argv)

    from ragstack import rag_bench
    from ragstack.client import RagClient
    from ragstack.launcher import ServerOptions, TritonServer, free_port

    started = time.monotonic()
    settings = {**DEFAULT_ENGINE, **json.loads(args.engine)}
    levels = [int(c) for c in args.concurrency.split(",")]
    counts = per_level(parser, "--requests", args.requests, levels)
    llm_levels = [int(c) for c in (args.llm_concurrency or args.concurrency).split(",")]
    archive = args.artifacts / MODELS_ARCHIVE
    if not archive.is_file():
        raise SystemExit(f"{archive} is missing: build it with `python -m benchmarks.pack_rag_gpu` (and carry "
                         f"{args.artifacts.name} along)")
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"{args.model}: no config.json (make it: python -m benchmarks.make_random_model "
                         f"--shape llama3-8b --out {args.model})")

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="rag-gpu-"))
    repo = work / "repository"
    repo.mkdir(parents=True, exist_ok=True)
    unpack(archive, repo)
    model = chat_checkpoint(args.model, work)
    versions = write_repository(repo, model, settings)
    print(f"repository {repo}: built versions {versions}, llm {model} {settings}, unpacked in "
          f"{time.monotonic() - started:.1f} s", flush=True)

    rows: list[dict] = []
    notes: list[str] = []

    def save():
        if args.json:
            args.json.write_text(json.dumps({"rows": rows, "notes": notes}, indent=1))

    def time_left() -> float:
        return (args.budget_s - (time.monotonic() - started)) if args.budget_s else 3600.0

    options = ServerOptions(model_repositories=[repo, ROOT / "ensembles"], http_port=free_port(),
                            grpc_port=free_port(), metrics_port=free_port(), startup_timeout_s=600,
                            extra_args=["--model-config-name=gpu"] if args.llm_config == "gpu" else [])
    server = TritonServer(options, work_dir=work / "server")
    t = time.monotonic()
    try:
        server.start()
    except Exception:
        print(f"server log: {server.log_path}\n{server.tail_log(40)}", flush=True)
        raise
    try:
        notes.append(f"server ready in {time.monotonic() - t:.0f} s")
        print(notes[-1], flush=True)
        url, questions = server.grpc_url, rag_bench.QUESTIONS
        t = time.monotonic()
        warm = [rag_request(questions[i % len(questions)], args.max_tokens) for i in range(args.warmup)]
        streams, _ = asyncio.run(run_streams(url, "rag", warm, 8, max(60.0, time_left())))
        failed = [s.error for s in streams if s.error]
        print(f"warm-up: {len(streams) - len(failed)}/{len(streams)} rag queries in {time.monotonic() - t:.1f} s"
              + (f"; errors: {failed[:2]}" if failed else ""), flush=True)
        if len(failed) == len(streams) and streams:
            raise SystemExit(f"every warm-up query failed: {failed[0]}\n{server.tail_log(30)}")
        # The llm-alone prompts: the chat messages prompt_builder builds for each question (rag_context,
        # the same max_tokens), sent as rag_generate sends them.
        with RagClient(url) as client:
            messages = [json.dumps(client.context(q, max_tokens=args.max_tokens).messages) for q in questions]
        for c, n in zip(levels, counts):
            for system in ("rag", "llm alone"):
                if system == "llm alone" and c not in llm_levels:
                    continue
                if time_left() < 20:
                    notes.append(f"{system} c={c}: skipped, the budget (--budget-s {args.budget_s:g}) is spent")
                    print(notes[-1], flush=True)
                    continue
                requests = ([rag_request(questions[i % len(questions)], args.max_tokens) for i in range(n)]
                            if system == "rag" else
                            [llm_request(messages[i % len(messages)], args.max_tokens) for i in range(n)])
                before = rag_bench.scrape(server.metrics_url)
                try:
                    streams, elapsed = asyncio.run(run_streams(url, "rag" if system == "rag" else "llm", requests, c,
                                                               time_left() - 10))
                except asyncio.TimeoutError:
                    notes.append(f"{system} c={c}: timed out (--budget-s)")
                    print(notes[-1], flush=True)
                    continue
                steps = rag_bench.breakdown(before, rag_bench.scrape(server.metrics_url))
                rows.append(summarize(system, c, streams, elapsed, steps if system == "rag" else None))
                r = rows[-1]
                print(f"{system} c={c}: {r['ok']}/{r['requests']} ok in {elapsed:.1f} s, TTFT p50 "
                      f"{r['ttft_p50_ms']:.1f} p99 {r['ttft_p99_ms']:.1f} ms, ITL p50 {r['itl_p50_ms']:.1f} p99 "
                      f"{r['itl_p99_ms']:.1f} ms, {r['tok_s']:.0f} tok/s, prompt {r['prompt_tokens_mean']:.0f} tokens"
                      + (f"; errors: {r['errors']}" if r["errors"] else ""), flush=True)
                save()
    finally:
        server.stop()
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)

    notes.insert(0, verdict(rows))
    notes.append(f"Answers of {args.max_tokens} tokens (greedy, ignore_eos); engine {settings}; llm config "
                 f"{args.llm_config}; embedder/reranker int8 ONNX on the CPU, built versions {versions}. Step cells "
                 "are per call from the server's per-model metrics (rerank_tokenizer and reranker run inside "
                 "rag_rerank, and only when the reranker is not the embedder's cosine). Above concurrency 1 "
                 "the embedder batches queries, and int8 activations are quantized per batch, so a query's "
                 "embedding, its passages and its prompt can differ from the concurrency-1 prompt the llm alone "
                 "gets: compare the prompt tokens.")
    table = [table_row(r) for r in rows]
    print(markdown(table, transpose=True))
    for note in notes:
        print(note)
    save()
    if args.record:
        # what defines the run: not where it worked or how long it could take
        defining = argparse.Namespace(**{k: v for k, v in vars(args).items() if k not in ("budget_s", "work_dir")})
        record.write(args.record, __file__, argv, defining, machine(settings.get("device", "auto")), table, notes)
    return 0 if rows and all(r["ok"] == r["requests"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
