"""A vllm_backend model folder's `1/model.json` (vLLM engine arguments) as this engine's settings.

Arguments with an engine setting of the same meaning are taken; arguments about vLLM's own
machinery (logging, Ray, download caches) are ignored with a warning; any other argument, which
would change what the model computes or cannot be honoured here, fails the load naming it.
"""
from __future__ import annotations

from typing import Any

# vLLM argument -> engine setting, where the meaning is the same.
_SAME = {name: name for name in (
    "model", "max_model_len", "gpu_memory_utilization", "tensor_parallel_size", "max_num_seqs",
    "max_num_batched_tokens", "enable_prefix_caching", "seed", "block_size", "enforce_eager")}
_DTYPES = {"auto": "auto", "half": "float16", "float16": "float16", "bfloat16": "bfloat16", "float": "float32",
           "float32": "float32"}
_KV_CACHE_DTYPES = {"auto": "auto", "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3"}
# FP8 weights (llm_engine/quantization.py): quantized at load, or a compressed-tensors FP8 checkpoint.
_QUANTIZATIONS = ("fp8", "compressed-tensors")
# Without effect here, results unchanged.
_IGNORED = {"disable_log_stats", "disable_log_requests", "enable_log_requests", "served_model_name", "download_dir",
            "load_format", "swap_space", "worker_use_ray", "distributed_executor_backend",
            "disable_custom_all_reduce", "max_seq_len_to_capture", "num_scheduler_steps", "enable_chunked_prefill",
            "max_logprobs", "trust_remote_code", "tokenizer_mode", "disable_sliding_window", "aggregate_engine_logging"}


def translate(args: dict[str, Any], source: str) -> tuple[dict[str, Any], list[str]]:
    """The engine settings `args` stand for, and warnings about the arguments ignored; ValueError
    naming every argument that cannot be honoured."""
    if not isinstance(args, dict):
        raise ValueError(f"{source} must hold a JSON object of vLLM engine arguments, got {type(args).__name__}")
    settings: dict[str, Any] = {}
    ignored, refused = [], []
    for key, value in args.items():
        if key in _SAME:
            settings[_SAME[key]] = value
        elif key == "dtype":
            if str(value) not in _DTYPES:
                refused.append(f"dtype {value!r} (supported: {', '.join(_DTYPES)})")
            settings["dtype"] = _DTYPES.get(str(value), value)
        elif key == "kv_cache_dtype":
            if str(value) not in _KV_CACHE_DTYPES:
                refused.append(f"kv_cache_dtype {value!r} (supported: {', '.join(_KV_CACHE_DTYPES)})")
            settings["kv_cache_dtype"] = _KV_CACHE_DTYPES.get(str(value), value)
        elif key == "tokenizer" and value in (None, args.get("model")):
            continue  # the model's own tokenizer, as here
        elif key in ("pipeline_parallel_size", "data_parallel_size") and int(value) == 1:
            continue
        elif key in ("enable_lora", "quantization") and value in (None, False, "false", "False"):
            continue
        elif key == "quantization":
            if value not in _QUANTIZATIONS:
                refused.append(f"quantization {value!r} (supported: {', '.join(_QUANTIZATIONS)} or null)")
            settings["quantization"] = value
        elif key in _IGNORED:
            ignored.append(key)
        else:
            refused.append(f"{key}={value!r}")
    if refused:
        raise ValueError(f"{source}: vLLM engine argument(s) this engine cannot honour: {'; '.join(refused)}")
    warnings = [f"{source}: ignored vLLM engine argument(s) without effect here: {', '.join(sorted(ignored))}"] \
        if ignored else []
    return settings, warnings
