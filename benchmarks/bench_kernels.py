r"""Kernel benchmark: each Triton kernel of llm_engine alone, against limits measured in the same run.

Limits: device-to-device copy of a 4 GiB buffer (eager torch copy_), (read + write bytes) / time,
for the memory-bound kernels; bf16 torch.matmul 8192^3 TFLOP/s for prefill attention. Every case
is first checked against its `_ref` torch function on fresh random data (a mismatch aborts the
run), then timed as the median of --reps CUDA-graph replays with the L2 flushed before each, so
the time is the kernels' own and every byte comes from HBM. Bytes counted are the least the
kernel must move. --sweep overrides launch configs through override_launch_params.

Cases (issue targets): decode attention, bf16 KV, B=64 x 4096 (>= 80% of copy bandwidth); FP8 vs
bf16 KV decode at 32k (>= 1.6x), and both at workload (b)'s decode shape (B=512 x 777); causal
prefill 1 x 8192 and 4 x 2048 (>= 400 TFLOP/s, torch SDPA flash on the same q/k/v alongside);
rotary + write_kv_cache bf16/FP8, rms_norm + residual, silu_and_mul (`rms_norm_fp8`, `silu_fp8`: with the
per-token FP8 quantization after it, two kernels against the fused one, for FP8 weights); a layer's four
projections at decode batches of 1, 8 and 16 rows, unfused (cuBLAS and the small kernels) and fused (skinny_linear), so
the launch config's skinny_linear max_rows can be set from the ratio (towards (a)'s 85% of the roofline).
Shapes are Llama-3-8B's: 32 query heads, 8 KV heads, head_dim 128, hidden 4096, MLP 14336.

FP8 weights (issue 25): `fp8_gemm` times a layer's four projections at M = 1 .. 8192 rows three ways,
bf16 torch matmul (cuBLAS), W8A8 through the Triton FP8 GEMM and through torch._scaled_mm (each with
the per-token activation quantization the engine runs before it), printing TB/s, TFLOP/s and the
floor (the larger of the least bytes over the copy bandwidth and the FLOPs over the measured peak:
bf16 torch.matmul, or torch._scaled_mm 8192^3 for FP8); then which backend to name per row bucket
in the launch config's fp8_gemm section (with --sweep, the Triton tiles too). Their check: the exact
product of the quantized operands on every row tile, within fp8_gemm_error_bound's model of the GEMM
that ran (float32 sums; Hopper's fast accumulation on its FP8 tensor cores and in cuBLAS, whose error
grows with K), not one atol and rtol for all shapes. `layer_small_batch_fp8`
times the fused small-batch projections (skinny_linear) with FP8 weights against bf16 ones, against the
SwiGLU gate computed in the down projection's prologue instead of after gate_up ("gate in down": the
layout before; `layer_small_batch` has the same pair in bf16), against the e4m3 tiles loaded 16 to a
thread ("16-byte loads": launch config weight_vector 0, the layout before) and against the unfused FP8
path at M = 1 .. 16 (`layer_single_row_fp8`: its one-row case alone, to sweep the single-row tiles);
`projections_single_row` times each projection alone at one row, bf16 and FP8, so that time = start-up +
bytes / rate can be fitted over their 17-117 MB. `prefill_16k_chunk` is workload (c)'s second prefill
chunk (8192 queries over a 16k context) with bf16 KV, FP8 KV read by the kernel as e4m3 tiles, and FP8 KV
copied to a bf16 scratch cache first (the launch config's dequantize_min_tokens: which of the two FP8 ways
to take).

    python -m benchmarks.bench_kernels --json /tmp/kernels.json
    python -m benchmarks.bench_kernels --sweep --cases decode,decode_32k   # best launch configs
    python -m benchmarks.bench_kernels --smoke                              # CPU interpreter, checks only
    python -m benchmarks.bench_kernels --cases fp8_gemm,layer_small_batch_fp8 --sweep  # FP8 weights
    python -m benchmarks.bench_kernels --cases fp8_gemm --fp8-rows 256 --sweep  # one row bucket's tiles
    ncu --clock-control none -k regex:_decode_split_kernel --set full -o /tmp/decode \
        python -m benchmarks.bench_kernels --cases decode_serving --launches 1  # each kernel under a profiler
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace

# Triton reads this when the @triton.jit kernels are defined, i.e. on import: set it first.
if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from triton.runtime.errors import OutOfResources  # noqa: E402

from llm_engine import kernels as K  # noqa: E402
from llm_engine.kernels.decode_attention import _choose_num_splits  # noqa: E402
from llm_engine.kernels.fp8_gemm import accumulation_model, scaled_mm_fits  # noqa: E402
from llm_engine.kernels.launch_config import launch_params, launch_params_for_rows, override_launch_params  # noqa: E402
from llm_engine.model.layers.rotary_embedding import compute_cos_sin_cache  # noqa: E402

from benchmarks import record  # noqa: E402
from benchmarks.provenance import source_commit  # noqa: E402
from benchmarks.table import markdown, rounded  # noqa: E402

# Seconds of back-to-back launches before timing: an idle GPU (while a kernel compiles) runs at
# lower clocks until it has been busy for a while.
WARMUP_S = 0.2
BF16 = torch.bfloat16
FP8 = torch.float8_e4m3fn


@dataclass(frozen=True)
class Sizes:
    q_heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    block_size: int = 16
    decode: tuple[int, int] = (64, 4096)  # batch, context
    decode_long: tuple[int, int] = (16, 32768)
    # Workload (b)'s steps (bench_engine.py): 512 decodes of ~780 tokens, the last page partial.
    decode_serving: tuple[int, int] = (512, 777)
    prefill_long: tuple[int, int] = (1, 8192)  # sequences, tokens each
    prefill_batch: tuple[int, int] = (4, 2048)
    tokens: int = 8192
    hidden: int = 4096
    gate_up: int = 28672  # [gate | up], 2 x 14336
    fp8_gemm_rows: tuple[int, ...] = (1, 16, 64, 256, 1024, 2048, 4096, 8192)  # decode, batches, prefill chunks
    fp8_small_batches: tuple[int, ...] = (1, 2, 4, 8, 16)


# Partial blocks, partial tiles and masked rows, small enough for the interpreter.
SMOKE = Sizes(q_heads=8, kv_heads=2, head_dim=32, decode=(3, 40), decode_long=(2, 100), decode_serving=(4, 37),
              prefill_long=(1, 50), prefill_batch=(3, 20), tokens=24, hidden=96, gate_up=160,
              fp8_gemm_rows=(1, 5, 33), fp8_small_batches=(1, 3))


@dataclass
class Bench:
    case: str
    shape: str
    kernel: str | None  # its section in launch_configs/*.json; None for a torch reference
    call: Callable[..., object]  # the launch; keyword arguments go to the wrapper
    check: Callable[[object], None]  # raises unless call()'s result matches the reference
    bytes: int = 0  # the least HBM traffic of one call
    flops: int = 0
    goal: tuple[str, Callable[[Row], bool]] | None = None
    candidates: list[tuple[dict, dict]] = field(default_factory=list)  # (launch params, kwargs)
    # A GEMM with both bytes and flops: judged against its floor, max(bytes / copy BW, flops / peak).
    peak: str = "bf16"  # "fp8": the FP8 matmul peak


@dataclass
class Row:
    case: str
    shape: str
    time_us: float | None
    achieved: float
    unit: str
    pct_of_limit: float
    target: str = "-"
    met: bool | None = None
    bytes: int = 0
    flops: int = 0
    floor_us: float | None = None  # a GEMM's: the larger of its bytes' and its FLOPs' times at the limits


@dataclass
class Limits:
    bandwidth: float  # bytes/s
    tflops: float
    fp8_tflops: float | None = None  # torch._scaled_mm 8192^3, row-wise scales (when FP8 cases run)


def randn(gen, *shape, dtype=BF16):
    return torch.randn(*shape, generator=gen, device=gen.device, dtype=dtype)


def expect_close(case, actual, expected, atol=2e-2, rtol=2e-2):
    # bf16 rounds q, k, v and the softmax weights to 8 mantissa bits; the refs work in float32.
    torch.testing.assert_close(actual.float(), expected.float(), atol=atol, rtol=rtol,
                               msg=lambda m: f"{case}: kernel does not match its reference\n{m}")


def expect_within(case, actual, exact, bound):
    """|actual - exact| <= bound per element: an error model's bound (fp8_gemm_error_bound's), absolute per
    element, so an element near zero is held to its terms' roundings, not to a relative tolerance."""
    error = (actual.double() - exact).abs()
    beyond = error > bound
    if beyond.any():
        row, col = divmod(int((error / bound).argmax()), actual.shape[1])
        raise AssertionError(f"{case}: kernel does not match its reference: {int(beyond.sum())} of {actual.numel()} "
                             f"elements beyond the error bound; worst ({row}, {col}): {actual[row, col].item()} vs "
                             f"exact {exact[row, col].item()}, |error| {error[row, col].item():.3g} > "
                             f"{bound[row, col].item():.3g}")


def expect_close_norm(case, actual, expected, bound):
    """||actual - expected|| / ||expected|| <= bound (for chains that quantize activations)."""
    error = float((actual.float() - expected.float()).norm() / expected.float().norm())
    if not error <= bound:
        raise AssertionError(f"{case}: kernel does not match its reference: relative error {error:.3g} > {bound}")


def to_paged(gen, block_size, *dense):
    """Dense [B, S, Hkv, D] tensors -> their caches [num_blocks, block_size, Hkv, D] and one shared
    block table [B, cdiv(S, block_size)], blocks shuffled as a long-running engine leaves them."""
    batch, seq, heads, dim = dense[0].shape
    per_seq = triton.cdiv(seq, block_size)
    order = torch.randperm(batch * per_seq, generator=gen, device=gen.device)
    caches = []
    for x in dense:
        padded = x.new_zeros(batch, per_seq * block_size, heads, dim)
        padded[:, :seq] = x
        cache = torch.empty(batch * per_seq, block_size, heads, dim, dtype=x.dtype, device=x.device)
        cache[order] = padded.view(-1, block_size, heads, dim)
        caches.append(cache)
    return (*caches, order.view(batch, per_seq).to(torch.int32))


def decode_bench(case, s: Sizes, batch, context, kv_dtype, gen, goal=None) -> Bench:
    q = randn(gen, batch, s.q_heads, s.head_dim)
    dense = [randn(gen, batch, context, s.kv_heads, s.head_dim) for _ in range(2)]
    k_cache, v_cache, block_tables = to_paged(gen, s.block_size, *dense)
    del dense
    k_scale = v_scale = None
    if kv_dtype == FP8:
        (k_cache, k_scale), (v_cache, v_scale) = K.quantize_fp8_cache_ref(k_cache), K.quantize_fp8_cache_ref(v_cache)
    context_lens = torch.full((batch,), context, dtype=torch.int32, device=gen.device)
    args = (q, k_cache, v_cache, block_tables, context_lens, s.head_dim**-0.5, k_scale, v_scale)
    expected = K.paged_decode_attention_ref(*args)
    # Shown so that a sweep's best num_splits can be set against the heuristic's pick.
    auto_splits = _choose_num_splits(batch, s.kv_heads, block_tables.shape[1] * s.block_size,
                                     launch_params("paged_decode_attention", q.device, q.dtype, k_cache.dtype))
    token_head_bytes = s.head_dim * k_cache.element_size() + (4 if k_scale is not None else 0)
    kv_bytes = 2 * batch * context * s.kv_heads * token_head_bytes
    # Every tile shape with the heuristic's splits, then every split count with the configured tile.
    tiles = [({"BLOCK_N": n, "num_warps": w, "num_stages": st, "maxnreg": r}, {})
             for n, w, st, r in itertools.product((32, 64, 128), (4, 8), (2, 3, 4), (None, 80, 128))]
    # Programs of one or two warps reduce a tile's softmax within a warp, with no barrier between warps
    # (fewer instructions per token under Triton 3.6: kernel_report); as many warps per SM need more programs.
    tiles += [({"BLOCK_N": n, "num_warps": w, "num_stages": st, "maxnreg": r, "target_programs": 2048 // w}, {})
              for n, w, st, r in itertools.product((32, 64), (1, 2), (2, 3), (None, 128))]
    tiles += [({}, {"num_splits": sp}) for sp in (1, 2, 4, 8, 16, 32)]
    return Bench(
        case, f"B={batch} ctx={context} {s.q_heads}/{s.kv_heads}x{s.head_dim} splits={auto_splits}",
        "paged_decode_attention",
        call=lambda **kw: K.paged_decode_attention(*args, **kw),
        check=lambda out: expect_close(case, out, expected),
        bytes=kv_bytes + 2 * q.nbytes, goal=goal,
        candidates=tiles,
    )


def prefill_benches(s: Sizes, seqs, seq_len, gen, tune: bool, kv_dtype=BF16) -> list[Bench]:
    """Causal prefill over a paged cache; with bf16 KV also torch SDPA flash on the same values (the
    target is bf16's), with FP8 KV the e4m3 cache of the same values."""
    fp8 = kv_dtype == FP8
    case = f"prefill {'fp8 ' if fp8 else ''}{seqs}x{seq_len}"
    shape = f"{seqs}x{seq_len} causal {s.q_heads}/{s.kv_heads}x{s.head_dim}"
    scale = s.head_dim**-0.5
    q = randn(gen, seqs * seq_len, s.q_heads, s.head_dim)
    k, v = (randn(gen, seqs, seq_len, s.kv_heads, s.head_dim) for _ in range(2))
    k_cache, v_cache, block_tables = to_paged(gen, s.block_size, k, v)
    scales = ()
    if fp8:
        (k_cache, k_scale), (v_cache, v_scale) = K.quantize_fp8_cache_ref(k_cache), K.quantize_fp8_cache_ref(v_cache)
        scales = (k_scale, v_scale)
    cu_seqlens = torch.arange(seqs + 1, dtype=torch.int32, device=gen.device) * seq_len
    context_lens = torch.full((seqs,), seq_len, dtype=torch.int32, device=gen.device)
    args = (q, k_cache, v_cache, block_tables, cu_seqlens, context_lens, scale, *scales)
    expected = K.paged_prefill_attention_ref(*args)
    flops = seqs * 2 * 2 * seq_len**2 // 2 * s.q_heads * s.head_dim  # 2 matmuls, causal half
    tiles = itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3))

    def call(**_):  # FP8: the kernel on e4m3 tiles, whatever dequantize_min_tokens the launch config has
        with override_launch_params("paged_prefill_attention", dequantize_min_tokens=None):
            return K.paged_prefill_attention(*args)

    benches = [
        Bench(case, shape, "paged_prefill_attention", call=call,
              check=lambda out: expect_close(case, out, expected),
              flops=flops, goal=None if fp8 else (">= 400 TFLOP/s", lambda r: r.achieved >= 400),
              candidates=[({"BLOCK_M": m, "BLOCK_N": n, "num_warps": w, "num_stages": st}, {})
                          for m, n, w, st in tiles] if tune else []),
    ]
    if fp8:
        return benches
    # SDPA on the same values, dense [B, H, S, D]; k/v repeated to the query heads since not
    # every flash build takes GQA (prefill is compute-bound, so the extra reads barely count).
    group = s.q_heads // s.kv_heads
    dq = q.view(seqs, seq_len, s.q_heads, s.head_dim).transpose(1, 2).contiguous()
    dk, dv = (x.transpose(1, 2).repeat_interleave(group, dim=1).contiguous() for x in (k, v))
    expected_dense = expected.view(dq.transpose(1, 2).shape).transpose(1, 2)

    def sdpa():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(dq, dk, dv, is_causal=True, scale=scale)

    return benches + [
        Bench(f"torch SDPA flash {seqs}x{seq_len}", shape + " (k/v repeated)", None, call=sdpa,
              check=lambda out: expect_close(f"SDPA {seqs}x{seq_len}", out, expected_dense), flops=flops),
    ]


def rotary_write_kv_bench(s: Sizes, cache_dtype, gen) -> Bench:
    case = f"rotary + write_kv_cache {'fp8' if cache_dtype == FP8 else 'bf16'}"
    n = s.tokens
    q = randn(gen, n, s.q_heads, s.head_dim)
    k, v = (randn(gen, n, s.kv_heads, s.head_dim) for _ in range(2))
    positions = torch.arange(n, device=gen.device)
    table = compute_cos_sin_cache(s.head_dim, n, 500000.0, None).to(gen.device)
    used = triton.cdiv(n, s.block_size)
    blocks = torch.randperm(2 * used, generator=gen, device=gen.device)[:used]  # a cache half in use
    slots = (blocks[:, None] * s.block_size + torch.arange(s.block_size, device=gen.device)).flatten()[:n]
    caches = [randn(gen, 2 * used, s.block_size, s.kv_heads, s.head_dim) for _ in range(2)]
    scales = [None, None]
    if cache_dtype == FP8:
        (caches[0], scales[0]), (caches[1], scales[1]) = (K.quantize_fp8_cache_ref(c) for c in caches)
    expected = [None if t is None else t.clone() for t in (*caches, *scales)]
    q_ref = K.rotary_and_write_kv_ref(q, k, v, positions, table, *expected[:2], slots, *expected[2:])

    def check(q_out):
        expect_close(case, q_out, q_ref)
        if cache_dtype != FP8:
            for cache, ref in zip(caches, expected):
                expect_close(case, cache, ref)
            return
        for cache, scale, ref, ref_scale in zip(caches, scales, expected[:2], expected[2:]):
            expect_close(case, scale, ref_scale, atol=0, rtol=2**-7)
            # Within one e4m3 step plus a subnormal step, as tests/engine/test_kernels_paged.py.
            expect_close(case, K.dequantize_fp8_cache_ref(cache, scale), K.dequantize_fp8_cache_ref(ref, ref_scale),
                         atol=float(ref_scale.max()) * 2**-9, rtol=2**-3)

    written = n * s.kv_heads * (s.head_dim * caches[0].element_size() + (4 if cache_dtype == FP8 else 0))
    return Bench(case, f"T={n} q {s.q_heads}x{s.head_dim} kv {s.kv_heads}x{s.head_dim} block={s.block_size}",
                 "rotary_and_write_kv",
                 call=lambda: K.rotary_and_write_kv(q, k, v, positions, table, *caches, slots, *scales), check=check,
                 bytes=2 * q.nbytes + k.nbytes + v.nbytes + 2 * written + slots.nbytes + positions.nbytes,
                 candidates=[({"num_warps": w}, {}) for w in (1, 2, 4, 8)])


def rms_norm_bench(s: Sizes, gen) -> Bench:
    x, residual = (randn(gen, s.tokens, s.hidden) for _ in range(2))
    weight = randn(gen, s.hidden)
    eps = 1e-5
    start = residual.clone()  # the op adds x into residual in place: each timed call drifts it
    expected = K.rms_norm_ref(x, weight, eps, start.clone())

    def check(_):  # a call from the same start, under the launch parameters being checked
        for actual, ref in zip(K.rms_norm(x, weight, eps, start.clone()), expected):
            expect_close("rms_norm + residual", actual, ref)

    return Bench("rms_norm + residual", f"[{s.tokens}, {s.hidden}]", "rms_norm",
                 call=lambda: K.rms_norm(x, weight, eps, residual), check=check,
                 bytes=4 * x.nbytes + weight.nbytes,  # x, residual in; out, residual (in place) out
                 candidates=[({"num_warps": w}, {}) for w in (2, 4, 8, 16, 32)])


def silu_bench(s: Sizes, gen) -> Bench:
    x = randn(gen, s.tokens, s.gate_up)
    expected = K.silu_and_mul_ref(x)
    return Bench("silu_and_mul", f"[{s.tokens}, {s.gate_up}]", "silu_and_mul",
                 call=lambda: K.silu_and_mul(x), check=lambda out: expect_close("silu_and_mul", out, expected),
                 bytes=x.nbytes * 3 // 2,
                 candidates=[({"BLOCK_I": b, "num_warps": w}, {})
                             for b, w in itertools.product((512, 1024, 2048, 4096), (2, 4, 8, 16))])


def silu_fp8_benches(s: Sizes, gen) -> list[Bench]:
    """The down projection's input with FP8 weights: silu_and_mul then the per-token quantizer, and the
    one kernel that does both (silu_and_mul_quantize_fp8); its bytes and scales must be the pair's."""
    x = randn(gen, s.tokens, s.gate_up)
    expected = K.quantize_fp8_per_token(K.silu_and_mul(x))

    def check(result):
        if not (torch.equal(result[0].view(torch.uint8), expected[0].view(torch.uint8))
                and torch.equal(result[1], expected[1])):
            raise AssertionError("silu_and_mul_quantize_fp8: not the bytes of silu_and_mul then the quantizer")

    least = x.nbytes + x.nbytes // 4 + 4 * s.tokens  # [gate | up] in; e4m3 values and scales out
    return [Bench("silu + quantize fp8, two kernels", f"[{s.tokens}, {s.gate_up}]", None,
                  call=lambda: K.quantize_fp8_per_token(K.silu_and_mul(x)), check=check, bytes=least),
            Bench("silu + quantize fp8, fused", f"[{s.tokens}, {s.gate_up}]", "silu_and_mul_quantize_fp8",
                  call=lambda: K.silu_and_mul_quantize_fp8(x), check=check, bytes=least,
                  candidates=[({"BLOCK_K": b, "num_warps": w}, {})
                              for b, w in itertools.product((2048, 4096, 8192, 16384), (4, 8, 16))])]


def rms_norm_fp8_benches(s: Sizes, gen) -> list[Bench]:
    """A projection's input with FP8 weights: rms_norm + residual then the per-token quantizer, and the one
    kernel that does both (rms_norm_quantize_fp8); its bytes and scales must be the pair's."""
    x, residual = (randn(gen, s.tokens, s.hidden) for _ in range(2))
    weight = randn(gen, s.hidden)
    start = residual.clone()  # the residual add is in place: each check starts from the same residual

    def check(_):
        """The pair's bytes and scales exactly, the pair run under the launch parameters being checked."""
        values, scale = K.rms_norm_quantize_fp8(x, weight, 1e-5, start.clone())
        expected = K.quantize_fp8_per_token(K.rms_norm(x, weight, 1e-5, start.clone())[0])
        apart = values.view(torch.uint8) != expected[0].view(torch.uint8)
        if apart.any() or not torch.equal(scale, expected[1]):
            raise AssertionError(f"rms_norm_quantize_fp8: not the bytes of rms_norm then the quantizer: "
                                 f"{int(apart.sum())} of {values.numel()} bytes and "
                                 f"{int((scale != expected[1]).sum())} of {scale.numel()} scales differ")

    least = 3 * x.nbytes + x.nbytes // 2 + weight.nbytes + 4 * s.tokens  # x, residual in; residual, e4m3 out
    return [Bench("rms_norm + quantize fp8, two kernels", f"[{s.tokens}, {s.hidden}]", None,
                  call=lambda: K.quantize_fp8_per_token(K.rms_norm(x, weight, 1e-5, residual)[0]), check=check,
                  bytes=least),
            Bench("rms_norm + quantize fp8, fused", f"[{s.tokens}, {s.hidden}]", "rms_norm",
                  call=lambda: K.rms_norm_quantize_fp8(x, weight, 1e-5, residual), check=check, bytes=least,
                  candidates=[({"num_warps": w}, {}) for w in (2, 4, 8, 16, 32)])]


def layer_projection_benches(s: Sizes, rows: int, gen) -> list[Bench]:
    """A decoder layer's four projections at a small decode batch (attention left out: the same either
    way), as the engine runs them unfused (cuBLAS, RMSNorm + residual, SiLU-and-mul kernels: 7 launches
    plus cuBLAS's split-K reduces) and fused (skinny_linear: 4 launches). Bytes: the weights, read once."""
    linear = torch.nn.functional.linear
    q_size, kv_size = s.q_heads * s.head_dim, s.kv_heads * s.head_dim
    eps = 1e-5
    w_qkv, w_o, w_gate_up, w_down = (randn(gen, n, k) / k**0.5 for n, k in (
        (q_size + 2 * kv_size, s.hidden), (s.hidden, q_size), (s.gate_up, s.hidden), (s.hidden, s.gate_up // 2)))
    norm1, norm2 = randn(gen, s.hidden), randn(gen, s.hidden)
    attn_out, mlp_out, start = randn(gen, rows, q_size), randn(gen, rows, s.hidden), randn(gen, rows, s.hidden)
    residual = start.clone()  # updated in place by each call: timed calls drift it, checks start afresh

    def unfused(residual, ops=K):
        """From the previous layer's MLP output, not yet added (the engine adds it in the next norm)."""
        hidden, _ = ops.rms_norm(mlp_out, norm1, eps, residual)
        qkv = linear(hidden, w_qkv)
        hidden, _ = ops.rms_norm(linear(attn_out, w_o), norm2, eps, residual)
        return qkv, linear(ops.silu_and_mul(linear(hidden, w_gate_up)), w_down)

    def fused(residual, skinny_linear=K.skinny_linear, gate_in_down=False):
        """From the complete residual; the MLP output goes into it. The SwiGLU gate after gate_up (as the
        engine runs it), or in the down projection's prologue (gate_in_down: the layout before)."""
        qkv = skinny_linear(residual, w_qkv, norm_weight=norm1, eps=eps)
        skinny_linear(attn_out, w_o, residual=residual)
        mlp_in = skinny_linear(residual, w_gate_up, norm_weight=norm2, eps=eps, swiglu=not gate_in_down)
        return qkv, skinny_linear(mlp_in, w_down, gated=gate_in_down, residual=residual)

    unfused_expected = unfused(start.clone(), SimpleNamespace(rms_norm=K.rms_norm_ref, silu_and_mul=K.silu_and_mul_ref))
    fused_expected = fused(start.clone(), K.skinny_linear_ref)

    def check(chain, expected):
        def compare(_):  # a call from the same start, under the launch parameters being checked
            for actual, ref in zip(chain(start.clone()), expected):
                # Four projections and their bf16 roundings in a row (the interpreter truncates them).
                expect_close(f"layer projections b={rows}", actual, ref, atol=6e-2, rtol=3e-2)
        return compare

    weight_bytes = sum(w.nbytes for w in (w_qkv, w_o, w_gate_up, w_down))
    shape = f"M={rows}, hidden {s.hidden}, qkv {q_size + 2 * kv_size}, MLP {s.gate_up // 2}"
    return [
        Bench(f"layer projections b={rows} unfused", shape, None, call=lambda: unfused(residual),
              check=check(unfused, unfused_expected), bytes=weight_bytes),
        Bench(f"layer projections b={rows} fused", shape, "skinny_linear", call=lambda: fused(residual),
              check=check(fused, fused_expected), bytes=weight_bytes,
              candidates=[({"single_row_on_cuda_cores": True, "BLOCK_N": n, "BLOCK_K": k, "num_warps": w,
                            "num_stages": 2}, {})  # overriding the "single_row" entry's tiles
                          for n, k, w in itertools.product((4, 8, 16), (512, 1024, 2048), (2, 4, 8))] if rows == 1 else
                         [({"BLOCK_N": n, "BLOCK_K": k, "num_warps": w, "num_stages": st}, {})
                          for n, k, w, st in itertools.product((16, 32, 64), (128, 256), (4, 8), (3, 4))]),
        Bench(f"layer projections b={rows} fused, gate in down", shape, "skinny_linear",
              call=lambda: fused(residual, gate_in_down=True),
              check=check(lambda r: fused(r, gate_in_down=True), fused_expected), bytes=weight_bytes),
    ]


FP8_BACKENDS = ("triton", "scaled_mm")


def layer_weight_shapes(s: Sizes) -> list[tuple[int, int]]:
    """(N, K) of a decoder layer's four projections: qkv, o, gate_up, down."""
    q_size, kv_size = s.q_heads * s.head_dim, s.kv_heads * s.head_dim
    return [(q_size + 2 * kv_size, s.hidden), (s.hidden, q_size), (s.gate_up, s.hidden), (s.hidden, s.gate_up // 2)]


def fp8_gemm_tiles(rows: int) -> list[tuple[dict, dict]]:
    """Triton FP8 GEMM tiles a sweep tries for `rows` (launch_configs' fp8_gemm keys)."""
    if rows <= 64:
        block_ms = sorted({max(16, min(64, triton.next_power_of_2(rows))), 64})
        tiles = itertools.product(block_ms, (32, 64, 128), (128, 256), (4,), (3, 4), (1,))
    else:
        tiles = itertools.product((64, 128), (128, 256), (64, 128), (4, 8), (3, 4), (8,))
    return [({"backend": "triton", "BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "num_warps": w, "num_stages": st,
              "GROUP_M": g}, {}) for m, n, k, w, st, g in tiles]


def fp8_check_rows(rows: int, device) -> torch.Tensor:
    """The rows an FP8 GEMM's check compares: all of up to 256, else one in each block of 16 (at a different
    offset in each) and the last: every row tile of every config, at a sixteenth of the exact products' cost."""
    if rows <= 256:
        return torch.arange(rows, device=device)
    blocks = torch.arange(rows // 16, device=device)
    return torch.cat([blocks * 16 + blocks * 7 % 16, torch.tensor([rows - 1], device=device)]).unique()


def fp8_gemm_benches(s: Sizes, rows: int, gen) -> list[Bench]:
    """A layer's four projections of `rows` rows: bf16 F.linear, and W8A8 (per-token quantization, then the
    GEMM) by the Triton kernel and by torch._scaled_mm, each through the engine's fp8_linear with the
    backend forced. Least bytes: the weights once (2 or 1 bytes, plus 4 per row's scale), x in bf16 once,
    the bf16 output once (the quantized x's round trip is the FP8 path's extra)."""
    shapes = layer_weight_shapes(s)
    xs = [randn(gen, rows, k) for _, k in shapes]
    weights = [randn(gen, n, k) / k**0.5 for n, k in shapes]
    quantized = [K.quantize_fp8_weight_ref(w) for w in weights]
    flops = sum(2 * rows * n * k for n, k in shapes)
    io_bytes = sum(2 * rows * (n + k) for n, k in shapes)
    bf16_bytes = io_bytes + sum(2 * n * k for n, k in shapes)
    fp8_bytes = io_bytes + sum(n * k + 4 * n for n, k in shapes)
    shape = f"M={rows}, hidden {s.hidden}, MLP {s.gate_up // 2}"
    linear = torch.nn.functional.linear
    bf16_expected = [(x.float() @ w.float().T) for x, w in zip(xs, weights)]
    # FP8: the exact product of the quantized operands and fp8_gemm_error_bound for the GEMM that ran (float32
    # sums for 16- and 32-row tiles, Hopper's fast accumulation, growing with K, for the FP8 tensor cores and
    # cuBLAS), on the rows fp8_check_rows picks; x quantized as the reference does (the kernel matches it bit
    # for bit: a scale an ulp off moves whole e4m3 steps, beyond the bound).
    picked = fp8_check_rows(rows, xs[0].device)
    quantized_x = [K.quantize_fp8_per_token_ref(x[picked]) for x in xs]
    exact_and_bounds = {}

    def check(expected, name):
        def compare(outs):
            for out, ref in zip(outs, expected):
                expect_close(name, out, ref, atol=3e-2, rtol=2e-2)
        return compare

    def fp8_check(backend, name):
        def compare(outs):
            for i, (out, x, (a, a_scale), (q, scale)) in enumerate(zip(outs, xs, quantized_x, quantized)):
                params = {**launch_params_for_rows("fp8_gemm", x.device, rows), "backend": backend}
                if backend == "scaled_mm" and not scaled_mm_fits(x, q, x.dtype):
                    params["backend"] = "triton"
                model = accumulation_model(x.device, params)
                key = (i, tuple(sorted(model.items())))
                if key not in exact_and_bounds:
                    exact_and_bounds[key] = K.fp8_gemm_error_bound(a, a_scale, q, scale, out_dtype=out.dtype, **model)
                expect_within(name, out[picked], *exact_and_bounds[key])
        return compare

    def fp8_chain(backend):
        def call(**_):
            with override_launch_params("fp8_gemm", backend=backend):
                return [K.fp8_linear(x, q, scale) for x, (q, scale) in zip(xs, quantized)]
        return call

    benches = [Bench(f"layer GEMMs M={rows} bf16", shape, None,
                     call=lambda: [linear(x, w) for x, w in zip(xs, weights)],
                     check=check(bf16_expected, f"bf16 M={rows}"), bytes=bf16_bytes, flops=flops)]
    for backend in FP8_BACKENDS:
        benches.append(Bench(f"layer GEMMs M={rows} fp8 {backend}", shape, "fp8_gemm" if backend == "triton" else None,
                             call=fp8_chain(backend), check=fp8_check(backend, f"fp8 {backend} M={rows}"),
                             bytes=fp8_bytes, flops=flops, peak="fp8",
                             candidates=fp8_gemm_tiles(rows) if backend == "triton" else []))
    return benches


def layer_projection_fp8_benches(s: Sizes, rows: int, gen) -> list[Bench]:
    """A layer's four projections at a small decode batch with the norm, gate and residual fused in
    (skinny_linear), bf16 weights against FP8 ones; and FP8 unfused (rms_norm, fp8_linear, silu_and_mul)."""
    shapes = layer_weight_shapes(s)
    eps = 1e-5
    weights = [randn(gen, n, k) / k**0.5 for n, k in shapes]
    quantized = [K.quantize_fp8_weight_ref(w) for w in weights]
    norm1, norm2 = randn(gen, s.hidden), randn(gen, s.hidden)
    q_size = s.q_heads * s.head_dim
    attn_out, mlp_out, start = randn(gen, rows, q_size), randn(gen, rows, s.hidden), randn(gen, rows, s.hidden)
    residual = start.clone()

    def fused(residual, fp8, skinny_linear=K.skinny_linear, gate_in_down=False):
        """As the engine runs them (the SwiGLU gate after gate_up), or with the gate computed in the down
        projection's prologue instead (gate_in_down, the layout before: both measured in one run)."""
        (w_qkv, w_o, w_gu, w_down) = [q for q, _ in quantized] if fp8 else weights
        sc = [scale for _, scale in quantized] if fp8 else [None] * 4
        qkv = skinny_linear(residual, w_qkv, norm_weight=norm1, eps=eps, weight_scale=sc[0])
        skinny_linear(attn_out, w_o, residual=residual, weight_scale=sc[1])
        mlp_in = skinny_linear(residual, w_gu, norm_weight=norm2, eps=eps, weight_scale=sc[2], swiglu=not gate_in_down)
        return qkv, skinny_linear(mlp_in, w_down, gated=gate_in_down, residual=residual, weight_scale=sc[3])

    def unfused_fp8(residual, ops=K):
        (qkv_w, qkv_s), (o_w, o_s), (gu_w, gu_s), (d_w, d_s) = quantized
        hidden, _ = ops.rms_norm(mlp_out, norm1, eps, residual)
        qkv = ops.fp8_linear(hidden, qkv_w, qkv_s)
        hidden, _ = ops.rms_norm(ops.fp8_linear(attn_out, o_w, o_s), norm2, eps, residual)
        return qkv, ops.fp8_linear(ops.silu_and_mul(ops.fp8_linear(hidden, gu_w, gu_s)), d_w, d_s)

    fp8_expected = fused(start.clone(), True, K.skinny_linear_ref)  # the same for every fused FP8 layout
    expected = {
        "bf16": fused(start.clone(), False, K.skinny_linear_ref),
        "fp8": fp8_expected, "fp8 gate in down": fp8_expected, "fp8 16-byte loads": fp8_expected,
        "fp8 unfused": unfused_fp8(start.clone(), SimpleNamespace(rms_norm=K.rms_norm_ref, fp8_linear=K.fp8_linear_ref,
                                                                  silu_and_mul=K.silu_and_mul_ref)),
    }

    def fused_fp8_wide_loads(residual):
        """The e4m3 tiles loaded 16 to a thread (the compiler's choice), rearranged through shared memory."""
        with override_launch_params("skinny_linear", weight_vector=0):
            return fused(residual, True)

    chains = {"bf16": lambda r: fused(r, False), "fp8": lambda r: fused(r, True),
              "fp8 gate in down": lambda r: fused(r, True, gate_in_down=True),
              "fp8 16-byte loads": fused_fp8_wide_loads, "fp8 unfused": unfused_fp8}

    def check(kind):
        def compare(_):
            for actual, ref in zip(chains[kind](start.clone()), expected[kind]):
                name = f"layer projections fp8 b={rows} {kind}"
                if kind == "fp8 unfused":  # a bf16 rounding step apart can quantize one e4m3 step apart (6%),
                    # and the interpreter truncates every bf16 result where torch rounds
                    expect_close_norm(name, actual, ref, 0.1 if os.environ.get("TRITON_INTERPRET") == "1" else 2e-2)
                else:
                    expect_close(name, actual, ref, atol=6e-2, rtol=3e-2)
        return compare

    bf16_bytes = sum(2 * n * k for n, k in shapes)
    fp8_bytes = sum(n * k + 4 * n for n, k in shapes)
    shape = f"M={rows}, hidden {s.hidden}, qkv {shapes[0][0]}, MLP {s.gate_up // 2}"
    single_row = [({"single_row_on_cuda_cores": True, "BLOCK_N": n, "BLOCK_K": k, "num_warps": w, "num_stages": 2}, {})
                  for n, k, w in itertools.product((4, 8, 16), (1024, 2048, 4096), (2, 4, 8))]
    many_rows = [({"BLOCK_N": n, "BLOCK_K": k, "num_warps": w, "num_stages": st}, {})
                 for n, k, w, st in itertools.product((16, 32, 64), (128, 256, 512), (4, 8), (3, 4))]
    return [
        Bench(f"layer projections b={rows} fused {kind}", shape, "skinny_linear" if kind != "fp8 unfused" else None,
              call=lambda kind=kind: chains[kind](residual), check=check(kind),
              bytes=bf16_bytes if kind == "bf16" else fp8_bytes,
              # max_rows 16: the fused path at every row count here, whatever the launch config says
              candidates=[] if kind != "fp8" else (single_row if rows == 1 else many_rows))
        for kind in ("bf16", "fp8", "fp8 gate in down", "fp8 16-byte loads", "fp8 unfused")
    ]


def projection_alone_benches(s: Sizes, gen) -> list[Bench]:
    """Each of a layer's four projections alone at one row (skinny_linear's single row, no fusion), bf16
    against FP8 weights: over their 17-117 MB, time = start-up + bytes / rate splits the two."""
    benches = []
    for name, (n, k) in zip(("qkv", "o", "gate_up", "down"), layer_weight_shapes(s)):
        weight = randn(gen, n, k) / k**0.5
        x = randn(gen, 1, k)
        for kind, (w, scale) in (("bf16", (weight, None)), ("fp8", K.quantize_fp8_weight_ref(weight))):
            expected = K.skinny_linear_ref(x, w, weight_scale=scale)

            def check(actual, expected=expected, case=f"{name} b=1 {kind}"):
                expect_close(case, actual, expected, atol=6e-2, rtol=3e-2)

            benches.append(Bench(f"projection {name} b=1 {kind}", f"N={n}, K={k}", "skinny_linear",
                                 call=lambda x=x, w=w, scale=scale: K.skinny_linear(x, w, weight_scale=scale),
                                 check=check, bytes=n * k * w.element_size() + (4 * n if scale is not None else 0)))
    return benches


def prefill_chunk_benches(s: Sizes, gen) -> list[Bench]:
    """Workload (c)'s second prefill chunk: the last 8192 of a 16384-token prompt over its whole context,
    bf16 KV against FP8 KV (the prefill kernel reads e4m3 tiles: conversion in registers, smaller tiles)."""
    chunk, context = s.prefill_long[1], 2 * s.prefill_long[1]
    scale = s.head_dim**-0.5
    q = randn(gen, chunk, s.q_heads, s.head_dim)
    k, v = (randn(gen, 1, context, s.kv_heads, s.head_dim) for _ in range(2))
    k_cache, v_cache, block_tables = to_paged(gen, s.block_size, k, v)
    cu_seqlens = torch.tensor([0, chunk], dtype=torch.int32, device=gen.device)
    context_lens = torch.tensor([context], dtype=torch.int32, device=gen.device)
    # The chunk's queries see the first half whole and the second causally: 3/4 of a full square's work.
    flops = 2 * 2 * chunk * (context - chunk // 2) * s.q_heads * s.head_dim
    (kc, ks), (vc, vs) = K.quantize_fp8_cache_ref(k_cache), K.quantize_fp8_cache_ref(v_cache)
    shape = f"1 x {chunk} queries, context {context}, {s.q_heads}/{s.kv_heads}x{s.head_dim}"
    benches = []
    # (name, caches and scales, dequantize_min_tokens): bf16 KV; FP8 KV read as e4m3 tiles; FP8 KV copied
    # to a bf16 scratch cache first (kv_store.dequantize_kv_blocks), then the bf16 kernel.
    for kind, kv, threshold in (("bf16", (k_cache, v_cache), None), ("fp8", (kc, vc, ks, vs), None),
                                ("fp8 dequantized first", (kc, vc, ks, vs), 0)):
        args = (q, kv[0], kv[1], block_tables, cu_seqlens, context_lens, scale, *kv[2:])
        expected = K.paged_prefill_attention_ref(*args)
        name = f"prefill chunk {kind} 8k of 16k"

        def call(args=args, threshold=threshold, **_):
            with override_launch_params("paged_prefill_attention", dequantize_min_tokens=threshold):
                return K.paged_prefill_attention(*args)

        benches.append(Bench(name, shape, "paged_prefill_attention", call=call,
                             check=lambda out, expected=expected, name=name: expect_close(name, out, expected),
                             flops=flops))
    return benches


DECODE_LONG = ("decode bf16 32k", "decode fp8 32k")
SMALL_BATCHES = (1, 8, 16)  # decode rows of the layer_small_batch case
# Cases that repeat part of another (a cheaper run of it alone): "all" leaves them out.
PART_OF_ANOTHER = ("layer_single_row", "layer_single_row_fp8")
DECODE_SERVING = ("decode bf16 serving", "decode fp8 serving")
BEST_HEADER = "Best launch configs (sweep; num_splits null: the heuristic's splits= in the shape):"


def cases(s: Sizes, gen) -> dict[str, Callable[[], list[Bench]]]:
    """Name -> builder of its benches; each builds fresh data only when called."""
    return {
        "decode": lambda: [decode_bench("decode bf16", s, *s.decode, BF16, gen,
                                        goal=(">= 80% of copy BW", lambda r: r.pct_of_limit >= 80))],
        "decode_32k": lambda: [decode_bench(DECODE_LONG[0], s, *s.decode_long, BF16, gen),
                               decode_bench(DECODE_LONG[1], s, *s.decode_long, FP8, gen)],
        "decode_serving": lambda: [decode_bench(DECODE_SERVING[0], s, *s.decode_serving, BF16, gen),
                                   decode_bench(DECODE_SERVING[1], s, *s.decode_serving, FP8, gen)],
        "prefill_8k": lambda: prefill_benches(s, *s.prefill_long, gen, tune=True),
        "prefill_8k_fp8": lambda: prefill_benches(s, *s.prefill_long, gen, tune=True, kv_dtype=FP8),
        "prefill_4x2k": lambda: prefill_benches(s, *s.prefill_batch, gen, tune=False),
        "rotary_write_kv": lambda: [rotary_write_kv_bench(s, BF16, gen), rotary_write_kv_bench(s, FP8, gen)],
        "rms_norm": lambda: [rms_norm_bench(s, gen)],
        "silu": lambda: [silu_bench(s, gen)],
        "silu_fp8": lambda: silu_fp8_benches(s, gen),
        "rms_norm_fp8": lambda: rms_norm_fp8_benches(s, gen),
        "layer_small_batch": lambda: [b for rows in SMALL_BATCHES for b in layer_projection_benches(s, rows, gen)],
        "layer_single_row": lambda: layer_projection_benches(s, 1, gen),
        "fp8_gemm": lambda: [b for rows in s.fp8_gemm_rows for b in fp8_gemm_benches(s, rows, gen)],
        "layer_small_batch_fp8": lambda: [b for rows in s.fp8_small_batches
                                          for b in layer_projection_fp8_benches(s, rows, gen)],
        "layer_single_row_fp8": lambda: layer_projection_fp8_benches(s, 1, gen),
        "projections_single_row": lambda: projection_alone_benches(s, gen),
        "prefill_16k_chunk": lambda: prefill_chunk_benches(s, gen),
    }


@functools.cache
def l2_flush_buffer() -> torch.Tensor:
    return torch.empty(256 << 20, dtype=torch.int8, device="cuda")  # H200 L2: 50 MB


def time_us(fn, reps: int, graph: bool = True) -> float:
    """Median time of one call of fn, the L2 cleared before each; replayed from a CUDA graph, so
    without Python launch overhead, unless graph is False."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as torch.cuda.graph asks
        deadline = time.perf_counter() + WARMUP_S
        while True:
            for _ in range(8):  # launches queued back to back; the clock read between batches
                fn()
            torch.cuda.synchronize()
            if time.perf_counter() > deadline:
                break
    torch.cuda.current_stream().wait_stream(side)
    if graph:
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            fn()
        fn = captured.replay
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        l2_flush_buffer().zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events) * 1e3


def measure_limits(reps: int, fp8: bool = False) -> Limits:
    src = torch.empty(1 << 30, dtype=torch.float32, device="cuda")  # 4 GiB
    dst = torch.empty_like(src)
    # Eager: a graph-captured copy_ takes the driver's slower graph memcpy path (pytorch#191284:
    # ~2x on some sizes; 2.77 vs 4.29 TB/s here on an H200). At ~2 ms a launch costs nothing.
    bandwidth = 2 * src.nbytes / (time_us(lambda: dst.copy_(src), reps, graph=False) * 1e-6)
    del src, dst
    a, b = (torch.randn(8192, 8192, dtype=BF16, device="cuda") for _ in range(2))
    tflops = 2 * 8192**3 / time_us(lambda: a @ b, reps) / 1e6
    fp8_tflops = None
    if fp8:  # row-wise scales and fast accumulation, as fp8_linear's scaled_mm backend
        a8, b8 = a.to(FP8), b.to(FP8)
        scale_a, scale_b = torch.ones(8192, 1, device="cuda"), torch.ones(1, 8192, device="cuda")
        mm = functools.partial(torch._scaled_mm, a8, b8.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=BF16,
                               use_fast_accum=True)
        fp8_tflops = 2 * 8192**3 / time_us(mm, reps) / 1e6
    return Limits(bandwidth, tflops, fp8_tflops)


def measure(bench: Bench, limits: Limits, reps: int) -> Row:
    # Timed twice, the second kept. On the H200 the first timing of a freshly built case ran 13-15%
    # slow, whatever its warm-up (bf16 decode at 32k: 567 then 495 and 496 us, after a 1 s warm-up;
    # 2026-12-03; cause not found), and the engine's decode attention runs at the second's speed.
    # A sweep's candidates are timed after this, so none of them is a case's first timing.
    first, us = time_us(bench.call, reps), time_us(bench.call, reps)
    if abs(first - us) > 0.03 * us:
        print(f"  {bench.case}: first timing {first:,.1f} us, second {us:,.1f} us (kept)", flush=True)
    floor = None
    peak = limits.fp8_tflops if bench.peak == "fp8" else limits.tflops
    if bench.flops:
        achieved, unit, limit = bench.flops / us / 1e6, "TFLOP/s", peak
    else:
        achieved, unit, limit = bench.bytes / us / 1e3, "GB/s", limits.bandwidth / 1e9
    pct = 100 * achieved / limit
    if bench.flops and bench.bytes:  # a GEMM: against its floor, bytes- or FLOP-bound
        floor = max(bench.bytes / limits.bandwidth, bench.flops / (peak * 1e12)) * 1e6
        pct = 100 * floor / us
    row = Row(bench.case, bench.shape, us, achieved, unit, pct, bytes=bench.bytes, flops=bench.flops,
              floor_us=floor)
    if bench.goal:
        row.target, row.met = bench.goal[0], bench.goal[1](row)
    return row


def speedup_rows(rows: list[Row]) -> list[Row]:
    """FP8 over bf16 KV at 32k (the target) and at the serving shape, the limit being the ratio of the
    bytes the two must read; the fused small-batch layer projections over the unfused ones."""
    by_case = {r.case: r for r in rows}
    out = []
    for (bf16_case, fp8_case), name, target in ((DECODE_LONG, "32k", 1.6), (DECODE_SERVING, "serving", None)):
        if bf16_case in by_case and fp8_case in by_case:
            bf16, fp8 = by_case[bf16_case], by_case[fp8_case]
            speedup, ideal = bf16.time_us / fp8.time_us, bf16.bytes / fp8.bytes
            out.append(Row(f"decode fp8 vs bf16 {name}", f"{bf16.shape}; byte ratio {ideal:.2f}x", None, speedup,
                           "x", 100 * speedup / ideal, f">= {target}x" if target else "-",
                           None if target is None else speedup >= target))
    for r in rows:  # FP8 GEMMs: the faster backend over bf16 torch matmul
        if r.case.startswith("layer GEMMs") and r.case.endswith(" bf16"):
            prefix = r.case.removesuffix(" bf16")
            fp8 = [by_case[f"{prefix} fp8 {b}"] for b in FP8_BACKENDS if f"{prefix} fp8 {b}" in by_case]
            if fp8:
                best = min(fp8, key=lambda x: x.time_us)
                out.append(Row(f"{prefix} fp8 vs bf16", f"faster FP8 backend: {best.case.rsplit(' ', 1)[1]}; "
                               "% of limit: its share of its floor", None, r.time_us / best.time_us, "x",
                               best.pct_of_limit))
        if r.case.startswith("layer projections") and r.case.endswith(" fused bf16"):
            prefix = r.case.removesuffix(" fused bf16")
            for kind in ("fused fp8", "fused fp8 unfused"):
                other = by_case.get(f"{prefix} {kind}")
                if other:
                    out.append(Row(f"{prefix} {kind.removeprefix('fused ')} vs bf16 fused",
                                   "% of limit: the FP8 chain's of copy BW", None, r.time_us / other.time_us, "x",
                                   other.pct_of_limit))
    bf16_chunk = by_case.get("prefill chunk bf16 8k of 16k")
    for kind in ("fp8", "fp8 dequantized first"):
        chunk = by_case.get(f"prefill chunk {kind} 8k of 16k")
        if bf16_chunk and chunk:  # the issue: FP8 KV never slower than bf16 KV
            out.append(Row(f"prefill chunk {kind} vs bf16 KV", "8k of 16k (workload (c)'s second chunk)", None,
                           bf16_chunk.time_us / chunk.time_us, "x", 100 * bf16_chunk.time_us / chunk.time_us,
                           ">= 1x", bf16_chunk.time_us / chunk.time_us >= 1))
    for batch in SMALL_BATCHES:
        unfused, fused = (by_case.get(f"layer projections b={batch} {kind}") for kind in ("unfused", "fused"))
        if unfused and fused:
            out.append(Row(f"layer projections b={batch} fused vs unfused", "% of limit: the fused chain's of copy BW",
                           None, unfused.time_us / fused.time_us, "x", fused.pct_of_limit))
    return out


def sweep(bench: Bench, reps: int | None) -> dict:
    """Each candidate config, checked against the reference, then timed (reps None: check only).

    A wrong result is reported and the sweep goes on, so one bad config does not hide the rest.
    """
    results, skipped, wrong = [], 0, []
    for params, kwargs in bench.candidates:
        try:
            with override_launch_params(bench.kernel, **params):
                bench.check(bench.call(**kwargs))
                us = time_us(lambda: bench.call(**kwargs), reps) if reps else None
        except OutOfResources:  # e.g. too many stages of a big tile for shared memory
            skipped += 1
            continue
        except AssertionError as error:
            print(f"  WRONG RESULT with {params} {kwargs}: {str(error).splitlines()[0]}", flush=True)
            wrong.append({"params": params, "kwargs": kwargs})
            continue
        results.append({"time_us": us, "params": params, "kwargs": kwargs})
        if us is not None:
            print(f"    {us:10,.1f} us  {json.dumps(params)} {json.dumps(kwargs)}", flush=True)
    summary = {"case": bench.case, "kernel": bench.kernel, "tried": len(results), "skipped": skipped,
               "wrong": wrong}
    if reps and results:
        summary["best"] = min(results, key=lambda r: r["time_us"])
        summary["all"] = sorted(results, key=lambda r: r["time_us"])
    return summary


def table_row(r: Row) -> dict:
    row = {"case": r.case, "shape": r.shape, "time us": rounded(r.time_us, 1),
           "achieved": round(r.achieved, 2) if r.unit == "x" else round(r.achieved), "unit": r.unit,
           "% of limit": round(r.pct_of_limit), "target": r.target, "met?": r.met}
    if r.floor_us is not None:  # a GEMM: both rates and its floor
        row.update({"TB/s": round(r.bytes / r.time_us / 1e6, 2), "TFLOP/s": round(r.flops / r.time_us / 1e6),
                    "floor us": round(r.floor_us, 1)})
    return row


def fp8_gemm_buckets(rows: list[Row], sweeps: list[dict]) -> dict:
    """The fp8_gemm launch-config entries these timings argue for: per row count measured, "m<=M" with
    the faster backend (and, where the Triton kernel wins and was swept, its best tiles)."""
    by_case = {r.case: r for r in rows}
    best_tiles = {s["case"]: s["best"]["params"] for s in sweeps if s.get("kernel") == "fp8_gemm" and "best" in s}
    buckets = {}
    for r in rows:
        if not (r.case.startswith("layer GEMMs M=") and r.case.endswith(" fp8 triton")):
            continue
        prefix = r.case.removesuffix(" fp8 triton")
        rows_m = int(prefix.removeprefix("layer GEMMs M="))
        triton_us = min([r.time_us] + [s["best"]["time_us"] for s in sweeps
                                       if s.get("case") == r.case and "best" in s])
        scaled = by_case.get(f"{prefix} fp8 scaled_mm")
        if scaled is not None and scaled.time_us < triton_us:
            buckets[f"m<={rows_m}"] = {"backend": "scaled_mm"}
        else:
            buckets[f"m<={rows_m}"] = {"backend": "triton", **best_tiles.get(r.case, {})}
    return buckets


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="all", help="comma-separated names, or all: decode, decode_32k, "
                        "decode_serving, prefill_8k, prefill_8k_fp8, prefill_4x2k, rotary_write_kv, rms_norm, silu, "
                        "layer_small_batch, layer_single_row (its one-row case alone; not in all), fp8_gemm, "
                        "layer_small_batch_fp8, layer_single_row_fp8 (its one-row case alone; not in all), "
                        "projections_single_row, prefill_16k_chunk")
    parser.add_argument("--reps", type=int, default=30, help="timed replays per case, >= 20")
    parser.add_argument("--sweep", action="store_true",
                        help="also try launch configs (launch_configs/*.json keys, decode num_splits)")
    parser.add_argument("--fp8-rows", help="the fp8_gemm case's row counts, comma-separated (default: "
                        f"{','.join(map(str, Sizes.fp8_gemm_rows))}), e.g. 256 to sweep one bucket's tiles")
    parser.add_argument("--json", type=Path, help="write the rows, limits and sweep results here")
    record.add_argument(parser, "kernels")
    parser.add_argument("--smoke", action="store_true",
                        help="CPU, Triton interpreter, tiny shapes: reference checks only, no timing")
    parser.add_argument("--launches", type=int, default=0, metavar="N",
                        help="after its check, launch each case's kernel N more times and time nothing (to "
                             "run under a profiler such as Nsight Compute, which then sees N + 1 launches)")
    argv = sys.argv[1:]
    args = parser.parse_args(argv)
    if args.reps < 20:
        parser.error("--reps must be >= 20")
    if args.smoke and args.json:
        parser.error("--smoke measures nothing to write")
    if args.launches and (args.json or args.sweep):
        parser.error("--launches times nothing, so there is nothing to write or sweep")
    if not args.smoke and not torch.cuda.is_available():
        parser.error("needs a CUDA GPU; --smoke runs the checks on the CPU")

    gen = torch.Generator("cpu" if args.smoke else "cuda").manual_seed(0)
    sizes = SMOKE if args.smoke else Sizes()
    if args.fp8_rows:
        try:
            fp8_rows = tuple(int(r) for r in args.fp8_rows.split(","))
        except ValueError:
            fp8_rows = ()
        if not fp8_rows or min(fp8_rows) < 1:
            parser.error(f"--fp8-rows {args.fp8_rows!r}: give row counts >= 1, e.g. 64,256")
        sizes = replace(sizes, fp8_gemm_rows=fp8_rows)
    builders = cases(sizes, gen)
    names = [n for n in builders if n not in PART_OF_ANOTHER] if args.cases == "all" else args.cases.split(",")
    unknown = set(names) - set(builders)
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}")
    fp8 = any(n.startswith("fp8") for n in names)
    limits = None if args.smoke or args.launches else measure_limits(args.reps, fp8)
    if limits:
        print(f"limits: copy {limits.bandwidth / 1e9:,.0f} GB/s, bf16 matmul {limits.tflops:.0f} TFLOP/s"
              + (f", FP8 _scaled_mm {limits.fp8_tflops:.0f} TFLOP/s" if limits.fp8_tflops else ""), flush=True)

    rows, sweeps, checks = [], [], 0
    for name in names:
        for bench in builders[name]():
            bench.check(bench.call())
            checks += 1
            for _ in range(args.launches):
                bench.call()
            if limits:
                rows.append(measure(bench, limits, args.reps))
                print(rows[-1], flush=True)
            else:
                print(f"ok {bench.case}: {bench.shape}", flush=True)
            if args.sweep and bench.candidates:
                sweeps.append(sweep(bench, None if args.smoke else args.reps))
                if rows:
                    sweeps[-1]["default_us"] = rows[-1].time_us
                checks += sweeps[-1]["tried"]
                best = f", best {json.dumps(sweeps[-1]['best'])}" if "best" in sweeps[-1] else ""
                print(f"  sweep: {sweeps[-1]['tried']} configs correct, {len(sweeps[-1]['wrong'])} wrong, "
                      f"{sweeps[-1]['skipped']} out of resources{best}", flush=True)
        if not args.smoke:
            torch.cuda.empty_cache()  # the next case's data in place of this one's
    num_wrong = sum(len(s["wrong"]) for s in sweeps)
    if args.smoke:
        print(f"smoke: {checks} reference checks passed, {num_wrong} failed (TRITON_INTERPRET=1, CPU); no timing")
        return int(num_wrong > 0)
    if args.launches:
        torch.cuda.synchronize()
        print(f"launches: {checks} cases checked and launched {args.launches} more times each; no timing")
        return 0

    rows += speedup_rows(rows)
    limits_line = (f"Limits measured in this run: device-to-device copy of 4 GiB {limits.bandwidth / 1e9:,.0f} GB/s "
                   f"(read + write); bf16 torch.matmul 8192^3 {limits.tflops:.0f} TFLOP/s"
                   + (f"; FP8 torch._scaled_mm 8192^3 (row-wise scales) {limits.fp8_tflops:.0f} TFLOP/s"
                      if limits.fp8_tflops else "")
                   + f". Medians of {args.reps} CUDA-graph replays, L2 flushed before each.")
    best = [f"{s['case']} ({s['kernel']}): {json.dumps(s['best']['params'])} {json.dumps(s['best']['kwargs'])} "
            f"{s['best']['time_us']:,.1f} us (configured: {s['default_us']:,.1f} us)" for s in sweeps if "best" in s]
    table = [table_row(r) for r in rows]
    print(f"\n{markdown(table)}\n\n{limits_line}")
    if best:
        print(f"\n{BEST_HEADER}\n" + "\n".join(f"- {b}" for b in best))
    buckets = fp8_gemm_buckets(rows, sweeps)
    buckets_line = f"fp8_gemm row buckets these timings argue for (launch_configs/*.json): {json.dumps(buckets)}"
    if buckets:
        print(f"\n{buckets_line}")

    gpu = torch.cuda.get_device_name()
    if args.json:
        args.json.write_text(json.dumps({"gpu": gpu, "commit": source_commit(), "argv": argv,
                                         "limits": asdict(limits), "rows": [asdict(r) for r in rows],
                                         "sweeps": sweeps, "fp8_gemm_buckets": buckets}, indent=1))
    if args.record:
        versions = f"torch {torch.__version__}, triton {triton.__version__}, CUDA {torch.version.cuda}"
        notes = [limits_line, versions] + ([BEST_HEADER, *best] if best else []) + ([buckets_line] if buckets else [])
        record.write(args.record, __file__, argv, args, gpu, table, notes)
    if num_wrong:
        print(f"{num_wrong} swept configs gave wrong results (see WRONG RESULT above)")
    return int(num_wrong > 0)


if __name__ == "__main__":
    raise SystemExit(main())
