"""Triton kernels of the engine's hot paths, each with a pure-torch `<name>_ref` of the same signature
(apply_rotary_ref and write_kv_cache_ref are the two halves of rotary_and_write_kv_ref)."""
from llm_engine.kernels.activation import silu_and_mul, silu_and_mul_ref
from llm_engine.kernels.decode_attention import paged_decode_attention, paged_decode_attention_ref
from llm_engine.kernels.fp8_gemm import (
    fp8_gemm,
    fp8_gemm_error_bound,
    fp8_gemm_ref,
    fp8_linear,
    fp8_linear_ref,
    fp8_matmul,
    fp8_matmul_ref,
)
from llm_engine.kernels.fp8_quant import (
    dequantize_fp8_weight_ref,
    quantize_fp8_per_token,
    quantize_fp8_per_token_ref,
    quantize_fp8_weight_ref,
    silu_and_mul_quantize_fp8,
    silu_and_mul_quantize_fp8_ref,
)
from llm_engine.kernels.kv_store import (
    FP8_E4M3_MAX,
    FP8_SCALE_MIN,
    dequantize_fp8_cache_ref,
    dequantize_fp8_ref,
    gather_kv_ref,
    quantize_fp8_cache_ref,
    quantize_fp8_ref,
    write_kv_cache_ref,
)
from llm_engine.kernels.prefill_attention import paged_prefill_attention, paged_prefill_attention_ref
from llm_engine.kernels.rms_norm import (
    rms_norm,
    rms_norm_quantize_fp8,
    rms_norm_quantize_fp8_ref,
    rms_norm_ref,
)
from llm_engine.kernels.rotary import apply_rotary_ref
from llm_engine.kernels.rotary_kv_cache import rotary_and_write_kv, rotary_and_write_kv_ref
from llm_engine.kernels.skinny_linear import SKINNY_MAX_ROWS, fits_skinny_linear, skinny_linear, skinny_linear_ref
from llm_engine.kernels.token_bitmask import apply_token_bitmask, apply_token_bitmask_ref

__all__ = [
    "FP8_E4M3_MAX",
    "FP8_SCALE_MIN",
    "SKINNY_MAX_ROWS",
    "apply_rotary_ref",
    "apply_token_bitmask",
    "apply_token_bitmask_ref",
    "dequantize_fp8_cache_ref",
    "dequantize_fp8_ref",
    "dequantize_fp8_weight_ref",
    "fits_skinny_linear",
    "fp8_gemm",
    "fp8_gemm_error_bound",
    "fp8_gemm_ref",
    "fp8_linear",
    "fp8_linear_ref",
    "fp8_matmul",
    "fp8_matmul_ref",
    "gather_kv_ref",
    "paged_decode_attention",
    "paged_decode_attention_ref",
    "paged_prefill_attention",
    "paged_prefill_attention_ref",
    "quantize_fp8_cache_ref",
    "quantize_fp8_per_token",
    "quantize_fp8_per_token_ref",
    "quantize_fp8_ref",
    "quantize_fp8_weight_ref",
    "rms_norm",
    "rms_norm_quantize_fp8",
    "rms_norm_quantize_fp8_ref",
    "rms_norm_ref",
    "rotary_and_write_kv",
    "rotary_and_write_kv_ref",
    "silu_and_mul",
    "silu_and_mul_ref",
    "silu_and_mul_quantize_fp8",
    "silu_and_mul_quantize_fp8_ref",
    "skinny_linear",
    "skinny_linear_ref",
    "write_kv_cache_ref",
]
