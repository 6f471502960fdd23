"""Which projections hold FP8 weights, from EngineConfig.quantization and the checkpoint's config.json.

Two ways in, one scheme (W8A8 FP8, vLLM's "FP8 dynamic"; kernels/fp8_quant.py, fp8_gemm.py):
- `quantization: "fp8"` on a bf16/fp16/fp32 checkpoint: every decoder projection (qkv, o, gate_up,
  down) is quantized per output channel as its tensors are read (each tensor-parallel rank its own
  slice; model/loader.py's load_weights); activations per token at run time.
- a compressed-tensors checkpoint (llm-compressor's FP8 schemes, as vLLM loads them): config.json's
  `quantization_config` with quant_method "compressed-tensors", format "float-quantized" (or
  "naive-quantized"), config groups of 8-bit float weights with strategy "channel" or "tensor" and
  input activations dynamic per token, static per tensor (an `input_scale` per projection) or none
  (run here with dynamic per-token activations), targets ("Linear", names, "re:" patterns) and an
  ignore list. Its weights are float8_e4m3fn with `weight_scale`. Its KV-cache scales (`kv_cache_scheme`)
  are not read: the FP8 KV cache scales each token itself. Sparse (`sparsity_config`) checkpoints fail.

The LM head and the embeddings stay in the model dtype: a checkpoint that quantizes the LM head is
dequantized there at load. Pure Python: `import llm_engine.config` loads no model or kernel.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

QUANTIZATIONS = ("fp8", "compressed-tensors")
COMPRESSED_FORMATS = ("float-quantized", "naive-quantized")


@dataclass(frozen=True)
class LinearQuant:
    """How one projection's FP8 weights and scales come."""
    online: bool        # quantized at load from the checkpoint's higher-precision weight
    static_input: bool  # one input_scale from the checkpoint instead of per-token scales


@dataclass(frozen=True)
class Fp8Quantization:
    """The model's FP8 plan: online (quantization "fp8" on an unquantized checkpoint) or the
    compressed-tensors groups of its checkpoint."""
    online: bool
    groups: tuple[tuple[tuple[str, ...], bool], ...] = ()  # (targets, static input) per config group
    ignore: tuple[str, ...] = ()

    @property
    def method(self) -> str:
        return "fp8" if self.online else "compressed-tensors"

    def for_module(self, checkpoint_modules: list[str]) -> LinearQuant | None:
        """The plan of one projection, named by the checkpoint modules stacked into it (q_proj, k_proj,
        v_proj for qkv_proj), which must all be quantized alike; None: it stays in the model dtype."""
        if self.online:
            return LinearQuant(online=True, static_input=False)
        plans = {self._module_plan(name) for name in checkpoint_modules}
        if len(plans) > 1:
            raise ValueError(f"checkpoint modules {checkpoint_modules} are fused into one projection here but "
                             "quantized differently in the checkpoint's quantization_config")
        return plans.pop()

    def _module_plan(self, name: str) -> LinearQuant | None:
        if any(_matches(pattern, name) for pattern in self.ignore):
            return None
        for targets, static_input in self.groups:
            if any(target == "Linear" or _matches(target, name) for target in targets):
                return LinearQuant(online=False, static_input=static_input)
        return None


def _matches(pattern: str, name: str) -> bool:
    """compressed-tensors' target and ignore entries: a module name, or "re:" and a regular expression
    matched from the start of the name."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    return pattern == name


def resolve(requested: str | None, quantization_config: dict[str, Any] | None,
            source: str) -> Fp8Quantization | None:
    """The FP8 plan for EngineConfig.quantization `requested` (None: as the checkpoint says) and the
    checkpoint's quantization_config (None: unquantized); ValueError for what this engine cannot run.
    `source`: the config.json, named in the errors."""
    requested = None if requested == "none" else requested   # as the config files write it
    if requested is not None and requested not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)} or none; got {requested!r}")
    if quantization_config is None:
        if requested == "compressed-tensors":
            raise ValueError(f"quantization 'compressed-tensors' needs a compressed-tensors checkpoint; {source} "
                             "has no quantization_config (quantization 'fp8' quantizes this one at load)")
        return Fp8Quantization(online=True) if requested == "fp8" else None
    return _compressed_tensors(quantization_config, source)


def _compressed_tensors(config: Any, source: str) -> Fp8Quantization:
    _expect_type(f"{source}: quantization_config", config, dict)
    method = config.get("quant_method")
    if method != "compressed-tensors":
        raise ValueError(f"{source}: quantization_config quant_method {method!r} is not supported; this engine "
                         "runs compressed-tensors FP8 checkpoints (llm-compressor's FP8 schemes), or quantizes an "
                         "unquantized checkpoint at load (quantization 'fp8')")
    sparsity = config.get("sparsity_config")
    if sparsity and (not isinstance(sparsity, dict) or sparsity.get("format") != "dense"):
        raise ValueError(f"{source}: quantization_config sparsity_config "
                         f"{(sparsity.get('format') if isinstance(sparsity, dict) else sparsity)!r} is not supported "
                         "(dense weights only)")
    groups = config.get("config_groups") or {}
    _expect_type(f"{source}: quantization_config config_groups", groups, dict)
    if not groups:
        raise ValueError(f"{source}: quantization_config has no config_groups")
    plan = []
    for name, group in groups.items():
        where = f"{source}: quantization_config group {name!r}"
        _expect_type(where, group, dict)
        fmt = group.get("format") or config.get("format")
        if fmt not in COMPRESSED_FORMATS:
            raise ValueError(f"{where}: format {fmt!r} is not supported (supported: {', '.join(COMPRESSED_FORMATS)})")
        weights = group.get("weights") or {}
        _expect_type(where + " weights", weights, dict)
        _expect_fp8(where + " weights", weights)
        strategy = weights.get("strategy")
        if strategy not in ("channel", "tensor"):
            raise ValueError(f"{where}: weight strategy {strategy!r} is not supported (supported: channel, tensor)")
        if weights.get("dynamic"):
            raise ValueError(f"{where}: dynamic weight scales are not supported")
        activations = group.get("input_activations")
        static = False
        if activations:
            _expect_type(where + " input_activations", activations, dict)
            _expect_fp8(where + " input_activations", activations)
            kind = (activations.get("strategy"), bool(activations.get("dynamic")))
            if kind not in (("token", True), ("tensor", False)):
                raise ValueError(f"{where}: input activations with strategy {kind[0]!r}, dynamic {kind[1]} are not "
                                 "supported (supported: per token dynamic, per tensor static)")
            static = kind == ("tensor", False)
        if group.get("output_activations"):
            raise ValueError(f"{where}: output activation quantization is not supported")
        targets = _names(where + " targets", group.get("targets") or [])
        if not targets:
            raise ValueError(f"{where}: no targets")
        plan.append((targets, static))
    ignore = _names(f"{source}: quantization_config ignore", config.get("ignore") or [])
    return Fp8Quantization(online=False, groups=tuple(plan), ignore=ignore)


def _expect_type(where: str, value: Any, kind: type) -> None:
    if not isinstance(value, kind):
        raise ValueError(f"{where} must be {'an object' if kind is dict else 'a list'}; got {value!r}")


def _names(where: str, value: Any) -> tuple[str, ...]:
    """A list of module names and "re:" patterns (a lone string would be read as its characters)."""
    _expect_type(where, value, list)
    if not all(isinstance(name, str) for name in value):
        raise ValueError(f"{where} must be a list of strings; got {value!r}")
    return tuple(value)


def _expect_fp8(where: str, args: dict[str, Any]) -> None:
    if args.get("num_bits") != 8 or args.get("type") != "float":
        raise ValueError(f"{where}: {args.get('num_bits')}-bit {args.get('type')!r} is not supported "
                         "(FP8: num_bits 8, type 'float')")
    if args.get("symmetric") is False:
        raise ValueError(f"{where}: asymmetric FP8 is not supported")
