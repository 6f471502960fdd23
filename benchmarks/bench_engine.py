r"""Engine benchmark, in-process: our engine and HF transformers `generate()` on the same weights
and prompts, in one run, plus the single-stream roofline from the bandwidth measured in the run.

Workloads (issue 7): a = one stream, 128-token prompt, 256 output tokens; b = N requests at once,
prompts uniform in 128..1024, outputs uniform in 128..512 (ignore_eos); c = 8 requests of 16k-token
prompts, 128 output tokens; d = FP8 KV against bf16 KV on b and c; e = N requests scored as lm-eval's
loglikelihood requests are (prompts uniform in 128..1024, one output token).

    python -m benchmarks.bench_engine --model /tmp/llama3-8b --workloads a,b --num-requests 1000

The engine runs with async scheduling (its default); --compare-sync adds a row per workload with
it off, in the same run:

    python -m benchmarks.bench_engine --model /tmp/llama3-8b --workloads a --no-hf --compare-sync

--engine JSON sets EngineConfig fields; repeated, each workload runs once per setting:

    python -m benchmarks.bench_engine --model /tmp/llama3-8b --workloads b --no-hf \
        --engine '{}' --engine '{"max_num_batched_tokens": 8192}'

and "launch_params" in it overrides launch configs for that setting's engine (here h200.json's fused
single-row projections against the unfused ones):

    python -m benchmarks.bench_engine --model /tmp/llama3-8b --workloads a --no-hf \
        --engine '{}' --engine '{"launch_params": {"skinny_linear": {"max_rows": 0}}}'

--guided adds, per workload, a row with every request guided by one of 20 JSON schemas and a row
unguided at the lengths the guided requests reached (structured output's cost alone), and the
grammar compile times (cache miss and hit); the checkpoint needs a BPE tokenizer:

    python -m benchmarks.bpe_tokenizer --out /tmp/bpe
    python -m benchmarks.make_random_model --shape llama3-8b --out /tmp/l8b-bpe --tokenizer /tmp/bpe
    python -m benchmarks.bench_engine --model /tmp/l8b-bpe --workloads a,b --no-hf --guided

--quantization fp8 runs every engine setting twice, as given and with FP8 weights (EngineConfig
quantization "fp8": the bf16 checkpoint quantized at load), so bf16 and FP8 rows come from one run;
FP8 rows are judged against the FP8 roofline (the projections' weights at one byte) and issue 25's
targets ((a) >= 430 tok/s and >= 80% of it; (b) with FP8 KV too, >= 16,000 tok/s and >= 1.5x the
bf16 engine's row):

    python -m benchmarks.bench_engine --model /tmp/llama3-8b --workloads a,b --no-hf --quantization fp8 \
        --engine '{}' --engine '{"kv_cache_dtype": "fp8_e4m3"}'

--prompt-logprobs N adds, per workload and setting, a row with every request scoring its prompt
(SamplingParams.prompt_logprobs N; the row's seconds against the row without it are scoring's cost):

    python -m benchmarks.bench_engine --model /tmp/llama3-8b --workloads e --no-hf --prompt-logprobs 1

Tensor parallelism (one process per GPU from cuda:0; HF's baseline, one GPU, is skipped):

    python -m benchmarks.bench_engine --model /tmp/llama3-70b --tensor-parallel-size 4 --workloads a,b
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from benchmarks import guided_schemas, record
from benchmarks.provenance import machine
from benchmarks.table import markdown, rounded


@dataclass
class Row:
    system: str
    workload: str
    kv_dtype: str
    requests: int
    output_tokens: int
    seconds: float
    tok_s: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    peak_mem_gb: float
    weights: str = "bf16"  # "fp8": the projections in FP8 (quantized at load, or an FP8 checkpoint)


def pct(values, q):
    return float(np.percentile(values, q) * 1e3) if len(values) else None


def make_workload(name: str, vocab: int, num_requests: int, seed: int = 0):
    rng = random.Random(seed)
    if name == "a":
        specs = [(128, 256)]
    elif name == "b":
        specs = [(rng.randint(128, 1024), rng.randint(128, 512)) for _ in range(num_requests)]
    elif name == "c":
        specs = [(16384, 128)] * 8
    elif name == "e":
        specs = [(rng.randint(128, 1024), 1) for _ in range(num_requests)]
    else:
        raise ValueError(f"unknown workload {name!r}")
    # Ids away from the special tokens at the end of the vocabulary.
    return [([rng.randrange(10, vocab - 10) for _ in range(p)], o) for p, o in specs]


def measure_bandwidth() -> float:
    """Device-to-device copy of 4 GiB: bytes read + written per second."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(10):
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    return 2 * n * 4 / float(np.median(times))


def run_engine(model: str, workload: str, requests, kv_dtype: str, max_model_len: int, tp: int,
               async_scheduling: bool = True, overrides: dict | None = None, guided: list[dict] | None = None,
               label: str = "", prompt_logprobs: int | None = None) -> tuple[Row, list]:
    """Peak memory is rank 0's GPU (each rank holds its shard and KV pool). `overrides`: more
    EngineConfig fields, and "launch_params" ({kernel: {param: value}} over launch_configs/*.json;
    this process's kernels only, so rank 0's), named in the row's system. `guided`: a JSON schema per
    request (structured output); `prompt_logprobs`: every request scores its prompt. Returns the row and the
    outputs."""
    from llm_engine import LLM, SamplingParams
    from llm_engine.kernels.launch_config import override_launch_params

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    overrides = overrides or {}
    settings = {"dtype": "bfloat16", "kv_cache_dtype": kv_dtype, "max_model_len": max_model_len,
                "tensor_parallel_size": tp, "async_scheduling": async_scheduling,
                **{k: v for k, v in overrides.items() if k != "launch_params"}}
    kv_dtype = settings["kv_cache_dtype"]
    with contextlib.ExitStack() as stack:
        for kernel, values in overrides.get("launch_params", {}).items():
            stack.enter_context(override_launch_params(kernel, **values))
        llm = stack.enter_context(LLM(model, **settings))  # built, warmed up and captured under them
        prompts = [ids for ids, _ in requests]
        params = [SamplingParams(temperature=0.0, max_tokens=o, ignore_eos=True, prompt_logprobs=prompt_logprobs,
                                 structured_outputs={"json": guided[i]} if guided else None)
                  for i, (_, o) in enumerate(requests)]
        llm.generate(prompts[:1], [SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)])  # warm-up
        if guided:  # each schema compiled once before the clock starts: compile_times() measures that
            distinct = list({json.dumps(g): g for g in guided}.values())
            llm.generate(prompts[:1] * len(distinct), [SamplingParams(temperature=0.0, max_tokens=2, structured_outputs={
                "json": g}) for g in distinct])
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=len(prompts) > 8)
        seconds = time.perf_counter() - t0
    n_out = sum(len(o.token_ids) for o in outputs)
    ttft = [o.stats.time_to_first_token for o in outputs]
    itl = [g for o in outputs for g in o.stats.inter_token_latencies]
    system = ("engine" if tp == 1 else f"engine TP={tp}") + ("" if async_scheduling else " sync-sched")
    if overrides:
        system += " " + ", ".join(f"{k}={v}" for k, v in overrides.items())
    system += label + ("" if prompt_logprobs is None else f" prompt_logprobs={prompt_logprobs}")
    fp8 = settings.get("quantization") == "fp8" or checkpoint_is_fp8(model)
    row = Row(system, workload, kv_dtype, len(outputs), n_out, seconds,
              n_out / seconds, pct(ttft, 50), pct(ttft, 99), pct(itl, 50), pct(itl, 99),
              torch.cuda.max_memory_allocated() / 1e9, "fp8" if fp8 else "bf16")
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return row, outputs


def run_hf(model: str, workload: str, requests, batch_size: int) -> Row:
    """HF generate() as a user writes it: left-padded batches, greedy, each batch runs to its
    longest requested output; only the requested tokens are counted."""
    from transformers import AutoModelForCausalLM

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
    pad = hf.config.eos_token_id if isinstance(hf.config.eos_token_id, int) else 0
    n_out, ttfts = 0, []
    t0 = time.perf_counter()
    for i in range(0, len(requests), batch_size):
        batch = requests[i:i + batch_size]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, (p, _) in enumerate(batch):
            ids[row, width - len(p):] = torch.tensor(p)
            mask[row, width - len(p):] = 1
        new = max(o for _, o in batch)
        b0 = time.perf_counter()
        with torch.inference_mode():
            hf.generate(input_ids=ids.cuda(), attention_mask=mask.cuda(), max_new_tokens=new, min_new_tokens=new,
                        do_sample=False, pad_token_id=pad)
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - b0
        # A batch's first tokens appear after its prefill; a request waits for the batches before it.
        ttfts += [b0 - t0 + elapsed / new] * len(batch)
        n_out += sum(o for _, o in batch)
    seconds = time.perf_counter() - t0
    row = Row("hf-generate", workload, "bfloat16", len(requests), n_out, seconds, n_out / seconds,
              pct(ttfts, 50), pct(ttfts, 99), None, None, torch.cuda.max_memory_allocated() / 1e9)
    del hf
    gc.collect()
    torch.cuda.empty_cache()
    return row


STARTUP_SNIPPET = """
import sys, time
t0 = time.perf_counter()
from llm_engine import LLM
LLM(sys.argv[1], dtype="bfloat16", max_model_len=int(sys.argv[2]))
print(time.perf_counter() - t0)
"""


def run_guided(args, workload: str, requests) -> tuple[list[Row], str]:
    """Every request guided by one of 20 JSON schemas, then the same requests unguided with the
    lengths the guided ones reached (a grammar may end a request early): the cost of guidance alone."""
    import jsonschema

    schemas = guided_schemas.schemas()
    guided = [schemas[i % len(schemas)] for i in range(len(requests))]
    common = (args.model, workload)
    rest = ("auto", args.max_model_len, args.tensor_parallel_size)
    row, outputs = run_engine(*common, requests, *rest, guided=guided, label=" guided (20 JSON schemas)")
    stopped = [(o, g) for o, g in zip(outputs, guided) if o.finish_reason == "stop"]
    invalid = 0
    for out, schema in stopped:
        try:
            jsonschema.validate(json.loads(out.text), schema)
        except (ValueError, jsonschema.ValidationError):
            invalid += 1
    same = [(ids, max(1, len(o.token_ids))) for (ids, _), o in zip(requests, outputs)]
    free, _ = run_engine(*common, same, *rest, label=" unguided, the guided lengths")
    share = row.tok_s / free.tok_s
    target = 0.95 if workload == "a" else 0.90
    note = (f"({workload}) guided {row.tok_s:,.0f} tok/s = {100 * share:.1f}% of unguided at the same lengths "
            f"({free.tok_s:,.0f}; target >= {100 * target:.0f}%: {'met' if share >= target else 'missed'}); "
            f"{len(stopped)} of {len(outputs)} guided outputs complete ({invalid} not valid JSON of their schema), "
            f"the rest cut at max_tokens")
    print(note, flush=True)
    return [row, free], note


def compile_times(model: str) -> str:
    """The 20 schemas compiled by the engine's GrammarCompiler for the model's tokenizer: once (a cache
    miss) and again (a hit)."""
    from llm_engine.engine.structured_output import GrammarCompiler
    from llm_engine.model.tokenizer import Tokenizer
    from llm_engine.sampling_params import StructuredOutputs

    cfg = json.loads((Path(model) / "config.json").read_text())
    tokenizer = Tokenizer(model)
    compiler = GrammarCompiler(tokenizer, cfg["vocab_size"], (cfg["eos_token_id"],), compile_timeout_s=60)
    times = {"miss": [], "hit": []}
    for spent in times.values():
        for schema in guided_schemas.schemas():
            t0 = time.perf_counter()
            compiler.submit(StructuredOutputs(json=schema)).result()
            spent.append(time.perf_counter() - t0)
    compiler.close()
    return (f"grammar compile, 20 schemas: miss p50 {pct(times['miss'], 50):.1f} ms, max "
            f"{max(times['miss']) * 1e3:.1f} ms; cache hit p50 {pct(times['hit'], 50) * 1e3:.1f} us")


def measure_startup(model: str, max_model_len: int) -> dict:
    """Load-to-ready (import, weights, KV pool, warm-up, CUDA graphs) in fresh processes: first
    with an empty Triton kernel cache (cold), then with the cache it filled (warm); and the time
    to read the weights alone onto the GPU."""
    from safetensors.torch import load_file

    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    for path in sorted(Path(model).glob("*.safetensors")):
        load_file(path, device=device)
    weights_s = time.perf_counter() - t0
    gc.collect()
    times = {}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TRITON_CACHE_DIR": cache}
        for name in ("cold", "warm"):
            out = subprocess.run([sys.executable, "-c", STARTUP_SNIPPET, model, str(max_model_len)], env=env,
                                 check=True, capture_output=True, text=True).stdout
            times[name] = float(out.strip().splitlines()[-1])
    return {"weights_s": weights_s, **times}


def checkpoint_is_fp8(model: str) -> bool:
    return "quantization_config" in json.loads((Path(model) / "config.json").read_text())


def projection_params(cfg: dict) -> tuple[int, int]:
    """(weights, output rows) of the decoder's projections: what FP8 stores at one byte, with a scale a row."""
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    head_dim = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim
    per_layer = (h * (q + 2 * kv) + q * h + 2 * inter * h + inter * h, (q + 2 * kv) + h + 2 * inter + h)
    return tuple(cfg["num_hidden_layers"] * n for n in per_layer)


def roofline_tok_s(model: str, bandwidth: float, prompt: int, output: int, fp8: bool = False) -> float:
    """Single stream: each step reads every weight (embedding rows aside) and the KV so far; with `fp8`,
    the projections' weights at one byte and a float32 scale per output row (the bf16 checkpoint's 2)."""
    cfg = json.loads((Path(model) / "config.json").read_text())
    index = json.loads((Path(model) / "model.safetensors.index.json").read_text())
    weight_bytes = index["metadata"]["total_size"]
    params, rows = projection_params(cfg)
    if checkpoint_is_fp8(model):
        weight_bytes += params - 4 * rows  # as bf16
    if fp8:
        weight_bytes -= params - 4 * rows
    weight_bytes -= cfg["vocab_size"] * cfg["hidden_size"] * 2  # the embedding table: one row per step
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    kv_per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * 2
    mean_context = prompt + output / 2
    step_bytes = weight_bytes + kv_per_token * mean_context
    return bandwidth / step_bytes


def target_notes(rows: list[Row], roof: float, roof_fp8: float | None = None) -> list[str]:
    """Issue 7's targets, met or missed, for every bf16 engine row of workloads a and b: (a) >= 85% of the
    roofline and >= 225 tok/s; (b) >= 12,000 tok/s and >= 10x the HF row of the same run. Issue 25's for
    the FP8-weight rows: (a) >= 430 tok/s and >= 80% of the FP8 roofline; (b) with FP8 KV, >= 16,000 tok/s
    and >= 1.5x the first bf16 engine row of (b) with bf16 KV."""
    def verdict(ok: bool) -> str:
        return "met" if ok else "missed"

    hf_b = next((r for r in rows if r.system == "hf-generate" and r.workload == "b"), None)
    bf16_b = next((r for r in rows if r.system.startswith("engine") and r.workload == "b" and r.weights == "bf16"
                   and r.kv_dtype == "auto"), None)
    notes = []
    for r in rows:
        if not r.system.startswith("engine"):
            continue
        if r.weights == "fp8":
            if r.workload == "a" and roof_fp8:
                share = r.tok_s / roof_fp8
                notes.append(f"{r.system} (a) {r.tok_s:,.0f} tok/s, {100 * share:.0f}% of the FP8 roofline "
                             f"{roof_fp8:.0f} (target >= 430 tok/s and >= 80%: "
                             f"{verdict(share >= 0.8 and r.tok_s >= 430)})")
            elif r.workload == "b":
                note = f"{r.system} (b) {r.tok_s:,.0f} tok/s"
                if bf16_b is not None:
                    note += f", {r.tok_s / bf16_b.tok_s:.2f}x the bf16 engine"
                if r.kv_dtype == "fp8_e4m3":
                    ok = r.tok_s >= 16000 and bf16_b is not None and r.tok_s >= 1.5 * bf16_b.tok_s
                    note += f" (FP8 weights + FP8 KV target >= 16,000 and >= 1.5x: {verdict(ok)})"
                notes.append(note)
            continue
        if r.workload == "a":
            share = r.tok_s / roof
            notes.append(f"{r.system} (a) at {100 * share:.0f}% of the roofline (target >= 85% and >= 225 tok/s: "
                         f"{verdict(share >= 0.85 and r.tok_s >= 225)})")
        elif r.workload == "b":
            note = f"{r.system} (b) {r.tok_s:,.0f} tok/s (target >= 12,000: {verdict(r.tok_s >= 12000)})"
            if hf_b is not None:
                ratio = r.tok_s / hf_b.tok_s
                note += f", {ratio:.0f}x HF generate() (target >= 10x: {verdict(ratio >= 10)})"
            notes.append(note)
    return notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="HF model folder (benchmarks/make_random_model.py)")
    parser.add_argument("--workloads", default="a,b", help="comma-separated from a,b,c,d,e")
    parser.add_argument("--num-requests", type=int, default=1000, help="requests in workloads b and e")
    parser.add_argument("--hf-requests", type=int, default=None,
                        help="run HF on only the first N requests of b (it is slow); default: all")
    parser.add_argument("--hf-batch-size", type=int, default=64)
    parser.add_argument("--no-hf", action="store_true", help="skip the HF baseline")
    parser.add_argument("--max-model-len", type=int, default=17408)
    parser.add_argument("--startup", action="store_true",
                        help="also measure load-to-ready with a cold and a warm Triton kernel cache")
    parser.add_argument("--tensor-parallel-size", type=int, default=1,
                        help="GPUs (one process each, from cuda:0) the engine splits the model over")
    parser.add_argument("--compare-sync", action="store_true",
                        help="also run each workload with async scheduling off (rows 'engine sync-sched')")
    parser.add_argument("--engine", action="append", type=json.loads, default=None, metavar="JSON",
                        help="EngineConfig overrides; repeat to run each workload once per setting")
    parser.add_argument("--guided", action="store_true",
                        help="also run each workload with every request JSON-schema-guided (20 schemas, "
                             "benchmarks/guided_schemas.py) and unguided at the guided outputs' lengths; needs a "
                             "tokenizer that can spell JSON (make_random_model.py --tokenizer)")
    parser.add_argument("--quantization", choices=["fp8"], default=None,
                        help="also run every engine setting with FP8 weights (EngineConfig quantization)")
    parser.add_argument("--prompt-logprobs", type=int, default=None, metavar="N",
                        help="also run each workload and setting with every request's prompt scored (N most likely)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    record.add_argument(parser, "engine")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.startup and args.tensor_parallel_size > 1:
        parser.error("--startup reads the weights onto one GPU: run it with --tensor-parallel-size 1")

    cfg = json.loads((Path(args.model) / "config.json").read_text())
    names = args.workloads.split(",")
    runs = [(w, "auto") for w in names if w != "d"]
    if "d" in names:
        runs += [(w, "fp8_e4m3") for w in ("b", "c")] + [(w, "auto") for w in ("b", "c") if w not in names]
    settings = args.engine or [{}]
    if args.quantization:
        settings = [s for base in settings for s in (base, {**base, "quantization": args.quantization})]
    bandwidth = measure_bandwidth()
    rows: list[Row] = []
    notes_guided: list[str] = []
    for workload, kv in runs:
        requests = make_workload(workload, cfg["vocab_size"], args.num_requests)
        for overrides in settings:
            for async_scheduling in (True, False) if args.compare_sync else (True,):
                for scored in (None, args.prompt_logprobs) if args.prompt_logprobs is not None else (None,):
                    rows.append(run_engine(args.model, workload, requests, kv, args.max_model_len,
                                           args.tensor_parallel_size, async_scheduling, overrides,
                                           prompt_logprobs=scored)[0])
                    print(rows[-1], flush=True)
        if args.guided and kv == "auto":
            guided_rows, note = run_guided(args, workload, requests)
            rows += guided_rows
            notes_guided.append(note)
        if not args.no_hf and kv == "auto" and args.tensor_parallel_size == 1:
            subset = requests[:args.hf_requests] if (workload == "b" and args.hf_requests) else requests
            rows.append(run_hf(args.model, workload, subset, args.hf_batch_size))
            print(rows[-1], flush=True)

    # Each rank reads its share of the weights and KV: ideally the bandwidth of all its GPUs together.
    roof = roofline_tok_s(args.model, bandwidth * args.tensor_parallel_size, 128, 256)
    gpus = "" if args.tensor_parallel_size == 1 else f" per GPU, x{args.tensor_parallel_size} GPUs"
    notes = [f"model {cfg.get('hidden_size')}h/{cfg.get('num_hidden_layers')}L",
             f"Measured copy bandwidth {bandwidth / 1e12:.2f} TB/s{gpus}; single-stream roofline for (a) "
             f"{roof:.0f} tok/s"]
    roof_fp8 = None
    if any(r.weights == "fp8" for r in rows):
        roof_fp8 = roofline_tok_s(args.model, bandwidth * args.tensor_parallel_size, 128, 256, fp8=True)
        notes.append(f"FP8-weight single-stream roofline for (a) {roof_fp8:.0f} tok/s")
    notes += target_notes(rows, roof, roof_fp8) + notes_guided
    if args.guided:
        notes.append(compile_times(args.model))
    startup = measure_startup(args.model, args.max_model_len) if args.startup else None
    if startup:
        notes.append(f"load-to-ready {startup['warm']:.1f} s with a warm kernel cache, {startup['cold']:.1f} s cold; "
                     f"reading the weights onto the GPU alone {startup['weights_s']:.1f} s (target: warm <= weights "
                     f"+ 10 s: {'met' if startup['warm'] <= startup['weights_s'] + 10 else 'missed'})")
    table = [table_row(r) for r in rows]
    print(markdown(table))
    print("; ".join(notes))
    gpu = torch.cuda.get_device_name()
    if args.json:
        args.json.write_text(json.dumps({"rows": [asdict(r) for r in rows], "bandwidth": bandwidth,
                                         "roofline_a": roof, "roofline_a_fp8": roof_fp8, "startup": startup,
                                         "gpu": gpu}, indent=1))
    if args.record:
        record.write(args.record, __file__, argv, args, machine(), table, notes)
    return 0


def table_row(r: Row) -> dict:
    return {"system": r.system, "workload": r.workload, "KV": r.kv_dtype, "requests": r.requests,
            "output tok": r.output_tokens, "s": round(r.seconds, 1), "tok/s": round(r.tok_s),
            "TTFT p50 ms": rounded(r.ttft_p50_ms, 1), "TTFT p99 ms": rounded(r.ttft_p99_ms, 1),
            "ITL p50 ms": rounded(r.itl_p50_ms, 1), "ITL p99 ms": rounded(r.itl_p99_ms, 1),
            "peak GB": round(r.peak_mem_gb, 1)}


if __name__ == "__main__":
    raise SystemExit(main())
