"""What the compiler makes of a kernel for a GPU, without the GPU: registers, spills, shared memory and the
instruction mix of its loops, from Triton's own ptxas and cuobjdump on this CPU. The kernels: paged decode
and prefill attention, and skinny_linear's single row (one of a Llama-3-8B layer's projections as the
engine fuses it; per weight, the loop's instructions per thread, what decides whether FP8 weights are
widened as fast as they stream).

The kernel is launched through its public wrapper on CPU tensors with the launch intercepted, so its
signature, specialisation and launch parameters (launch_configs/<family>.json, then --launch) are the
ones the engine would use on that GPU. Registers decide occupancy: an SM holds 65,536, so a
128-thread block of FP8 decode at 168 registers fits 3 times, capped at 128 (maxnreg) 4 times.
Numbers match the GPU's only with its Triton version (the lent H200 runs 3.6.0): run this from a
venv holding that version, torch and the engine's requirements.

    python -m benchmarks.kernel_report --kernel decode --kv-dtype fp8
    python -m benchmarks.kernel_report --kernel prefill --launch '{"BLOCK_N": 64, "num_stages": 2}' --sass /tmp/p.sass
    python -m benchmarks.kernel_report --kernel skinny --weights fp8 --projection down
"""
from __future__ import annotations

import argparse
import collections
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("kernel_report compiles kernels: unset TRITON_INTERPRET")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from benchmarks.bench_kernels import Sizes, layer_weight_shapes  # noqa: E402
from llm_engine.kernels import decode_attention, launch_config, prefill_attention  # noqa: E402
# The module, not the function of the same name that llm_engine.kernels exports: its kernel is patched.
skinny_module = importlib.import_module("llm_engine.kernels.skinny_linear")

TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float8_e4m3fn: "fp8e4nv",
         torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8"}
TOOLS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
# bench_kernels.py's shapes (Llama-3-8B's attention): the report is of the launches it times.
SIZES = Sizes()


class Launch:
    """Stands in for a @triton.jit kernel in its module: records kernel[grid](*args, **kwargs)."""

    def __init__(self):
        self.args = self.kwargs = None

    def __getitem__(self, grid):
        def record(*args, **kwargs):
            self.args, self.kwargs = args, kwargs
        return record


def intercept(module, kernel_name: str, call) -> tuple[triton.runtime.JITFunction, tuple, dict]:
    kernel, launch = getattr(module, kernel_name), Launch()
    setattr(module, kernel_name, launch)
    # Compiled kernels refuse CPU tensors; here nothing runs.
    checked, module.expect_launchable = module.expect_launchable, lambda *args: None
    try:
        call()
    finally:
        setattr(module, kernel_name, kernel)
        module.expect_launchable = checked
    return kernel, launch.args, launch.kwargs


def paged_inputs(batch: int, context: int, kv_dtype: torch.dtype):
    s = SIZES
    blocks = batch * triton.cdiv(context, s.block_size)
    cache = [torch.zeros(blocks, s.block_size, s.kv_heads, s.head_dim, dtype=kv_dtype) for _ in range(2)]
    scales = [torch.ones(blocks, s.kv_heads, s.block_size) for _ in range(2)] if kv_dtype == torch.float8_e4m3fn \
        else [None, None]
    tables = torch.arange(blocks, dtype=torch.int32).view(batch, -1)
    return cache, scales, tables, torch.full((batch,), context, dtype=torch.int32)


def launch_of(kernel: str, kv_dtype: torch.dtype):
    """The kernel and its launch's arguments: decode at workload (b)'s shape, prefill of one 8k prompt."""
    if kernel == "decode":
        batch, context = SIZES.decode_serving
        (k, v), (ks, vs), tables, lens = paged_inputs(batch, context, kv_dtype)
        q = torch.zeros(batch, SIZES.q_heads, SIZES.head_dim, dtype=torch.bfloat16)
        return intercept(decode_attention, "_decode_split_kernel",
                         lambda: decode_attention.paged_decode_attention(q, k, v, tables, lens, 0.1, ks, vs))
    seqs, tokens = SIZES.prefill_long
    (k, v), (ks, vs), tables, lens = paged_inputs(seqs, tokens, kv_dtype)
    q = torch.zeros(seqs * tokens, SIZES.q_heads, SIZES.head_dim, dtype=torch.bfloat16)
    cu_seqlens = torch.arange(seqs + 1, dtype=torch.int32) * tokens
    return intercept(prefill_attention, "_prefill_kernel",
                     lambda: prefill_attention.paged_prefill_attention(q, k, v, tables, cu_seqlens, lens, 0.1, ks, vs))


# How the engine fuses each projection of a layer (llama.py, add_attention_and_mlp and project); "down, gated"
# is the down projection computing the SwiGLU gate itself, as it did before gate_up's swiglu output.
PROJECTIONS = {"qkv": 0, "o": 1, "gate_up": 2, "down": 3, "down, gated": 3}


def skinny_launch_of(projection: str, weights: torch.dtype):
    """skinny_linear's kernel and its launch for one row of `projection` at Llama-3-8B's shape."""
    n, k = layer_weight_shapes(SIZES)[PROJECTIONS[projection]]
    gated = projection == "down, gated"
    x = torch.zeros(1, 2 * k if gated else k, dtype=torch.bfloat16)
    options = {"weight_scale": torch.ones(n) if weights == torch.float8_e4m3fn else None}
    if projection in ("qkv", "gate_up"):
        options.update(norm_weight=torch.ones(k, dtype=torch.bfloat16), eps=1e-5, swiglu=projection == "gate_up")
    else:
        options.update(gated=gated, residual=torch.zeros(1, n, dtype=torch.bfloat16))
    return intercept(skinny_module, "_skinny_linear_kernel",
                     lambda: skinny_module.skinny_linear(x, torch.zeros(n, k, dtype=weights), **options))


def compile_for(kernel, args: tuple, kwargs: dict, arch: int):
    """triton.compile with the signature and specialisation a real launch of these arguments gets."""
    options = {key: kwargs.pop(key) for key in ("num_warps", "num_stages", "maxnreg") if key in kwargs}
    bound = dict(zip(kernel.arg_names, args)) | kwargs
    signature, constants, attrs = {}, {}, {}
    for i, (name, param) in enumerate(zip(kernel.arg_names, kernel.params)):
        value = bound[name]
        if param.is_constexpr:
            signature[name], constants[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + TYPES[value.dtype]
            if not param.do_not_specialize_on_alignment:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[name] = "fp32"
        elif value == 1 and not param.do_not_specialize:
            signature[name], constants[name] = "constexpr", 1
        else:
            signature[name] = "i32" if -2**31 <= value < 2**31 else "i64"
            if value % 16 == 0 and not (param.do_not_specialize or param.do_not_specialize_on_alignment):
                attrs[(i,)] = [["tt.divisibility", 16]]
    source = ASTSource(kernel, signature, constants, attrs)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)


def loops(sass: str) -> list[collections.Counter]:
    """Instruction counts of each loop (a backward branch and what it jumps over), in code order."""
    code = [(int(m[1], 16), m[2].strip()) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    found = []
    for address, text in code:
        target = re.search(r"BRA (?:`\(\.L_x_\d+\) )?0x([0-9a-f]+)", text)
        if target and int(target[1], 16) < address:
            body = [t for a, t in code if int(target[1], 16) <= a <= address]
            found.append(collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0] for t in body))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernel", choices=("decode", "prefill", "skinny"), default="decode")
    parser.add_argument("--kv-dtype", choices=("bf16", "fp8"), default="bf16")
    parser.add_argument("--weights", choices=("bf16", "fp8"), default="fp8", help="skinny: the weights' dtype")
    parser.add_argument("--projection", choices=list(PROJECTIONS), default="down", help="skinny: which one")
    parser.add_argument("--family", default="h200", help="launch_configs/<family>.json (default: h200)")
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (default 90: Hopper)")
    parser.add_argument("--launch", type=json.loads, default={}, help="launch parameters over the family's")
    parser.add_argument("--sass", type=Path, help="also write the SASS here")
    args = parser.parse_args()
    if not (launch_config.CONFIG_DIR / f"{args.family}.json").exists():
        parser.error(f"no launch_configs/{args.family}.json")
    # The wrappers read the launch config of the device they run on: this one has no GPU.
    launch_config._device_family = lambda device: args.family
    kv_dtype = torch.float8_e4m3fn if args.kv_dtype == "fp8" else torch.bfloat16
    weights = torch.float8_e4m3fn if args.weights == "fp8" else torch.bfloat16
    section = "skinny_linear" if args.kernel == "skinny" else f"paged_{args.kernel}_attention"
    with launch_config.override_launch_params(section, **args.launch):
        kernel, call_args, call_kwargs = (skinny_launch_of(args.projection, weights) if args.kernel == "skinny"
                                          else launch_of(args.kernel, kv_dtype))
    compiled = compile_for(kernel, call_args, dict(call_kwargs), args.arch)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        usage = subprocess.run([TOOLS / "cuobjdump", "-res-usage", cubin], capture_output=True, text=True,
                               check=True).stdout
        sass = subprocess.run([TOOLS / "cuobjdump", "-sass", cubin], capture_output=True, text=True, check=True).stdout
    if args.sass:
        args.sass.write_text(sass)
    resources = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", usage))
    launched = {key: call_kwargs[key] for key in ("num_warps", "num_stages", "maxnreg") if key in call_kwargs}
    constants = {key: value for key, value in call_kwargs.items() if key.isupper()}
    what = f"{args.projection}, {args.weights} weights, one row" if args.kernel == "skinny" else f"{args.kv_dtype} KV"
    print(f"{kernel.__name__}, {what}, sm_{args.arch}, Triton {triton.__version__}, "
          f"launch_configs/{args.family}.json{' + ' + json.dumps(args.launch) if args.launch else ''}")
    print(f"  launch {json.dumps(launched)}; constants {json.dumps(constants)}")
    print(f"  registers {resources['REG']}, stack {resources['STACK']} bytes (spills), shared memory "
          f"{compiled.metadata.shared:,} bytes")
    # skinny: each thread's share of a K tile's weights, which its last loop (the projection's) streams
    per_thread = (constants["BLOCK_N"] * constants["BLOCK_K"] / (32 * launched["num_warps"])
                  if args.kernel == "skinny" else None)
    for i, counts in enumerate(loops(sass)):
        top = ", ".join(f"{op} {n}" for op, n in counts.most_common(10))
        share = f" ({sum(counts.values()) / per_thread:.2f} per weight)" if per_thread else ""
        print(f"  loop {i + 1}: {sum(counts.values())} instructions{share}; {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
