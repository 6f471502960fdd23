"""Engine settings, validated once at construction so a bad value fails before any weight is read."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from llm_engine.model_config import ModelConfig
from llm_engine.quantization import Fp8Quantization, resolve

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_KV_CACHE_DTYPES = ("auto", "fp8_e4m3")


@dataclass
class EngineConfig:
    model: str                              # local HF model folder
    dtype: str = "auto"                     # auto: the checkpoint's (float32 checkpoints run in bfloat16 on CUDA)
    kv_cache_dtype: str = "auto"            # auto: the model dtype; fp8_e4m3: e4m3 values + per-(token, head) scales
    # Weights: None (as the checkpoint says: a compressed-tensors FP8 checkpoint runs in FP8, others in
    # `dtype`); "fp8": the decoder's projections in FP8 e4m3 with per-output-channel scales (an unquantized
    # checkpoint is quantized as it loads), activations quantized per token; "compressed-tensors": the
    # checkpoint must be one. LM head and embeddings stay in `dtype`. llm_engine/quantization.py.
    quantization: str | None = None
    block_size: int = 16                    # tokens per KV block
    max_model_len: int | None = None        # prompt + output tokens per sequence; None: the model's limit
    max_num_seqs: int | None = None         # sequences per step (and the largest CUDA-graph batch); None: below
    max_num_batched_tokens: int | None = None  # token budget per step (decodes + prefill chunks); None: below
    gpu_memory_utilization: float = 0.9     # share of total GPU memory the engine may use, KV pool included
    num_kv_blocks: int | None = None        # None: sized from free GPU memory (CUDA) or cpu_kv_cache_tokens (CPU)
    cpu_kv_cache_tokens: int = 16384        # KV pool capacity on CPU, in tokens
    enable_prefix_caching: bool = True
    device: str = "auto"                    # auto (cuda:0, else cpu) | cpu | cuda | cuda:N
    seed: int = 0
    enforce_eager: bool = False             # True: no CUDA graphs
    # Steps with prefill chunks of up to this many tokens replay piecewise CUDA graphs, attention
    # launched between them (piecewise_graphs.py); 0: such steps run eagerly. Off by default: on the
    # H200 it saves host time per step, but workload (b)'s steps are bound by the GPU (benchmarks.md).
    piecewise_graph_max_tokens: int = 0
    max_waiting: int | None = 1024          # bound of the waiting queue; None: unbounded
    tensor_parallel_size: int = 1           # processes (GPUs from `device` on) the model is split over
    # Launch each step before the previous one's sampled tokens reach the host, so the host's work
    # between steps overlaps the device's (llm_engine.py); False: every step waits for the last.
    async_scheduling: bool = True
    # A structured-output constraint whose compile takes longer fails its request (never the batch).
    structured_output_compile_timeout_s: float = 10.0
    model_config: ModelConfig = field(init=False, repr=False)
    weight_quantization: Fp8Quantization | None = field(init=False, repr=False)  # resolved from `quantization`

    def __post_init__(self) -> None:
        self.model_config = ModelConfig.from_pretrained(self.model)
        _expect_device(self.device)
        _expect_choice("dtype", self.dtype, ("auto", *_DTYPES))
        _expect_choice("kv_cache_dtype", self.kv_cache_dtype, _KV_CACHE_DTYPES)
        self.weight_quantization = resolve(self.quantization, self.model_config.quantization_config,
                                           str(self.model_config.path / "config.json"))
        if self.block_size < 1 or self.block_size & (self.block_size - 1) or self.block_size > 256:
            raise ValueError(f"block_size must be a power of two in [1, 256], got {self.block_size}")
        self.max_model_len = self._resolve_max_model_len()
        device = _resolve_device(self.device)
        on_gpu = device.type == "cuda"
        # A GPU step costs the host about as much at 8192 tokens as at 2048 (launches, bookkeeping),
        # so larger steps keep a GPU busy; the CPU computes every token on the host anyway.
        if self.max_num_seqs is None:
            self.max_num_seqs = _default_max_num_seqs(device, self.kv_cache_dtype)
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = 8192 if on_gpu else 2048
        _expect_min("max_num_seqs", self.max_num_seqs, 1)
        _expect_min("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        _expect_min("piecewise_graph_max_tokens", self.piecewise_graph_max_tokens, 0)
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.num_kv_blocks is not None:
            _expect_min("num_kv_blocks", self.num_kv_blocks, 1)
        _expect_min("cpu_kv_cache_tokens", self.cpu_kv_cache_tokens, self.block_size)
        if self.max_waiting is not None:
            _expect_min("max_waiting", self.max_waiting, 1)
        _expect_min("tensor_parallel_size", self.tensor_parallel_size, 1)
        if not (isinstance(self.structured_output_compile_timeout_s, (int, float))
                and 0 < self.structured_output_compile_timeout_s < float("inf")):
            raise ValueError(f"structured_output_compile_timeout_s must be a number > 0, "
                             f"got {self.structured_output_compile_timeout_s!r}")
        if not isinstance(self.async_scheduling, bool):
            raise ValueError(f"async_scheduling must be a bool, got {self.async_scheduling!r}")
        self.model_config.per_rank(self.tensor_parallel_size)  # raises unless the shapes split evenly

    @property
    def torch_device(self) -> torch.device:
        """Resolved on use: a host may set `device` after construction (one GPU per Triton instance)."""
        return _resolve_device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype != "auto":
            return _DTYPES[self.dtype]
        checkpoint = self.model_config.dtype
        # fp32 weights would double the bytes each decode step reads; the kernels target 16-bit.
        on_gpu = self.torch_device.type == "cuda"
        return torch.bfloat16 if checkpoint == torch.float32 and on_gpu else checkpoint

    @property
    def kv_cache_torch_dtype(self) -> torch.dtype:
        return torch.float8_e4m3fn if self.kv_cache_dtype == "fp8_e4m3" else self.torch_dtype

    @property
    def use_cuda_graphs(self) -> bool:
        return self.torch_device.type == "cuda" and not self.enforce_eager

    def _resolve_max_model_len(self) -> int:
        mc = self.model_config
        limit, source = mc.max_position_embeddings, "max_position_embeddings"
        # No sliding-window attention kernel: a context no longer than the window makes it a no-op.
        if mc.sliding_window is not None and mc.sliding_window < limit:
            limit, source = mc.sliding_window, "sliding_window"
        if self.max_model_len is None:
            return limit
        _expect_min("max_model_len", self.max_model_len, 1)
        if self.max_model_len > limit:
            raise ValueError(f"max_model_len {self.max_model_len} exceeds the model's {source} {limit}")
        return self.max_model_len


def _expect_device(device: str) -> None:
    if device not in ("auto", "cpu", "cuda") and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")


def _default_max_num_seqs(device: torch.device, kv_cache_dtype: str) -> int:
    """Sequences a step: 256 on the CPU, 512 on a GPU; 1024 (vLLM's default on such GPUs) with FP8 KV on one of
    70 GiB or more (H100, H200), whose pool holds twice the tokens. On an H100, workload (b) with FP8 weights
    and KV ran 3% and 16% faster at 1024 than at 512 (two leases); with bf16 KV, whose pool cannot hold that many
    sequences there, 7% and 9% slower (docs/benchmarks-journal.md, 2026-12-06 14:53)."""
    if device.type != "cuda":
        return 256
    large = torch.cuda.get_device_properties(device).total_memory >= 70 << 30
    return 1024 if large and kv_cache_dtype == "fp8_e4m3" else 512


def _resolve_device(device: str) -> torch.device:
    _expect_device(device)
    if device == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        return torch.device("cpu")
    index = int(device[5:]) if device != "cuda" else 0
    if index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) visible")
    return torch.device("cuda", index)


def check_fp8_support(config: EngineConfig, device: torch.device) -> None:
    """FP8 e4m3 (weights or KV cache) needs a GPU of compute capability >= 8.9 (Ada, Hopper): Triton has no
    e4m3 type below it and cuBLAS no FP8 GEMM. Said at start, naming the setting, rather than as a kernel's
    compile error once the weights have loaded."""
    weights = config.weight_quantization
    asked = [] if weights is None else [
        "quantization 'fp8'" if weights.online
        else f"the checkpoint's quantization_config ({config.model_config.path / 'config.json'})"]
    if config.kv_cache_dtype == "fp8_e4m3":
        asked.append("kv_cache_dtype 'fp8_e4m3'")
    if device.type != "cuda" or not asked:
        return
    capability = torch.cuda.get_device_capability(device)
    if capability < (8, 9):
        verb = "needs" if len(asked) == 1 else "need"
        raise ValueError(f"{' and '.join(asked)} {verb} FP8 e4m3, which needs a GPU of compute capability >= 8.9 "
                         f"(Ada, Hopper); {device} ({torch.cuda.get_device_name(device)}) is "
                         f"{capability[0]}.{capability[1]}")


def _expect_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def _expect_min(name: str, value: int, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
