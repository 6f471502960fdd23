"""FP8 weights in the model: the quantization setting and the checkpoint's quantization_config, the loader
(quantizing an unquantized checkpoint as it loads, per tensor-parallel rank; compressed-tensors checkpoints
written by our own writer, per channel and per tensor, static input scales), and the FP8 model's logits.

How close the FP8 model must be, stated:
- to the exact W8A8 function: HF transformers on the same checkpoint, every decoder projection's weight
  replaced by its dequantized e4m3 values and its input quantized per token and dequantized (fake
  quantization, float32): within 1e-4 like the unquantized parity tests (test_model_parity.py), on every
  path on the CPU (torch references, the fused small-batch projections, the Triton kernels in the
  interpreter); on a GPU, whose FP8 tensor cores sum with 14 bits, within per-position bounds of the
  relative logit error set from an emulation of that accumulation (GPU_MEAN_REL, GPU_MAX_REL);
- to the unquantized model on the same weights: the tiny random models amplify any perturbation (their
  weights have std 0.3: quantizing the weights alone already moves the logits by ~18%), so the bound is
  loose: relative logit error ||fp8 - ref|| / ||ref|| per position, mean <= 0.35 and max <= 1.25
  (measured 0.21-0.27 and 0.64-1.02), teacher-forced argmax agreement >= 50% (measured 56-72%, printed).
  The 8B-shaped model's figures come from benchmarks/fp8_accuracy.py on the GPU.
"""
from __future__ import annotations

import importlib
import inspect
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_checkpoints import tiny_checkpoints  # noqa: F401  (session fixture)
from transformers import AutoModelForCausalLM

from llm_engine import LLM, SamplingParams
from llm_engine.config import EngineConfig, check_fp8_support
from llm_engine.core.scheduled_batch import ScheduledBatch
from llm_engine.core.sequence import Sequence
from llm_engine.kernels import (
    SKINNY_MAX_ROWS,
    dequantize_fp8_weight_ref,
    quantize_fp8_per_token_ref,
    quantize_fp8_weight_ref,
    rms_norm_ref,
    silu_and_mul_ref,
)
from llm_engine.kernels.fp8_gemm import FAST_ACCUM_GROUP
from llm_engine.kernels.launch_config import override_launch_params
from llm_engine.model import ops
from llm_engine.model.layers.linear import Linear
from llm_engine.model.fp8_checkpoint import main as fp8_checkpoint_main
from llm_engine.model.fp8_checkpoint import quantize_weight, write_fp8_checkpoint
from llm_engine.model.loader import SafetensorsCheckpoint, load_model
from llm_engine.quantization import Fp8Quantization, LinearQuant, resolve
from llm_engine.worker.distributed import TensorParallelGroup
from llm_engine.worker.model_runner import ModelRunner

FP8 = torch.float8_e4m3fn
ARCHS = ["tiny-llama", "tiny-mistral", "tiny-qwen2"]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
PROMPTS = [
    "The capital of France is Paris, the capital of Italy is",
    "Retrieval augmented generation combines a search engine with a language model, so",
]
ATOL = 1e-4
# On a GPU no elementwise bound holds: the prefill's W8A8 GEMMs run on Hopper's FP8 tensor cores, whose running sums
# keep 14 significant bits (kernels/fp8_gemm.py, fp8_gemm_error_bound: ~1e-4 of a sum, growing with K), and every
# projection quantizes its input to e4m3 again, where an input that close to a rounding boundary moves a whole e4m3
# step (up to 1/8 of it). A few such steps per token, which these tiny random models amplify: on the H200 (2026-12-04)
# the prefill logits moved up to 0.71-0.96 from HF fake-quantized (87-95% of them beyond 2e-3; the emulation below
# gives 0.73-0.95 and 76-89%). Emulated on the CPU (every GEMM's running sum truncated to 14 significant bits after
# each 32 products of K; 13 and 12 bits for margin), per position ||fp8 - ref|| / ||ref||: prefill mean 0.029-0.034
# (0.035-0.057 at 12-13 bits), max 0.076-0.137 (0.086-0.125); W8A8 decode steps (tiny-llama) mean 0.048, max 0.075
# (0.064 and 0.092 at 13 bits). So on a GPU: mean <= GPU_MEAN_REL and every position <= GPU_MAX_REL, still below the
# smallest wiring error measured alike: activations left unquantized (W8A16 instead of W8A8) move them by mean
# 0.14-0.20, max 0.42-0.58; a wrong scale, weight or stale graph input by O(1).
# test_gpu_bounds_hold_under_emulated_fast_accumulation re-measures both sides on the CPU.
GPU_MEAN_REL, GPU_MAX_REL = 0.08, 0.25
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def same_bytes(a, b):
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.fixture
def copy_of(tiny_checkpoints, tmp_path):
    def make(name):
        return shutil.copytree(tiny_checkpoints[name], tmp_path / name)
    return make


def edit_config(folder, **changes):
    path = Path(folder) / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def quantization_config(folder):
    return json.loads((Path(folder) / "config.json").read_text())["quantization_config"]


# --- the setting and the checkpoint's quantization_config -----------------------------------------

def test_the_setting_and_the_checkpoint_decide(tiny_checkpoints):
    plain, fp8 = tiny_checkpoints["tiny-llama"], tiny_checkpoints["tiny-llama-fp8"]
    assert EngineConfig(model=str(plain), device="cpu").weight_quantization is None
    online = EngineConfig(model=str(plain), device="cpu", quantization="fp8").weight_quantization
    assert online == Fp8Quantization(online=True) and online.method == "fp8"
    for requested in (None, "fp8", "compressed-tensors"):  # the checkpoint's scheme either way
        plan = EngineConfig(model=str(fp8), device="cpu", quantization=requested).weight_quantization
        assert plan.method == "compressed-tensors"
        assert plan.for_module(["model.layers.0.self_attn.q_proj"]) == LinearQuant(online=False, static_input=False)
        assert plan.for_module(["lm_head"]) is None


@pytest.mark.parametrize("change, message", [
    (dict(quantization="int4"), r"quantization must be one of fp8, compressed-tensors or none; got 'int4'"),
    (dict(quantization="compressed-tensors"), r"needs a compressed-tensors checkpoint"),
])
def test_bad_settings_are_refused(tiny_checkpoints, change, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(model=str(tiny_checkpoints["tiny-llama"]), device="cpu", **change)


def test_none_is_the_default_as_the_config_files_write_it(tiny_checkpoints):
    assert EngineConfig(model=str(tiny_checkpoints["tiny-llama"]), device="cpu",
                        quantization="none").weight_quantization is None


def _group(**changes):
    group = {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
             "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}}
    for key, value in changes.items():
        group[key] = value if not isinstance(value, dict) else {**group.get(key, {}), **value}
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": group}}


@pytest.mark.parametrize("config, message", [
    ({"quant_method": "awq", "bits": 4}, r"quant_method 'awq' is not supported"),
    ({**_group(), "format": "pack-quantized"}, r"format 'pack-quantized' is not supported"),
    (_group(weights={"num_bits": 4, "type": "int"}), r"4-bit 'int' is not supported"),
    (_group(weights={"strategy": "block"}), r"weight strategy 'block' is not supported"),
    (_group(input_activations={"strategy": "group", "dynamic": True}), r"strategy 'group', dynamic True"),
    (_group(input_activations={"strategy": "token", "dynamic": False}), r"strategy 'token', dynamic False"),
    ("fp8", r"quantization_config must be an object; got 'fp8'"),
    ({**_group(), "config_groups": [{"targets": ["Linear"]}]}, r"config_groups must be an object"),
    ({**_group(), "config_groups": {"g": None}}, r"group 'g' must be an object; got None"),
    (_group(input_activations=True), r"group 'g' input_activations must be an object; got True"),
    (_group(targets="Linear"), r"group 'g' targets must be a list; got 'Linear'"),
    (_group(targets=["Linear", 3]), r"group 'g' targets must be a list of strings"),
    ({**_group(), "ignore": "lm_head"}, r"ignore must be a list; got 'lm_head'"),
    ({**_group(), "sparsity_config": {"format": "sparse-24-bitmask"}}, r"sparsity_config 'sparse-24-bitmask'"),
])
def test_unsupported_checkpoint_schemes_are_named(config, message):
    with pytest.raises(ValueError, match=message):
        resolve(None, config, "config.json")


def test_targets_and_ignore_decide_each_projection():
    config = _group()
    config["config_groups"]["static"] = {**config["config_groups"]["g"], "targets": ["re:.*mlp\\.down_proj$"],
                                         "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor",
                                                               "dynamic": False}}
    config["config_groups"] = {"static": config["config_groups"]["static"], "g": config["config_groups"]["g"]}
    config["ignore"] = ["lm_head", "re:model\\.layers\\.1\\.self_attn\\..*"]
    plan = resolve(None, config, "config.json")
    assert plan.for_module(["model.layers.0.mlp.down_proj"]).static_input
    assert not plan.for_module(["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"]).static_input
    assert plan.for_module(["model.layers.1.self_attn.o_proj"]) is None
    with pytest.raises(ValueError, match="quantized differently"):
        plan.for_module(["model.layers.1.self_attn.q_proj", "model.layers.0.self_attn.q_proj"])


# --- the loader --------------------------------------------------------------------------------------

def _state(model):
    return {name: tensor for name, tensor in model.state_dict().items()}


def _assert_same_state(got, expected):
    assert got.keys() == expected.keys()
    for name in expected:
        assert got[name].dtype == expected[name].dtype, name
        if expected[name].dtype == FP8:
            assert same_bytes(got[name], expected[name]), name
        else:
            assert torch.equal(got[name], expected[name]), name


@pytest.mark.parametrize("arch", ["tiny-llama", "tiny-qwen2"])  # qwen2: q/k/v biases, tied embeddings
def test_quantized_at_load_equals_our_compressed_tensors_checkpoint(tiny_checkpoints, tmp_path, arch):
    """Tensor for tensor: the unquantized checkpoint quantized as it loads, and the compressed-tensors
    checkpoint our writer made of it (tiny-llama-fp8 is tiny-llama's)."""
    folder = tiny_checkpoints[arch]
    written = tiny_checkpoints["tiny-llama-fp8"] if arch == "tiny-llama" else write_fp8_checkpoint(
        folder, tmp_path / f"{arch}-fp8")
    online = load_model(EngineConfig(model=str(folder), device="cpu", quantization="fp8"))
    loaded = load_model(EngineConfig(model=str(written), device="cpu"))
    _assert_same_state(_state(online), _state(loaded))
    state = load_file(str(folder / "model.safetensors"))
    layer = online.model.layers[1]
    qkv = layer.self_attn.qkv_proj
    assert qkv.weight.dtype == FP8 and qkv.weight_scale.dtype == torch.float32 and qkv.input_scale is None
    for name, (param, scale_param) in {"mlp.down_proj": (layer.mlp.down_proj.weight, layer.mlp.down_proj.weight_scale),
                                       "self_attn.o_proj": (layer.self_attn.o_proj.weight,
                                                            layer.self_attn.o_proj.weight_scale)}.items():
        values, scale = quantize_fp8_weight_ref(state[f"model.layers.1.{name}.weight"])
        assert same_bytes(param, values) and torch.equal(scale_param, scale), name
    stacked = [quantize_fp8_weight_ref(state[f"model.layers.1.self_attn.{n}_proj.weight"]) for n in "qkv"]
    assert same_bytes(qkv.weight, torch.cat([v for v, _ in stacked]))
    assert torch.equal(qkv.weight_scale, torch.cat([s for _, s in stacked]))
    # The embedding, the norms (and qwen2's biases) stay as they were.
    assert torch.equal(online.model.embed_tokens.weight, state["model.embed_tokens.weight"])
    assert online.lm_head is None or online.lm_head.weight.dtype == torch.float32


def test_writer_layout_is_compressed_tensors(tiny_checkpoints):
    folder = tiny_checkpoints["tiny-llama-fp8"]
    state = load_file(str(folder / "model.safetensors"))
    p = "model.layers.0.self_attn.q_proj"
    assert state[f"{p}.weight"].dtype == FP8
    assert state[f"{p}.weight_scale"].dtype == torch.float32 and state[f"{p}.weight_scale"].shape == (64, 1)
    assert state["lm_head.weight"].dtype == torch.float32 and "lm_head.weight_scale" not in state
    config = quantization_config(folder)
    assert config["quant_method"] == "compressed-tensors" and config["format"] == "float-quantized"
    group = config["config_groups"]["group_0"]
    assert group["weights"]["strategy"] == "channel" and group["input_activations"]["dynamic"] is True
    assert config["ignore"] == ["lm_head"]


def test_per_tensor_scales_and_static_input_scales(tiny_checkpoints, tmp_path):
    """strategy "tensor": one scale per checkpoint tensor, repeated over its rows of the fused projection;
    static input scales: the largest of q/k/v (gate/up) is the fused projection's, and the model's
    projections quantize their inputs with it."""
    folder = write_fp8_checkpoint(tiny_checkpoints["tiny-llama"], tmp_path / "fp8-tensor", strategy="tensor",
                                  input_scale=0.02)
    state = load_file(str(folder / "model.safetensors"))
    p = "model.layers.0.self_attn."
    state[f"{p}k_proj.input_scale"] = torch.tensor([0.05])  # k's is the largest of the three
    state[f"{p}k_scale"], state[f"{p}v_scale"] = torch.tensor(1.0), torch.tensor(1.0)  # static KV scales: unused here
    save_file(state, str(folder / "model.safetensors"))
    model = load_model(EngineConfig(model=str(folder), device="cpu"))
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert qkv.input_scale.item() == pytest.approx(0.05)
    assert model.model.layers[0].mlp.gate_up_proj.input_scale.item() == pytest.approx(0.02)
    rows = 0
    for n in "qkv":
        scale = state[f"{p}{n}_proj.weight_scale"]
        assert scale.shape == (1,)
        size = state[f"{p}{n}_proj.weight"].shape[0]
        assert torch.equal(qkv.weight_scale[rows:rows + size], scale.expand(size))
        rows += size
    x = torch.randn(3, 64)
    expected = _dequantized(quantize_fp8_per_token_ref(x, torch.tensor(0.05))) @ \
        dequantize_fp8_weight_ref(qkv.weight, qkv.weight_scale).T
    torch.testing.assert_close(qkv(x), expected, atol=1e-5, rtol=1e-5)


def _dequantized(quantized):
    values, scale = quantized
    return values.float() * scale[:, None]


def test_a_dense_sparsity_config_loads(tiny_checkpoints):
    config = {**quantization_config(tiny_checkpoints["tiny-llama-fp8"]), "sparsity_config": {"format": "dense"}}
    assert resolve(None, config, "config.json").method == "compressed-tensors"


def test_targets_that_match_no_projection_are_refused(copy_of):
    folder = copy_of("tiny-llama-fp8")
    config = quantization_config(folder)
    for group in config["config_groups"].values():
        group["targets"] = ["re:.*no_such_proj$"]
    edit_config(folder, quantization_config=config)
    with pytest.raises(ValueError, match=r"targets \[\['re:\.\*no_such_proj\$'\]\] .* match none of LlamaForCausalLM"):
        load_model(EngineConfig(model=str(folder), device="cpu"))


@pytest.mark.parametrize("tensor, value, message", [
    ("model.layers.0.mlp.down_proj.weight_scale", float("nan"), r"down_proj.weight_scale: scales must be finite "
                                                                 r"and >= 0; 1 of \d+ are not, e.g. nan"),
    ("model.layers.1.self_attn.k_proj.weight_scale", -1.0, r"k_proj.weight_scale: .*e.g. -1.0"),
    ("model.layers.0.self_attn.q_proj.input_scale", 0.0, r"q_proj.input_scale: scales must be finite and > 0; "
                                                         r"1 of 1 are not, e.g. 0.0"),
    ("model.layers.0.mlp.up_proj.input_scale", float("inf"), r"up_proj.input_scale: .*e.g. inf"),
])
def test_bad_scale_values_fail_the_load(tiny_checkpoints, tmp_path, tensor, value, message):
    folder = write_fp8_checkpoint(tiny_checkpoints["tiny-llama"], tmp_path / "bad-scale", input_scale=0.02)
    state = load_file(str(folder / "model.safetensors"))
    state[tensor].view(-1)[-1] = value
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=message):
        load_model(EngineConfig(model=str(folder), device="cpu"))


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e-50", "1e39"])
def test_the_writer_refuses_a_bad_input_scale(tiny_checkpoints, tmp_path, value, capsys):
    with pytest.raises(SystemExit):
        fp8_checkpoint_main([str(tiny_checkpoints["tiny-llama"]), str(tmp_path / "out"), "--input-scale", value])
    assert "must be a finite number > 0" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("input_scale", [None, 0.02], ids=["dynamic", "static"])
def test_a_quantized_lm_head_is_dequantized(tiny_checkpoints, tmp_path, input_scale):
    folder = write_fp8_checkpoint(tiny_checkpoints["tiny-llama"], tmp_path / "fp8-head", input_scale=input_scale)
    state = load_file(str(folder / "model.safetensors"))
    head = state["lm_head.weight"]
    state["lm_head.weight"], state["lm_head.weight_scale"] = quantize_weight(head)
    if input_scale is not None:   # llm-compressor writes one for every target, the head too
        state["lm_head.input_scale"] = torch.tensor([input_scale])
    save_file(state, str(folder / "model.safetensors"))
    config = quantization_config(folder)
    config["ignore"] = []
    edit_config(folder, quantization_config=config)
    model = load_model(EngineConfig(model=str(folder), device="cpu"))
    assert model.lm_head.weight.dtype == torch.float32
    expected = dequantize_fp8_weight_ref(state["lm_head.weight"], state["lm_head.weight_scale"].reshape(-1))
    assert torch.equal(model.lm_head.weight, expected)


def test_mismatched_checkpoints_are_named(tiny_checkpoints, tmp_path, copy_of):
    """FP8 tensors without a quantization_config: dequantized, or with quantization "fp8" refused; a
    quantization_config over unquantized tensors: their scales are missing."""
    fp8 = shutil.copytree(tiny_checkpoints["tiny-llama-fp8"], tmp_path / "no-config")
    config = json.loads((fp8 / "config.json").read_text())
    del config["quantization_config"]
    (fp8 / "config.json").write_text(json.dumps(config))
    model = load_model(EngineConfig(model=str(fp8), device="cpu"))
    state = load_file(str(fp8 / "model.safetensors"))
    p = "model.layers.0.mlp.down_proj."
    assert torch.equal(model.model.layers[0].mlp.down_proj.weight,
                       dequantize_fp8_weight_ref(state[p + "weight"], state[p + "weight_scale"].reshape(-1)))
    with pytest.raises(ValueError, match=r"does not use .*weight_scale"):  # the scales nothing reads
        load_model(EngineConfig(model=str(fp8), device="cpu", quantization="fp8"))
    plain = copy_of("tiny-llama")
    edit_config(plain, quantization_config=quantization_config(tiny_checkpoints["tiny-llama-fp8"]))
    with pytest.raises(ValueError, match=r"missing .* tensor\(s\).*weight_scale"):
        load_model(EngineConfig(model=str(plain), device="cpu"))


class RecordedSlice:
    def __init__(self, tensor_slice, name, reads):
        self.tensor_slice, self.name, self.reads = tensor_slice, name, reads

    def get_shape(self):
        return self.tensor_slice.get_shape()

    def get_dtype(self):
        return self.tensor_slice.get_dtype()

    def __getitem__(self, index):
        self.reads.setdefault(self.name, []).append(index)
        return self.tensor_slice[index]


def load_rank(monkeypatch, folder, rank, **config):
    reads = {}
    get_slice = SafetensorsCheckpoint.get_slice
    monkeypatch.setattr(SafetensorsCheckpoint, "get_slice",
                        lambda self, name: RecordedSlice(get_slice(self, name), name, reads))
    engine_config = EngineConfig(model=str(folder), device="cpu", tensor_parallel_size=2, **config)
    return load_model(engine_config, TensorParallelGroup(rank, 2)), reads


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_quantizes_its_own_block(tiny_checkpoints, monkeypatch, rank):
    """Quantizing at load under tensor parallelism: each rank reads only its block of each projection and
    quantizes that (a row-parallel rank's scales: from its own columns), as the FP8 writer would the block."""
    folder = tiny_checkpoints["tiny-llama"]
    model, reads = load_rank(monkeypatch, folder, rank, quantization="fp8")
    state = load_file(str(folder / "model.safetensors"))
    p = "model.layers.1."
    for name in (f"{p}self_attn.q_proj.weight", f"{p}mlp.down_proj.weight"):
        dim = 1 if "down_proj" in name else 0
        half = state[name].shape[dim] // 2
        (index,) = reads[name]
        assert torch.equal(state[name][index], state[name].narrow(dim, rank * half, half)), name
    block = {n: state[f"{p}self_attn.{n}_proj.weight"].chunk(2)[rank] for n in "qkv"}
    values, scale = quantize_fp8_weight_ref(torch.cat([block[n] for n in "qkv"]))
    qkv = model.model.layers[1].self_attn.qkv_proj
    assert same_bytes(qkv.weight, values) and torch.equal(qkv.weight_scale, scale)
    down = model.model.layers[1].mlp.down_proj
    values, scale = quantize_fp8_weight_ref(state[f"{p}mlp.down_proj.weight"].chunk(2, 1)[rank])
    assert same_bytes(down.weight, values) and torch.equal(down.weight_scale, scale)


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_dequantizes_its_block_of_a_per_tensor_scaled_weight(tiny_checkpoints, tmp_path, monkeypatch,
                                                                        rank):
    """FP8 tensors with one scale each ([1], as llm-compressor writes them) that a rank keeps in the model's
    dtype: a quantized LM head, and every projection of a checkpoint without its quantization_config."""
    folder = write_fp8_checkpoint(tiny_checkpoints["tiny-llama"], tmp_path / "fp8-tensor", strategy="tensor")
    state = load_file(str(folder / "model.safetensors"))
    state["lm_head.weight"], state["lm_head.weight_scale"] = quantize_weight(state["lm_head.weight"], "tensor")
    save_file(state, str(folder / "model.safetensors"))
    config = quantization_config(folder)
    config["ignore"] = []
    edit_config(folder, quantization_config=config)
    model, _ = load_rank(monkeypatch, folder, rank)
    def dequantized(name: str) -> torch.Tensor:
        return dequantize_fp8_weight_ref(state[name + "weight"], state[name + "weight_scale"].expand(
            state[name + "weight"].shape[0]))

    head = dequantized("lm_head.")
    assert torch.equal(model.lm_head.weight, head.chunk(2)[rank])
    config = json.loads((folder / "config.json").read_text())
    del config["quantization_config"]
    (folder / "config.json").write_text(json.dumps(config))
    model, _ = load_rank(monkeypatch, folder, rank)
    p = "model.layers.0.self_attn.q_proj."
    q = dequantized(p)
    assert torch.equal(model.model.layers[0].self_attn.qkv_proj.weight[:q.shape[0] // 2], q.chunk(2)[rank])


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_reads_its_block_of_a_compressed_tensors_checkpoint(tiny_checkpoints, monkeypatch, rank):
    folder = tiny_checkpoints["tiny-llama-fp8"]
    model, reads = load_rank(monkeypatch, folder, rank)
    state = load_file(str(folder / "model.safetensors"))
    p = "model.layers.1."
    gate_up = model.model.layers[1].mlp.gate_up_proj
    halves = [state[f"{p}mlp.{n}_proj.weight"].chunk(2)[rank] for n in ("gate", "up")]
    assert same_bytes(gate_up.weight, torch.cat(halves))
    scales = [state[f"{p}mlp.{n}_proj.weight_scale"].reshape(-1).chunk(2)[rank] for n in ("gate", "up")]
    assert torch.equal(gate_up.weight_scale, torch.cat(scales))
    assert reads[f"{p}mlp.gate_proj.weight_scale"] != [slice(None)]  # its rows, not the whole tensor
    down = model.model.layers[1].mlp.down_proj
    assert same_bytes(down.weight, state[f"{p}mlp.down_proj.weight"].chunk(2, 1)[rank])
    assert torch.equal(down.weight_scale, state[f"{p}mlp.down_proj.weight_scale"].reshape(-1))  # every row


# --- the FP8 model's logits --------------------------------------------------------------------------

def make_runner(folder, device="cpu", **overrides):
    config = dict(model=str(folder), dtype="float32", device=device, num_kv_blocks=256, block_size=4,
                  max_num_seqs=64, max_model_len=256)
    config.update(overrides)
    return ModelRunner(EngineConfig(**config))


def every_position_logits(runner, ids):
    """Teacher-forced logits at every position of ids, in one step: one sequence per prefix."""
    seqs, next_block = [], 0
    block_size = getattr(runner, "runner", runner).block_size  # a tensor-parallel runner wraps rank 0's
    for n in range(1, len(ids) + 1):
        seq = Sequence(token_ids=list(ids[:n]), sampling_params=None)
        seq.block_table = list(range(next_block, next_block + -(-n // block_size)))
        next_block += len(seq.block_table)
        seqs.append(seq)
    return runner.execute(ScheduledBatch(seqs, [len(s) for s in seqs], [True] * len(seqs))).cpu()


class FakeQuantizedHF:
    """HF transformers on the checkpoint with every decoder projection fake-quantized: weights replaced by
    their dequantized e4m3 values and, while `quantize_inputs` is on, inputs quantized per token and
    dequantized (W8A8; off: W8A16, as skinny_linear computes)."""

    def __init__(self, folder, input_scale: float | None = None) -> None:
        """`input_scale`: a static activation scale for every projection (None: per token, dynamic)."""
        self.model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
        self.quantize_inputs = True
        self.input_scale = None if input_scale is None else torch.tensor(input_scale)
        with torch.no_grad():
            for name, module in self.model.named_modules():
                if isinstance(module, torch.nn.Linear) and name.rpartition(".")[2] in PROJECTIONS:
                    module.weight.copy_(dequantize_fp8_weight_ref(*quantize_fp8_weight_ref(module.weight)))
                    module.register_forward_pre_hook(self._quantize)

    def _quantize(self, _, args):
        if not self.quantize_inputs:
            return None
        x = args[0]
        rows = x.reshape(-1, x.shape[-1])
        return (_dequantized(quantize_fp8_per_token_ref(rows, self.input_scale)).reshape(x.shape),)

    @torch.no_grad()
    def __call__(self, ids: list[int]) -> torch.Tensor:
        """Logits at every position of ids."""
        return self.model(torch.tensor([ids])).logits[0]


def hf_step(model, ids: list[list[int]], cache=None):
    """One HF forward with its KV cache -> (logits, the cache). The keyword is `cache` since transformers 5.2x
    and `past_key_values` before (the GPU image's 5.17); an unknown keyword disappears into **kwargs there,
    and the step runs without its context (the H200 run of 2026-12-04: decode logits 12 off)."""
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        out = model(torch.tensor(ids), use_cache=True, **({name: cache} if cache is not None else {}))
    return out.logits, out["cache"] if "cache" in out else out["past_key_values"]


def relative_errors(got: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """||got - expected|| / ||expected|| per position (row)."""
    return (got - expected).norm(dim=-1) / expected.norm(dim=-1)


def assert_w8a8_logits(got: torch.Tensor, expected: torch.Tensor, device: str) -> None:
    """The engine's logits [positions, vocab] against HF fake-quantized: elementwise within ATOL on the CPU;
    on a GPU within GPU_MEAN_REL / GPU_MAX_REL per position (why: at their definition)."""
    if device == "cpu":
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
        return
    errors = relative_errors(got, expected)
    assert errors.mean() <= GPU_MEAN_REL and errors.max() <= GPU_MAX_REL, (
        f"relative logit error per position: mean {errors.mean():.4f} (bound {GPU_MEAN_REL}), max "
        f"{errors.max():.4f} (bound {GPU_MAX_REL}) at position {int(errors.argmax())}")


@pytest.fixture(scope="module")
def hf_fake_quantized(tiny_checkpoints):
    return {arch: FakeQuantizedHF(tiny_checkpoints[arch]) for arch in ARCHS}


def test_a_static_input_scale_checkpoint_computes_its_w8a8_function(tiny_checkpoints, tmp_path):
    """llm-compressor's static FP8 scheme (an input_scale per projection), written by our writer: every
    position's logits against HF with the same weights and every input quantized with that scale."""
    folder = write_fp8_checkpoint(tiny_checkpoints["tiny-llama"], tmp_path / "fp8-static", input_scale=0.02)
    runner = make_runner(folder)
    hf = FakeQuantizedHF(tiny_checkpoints["tiny-llama"], input_scale=0.02)
    for text in PROMPTS:
        ids = runner.tokenizer.encode(text)
        assert_w8a8_logits(every_position_logits(runner, ids), hf(ids), "cpu")


@pytest.fixture(params=["unfused", "fused, one row on CUDA cores"])
def small_batch_fusion(request):
    """Decode rows through fp8_linear (W8A8), or through skinny_linear with its e4m3 weights (W8A16)."""
    with override_launch_params("skinny_linear", max_rows=0 if request.param == "unfused" else SKINNY_MAX_ROWS,
                                single_row_on_cuda_cores=True):
        yield request.param


@pytest.fixture(params=DEVICES)
def run_device(request):
    return request.param


@pytest.mark.parametrize("arch", ARCHS)
def test_fp8_model_computes_the_w8a8_function(arch, run_device, tiny_checkpoints, hf_fake_quantized):
    """Prefill logits at every position against HF fake-quantized: on the CPU within the unquantized parity's
    1e-4, on a GPU within the fast accumulation's bounds (GPU_MEAN_REL, GPU_MAX_REL)."""
    runner = make_runner(tiny_checkpoints[arch], run_device, quantization="fp8")
    for text in PROMPTS:
        ids = runner.tokenizer.encode(text)
        assert_w8a8_logits(every_position_logits(runner, ids), hf_fake_quantized[arch](ids), run_device)


def decode_steps(runner, hf: FakeQuantizedHF, quantize_decode_inputs: bool, steps: int = 4):
    """A prefill of the two prompts but their last 4 tokens (W8A8), then `steps` teacher-forced decode steps of
    both -> (the engine's logits, HF's with its KV cache), [2 * steps, vocab] each; HF quantizes its inputs in
    the prefill, and in the decode steps when quantize_decode_inputs."""
    texts = [runner.tokenizer.encode(t) for t in PROMPTS]
    seqs, caches = [], []
    hf.quantize_inputs = True
    try:
        for i, ids in enumerate(texts):
            seq = Sequence(token_ids=list(ids[:-4]), sampling_params=None)
            seq.block_table = list(range(32 * i, 32 * i + 32))
            seqs.append(seq)
            caches.append(hf_step(hf.model, [ids[:-4]])[1])
        runner.execute(ScheduledBatch(seqs, [len(s) for s in seqs], [True] * len(seqs)))
        hf.quantize_inputs = quantize_decode_inputs
        got, expected = [], []
        for _ in range(steps):
            for seq, ids in zip(seqs, texts):
                seq.num_computed_tokens = len(seq)
                seq.append_token(ids[len(seq)])
            got.append(runner.execute(ScheduledBatch(seqs, [1, 1], [True, True])).cpu())
            expected += [hf_step(hf.model, [[seq.token_ids[-1]]], cache)[0][0, -1] for seq, cache in zip(seqs, caches)]
    finally:
        hf.quantize_inputs = True
    return torch.cat(got), torch.stack(expected)


def test_fp8_decode_steps_compute_the_w8a8_function(run_device, tiny_checkpoints, hf_fake_quantized,
                                                    small_batch_fusion):
    """A prefill of two sequences (W8A8), then paged decode steps: W8A8 through fp8_linear, or W8A16 through
    skinny_linear (e4m3 weights, activations as they are), against HF with its KV cache, its inputs
    quantized in the prefill and in the decode steps as the path does. On a GPU the decode steps replay
    CUDA graphs."""
    runner = make_runner(tiny_checkpoints["tiny-llama"], run_device, quantization="fp8")
    got, expected = decode_steps(runner, hf_fake_quantized["tiny-llama"], small_batch_fusion == "unfused")
    assert_w8a8_logits(got, expected, run_device)


def test_projections_take_rows_quantized_by_the_kernel_before(tiny_checkpoints, monkeypatch):
    """With per-token scales the norms' kernels quantize the qkv and gate_up inputs and the SwiGLU gate's the down
    projection's (a launch fewer each), and the logits are those of the ops and the quantizer apart, to the bit."""
    runner = make_runner(tiny_checkpoints["tiny-llama"], quantization="fp8")
    ids = runner.tokenizer.encode(PROMPTS[0])
    calls = []
    for name in ("silu_and_mul_quantize_fp8", "rms_norm_quantize_fp8"):
        op = getattr(ops, name)
        monkeypatch.setattr(ops, name, lambda *args, op=op, name=name: calls.append(name) or op(*args))
    fused = every_position_logits(runner, ids)
    layers = runner.model_config.num_hidden_layers
    assert calls.count("silu_and_mul_quantize_fp8") == layers and calls.count("rms_norm_quantize_fp8") == 2 * layers
    monkeypatch.setattr(Linear, "takes_quantized_rows", property(lambda self: False))
    assert torch.equal(every_position_logits(runner, ids), fused)
    assert len(calls) == 3 * layers


def fast_accumulating_fp8_matmul(bits: int):
    """ops.fp8_matmul as Hopper's FP8 tensor cores compute it (fp8_gemm_error_bound's fast accumulation): the
    products summed exactly within each group of FAST_ACCUM_GROUP along K, the running sum truncated to `bits`
    significant bits after each group."""
    def matmul(a, a_scale, weight, weight_scale, bias, out_dtype):
        a, b = a.double(), weight.double()
        acc = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float64)
        for k in range(0, a.shape[1], FAST_ACCUM_GROUP):
            mantissa, exponent = torch.frexp(acc + a[:, k:k + FAST_ACCUM_GROUP] @ b[:, k:k + FAST_ACCUM_GROUP].T)
            acc = torch.ldexp(torch.trunc(mantissa * 2.0 ** bits) / 2.0 ** bits, exponent)
        out = acc.float() * a_scale.float()[:, None] * weight_scale[None, :]
        return (out if bias is None else out + bias.float()).to(out_dtype)
    return matmul


def emulate_fast_accumulation(monkeypatch, bits: int, quantize_inputs: bool = True) -> None:
    """Every W8A8 GEMM of the model (ops.fp8_linear, and ops.fp8_matmul after the norms' and the gate's
    quantizing kernels) through fast_accumulating_fp8_matmul; its activations quantized per token as the
    references do, or (quantize_inputs False) left as they are: W8A16."""
    matmul = fast_accumulating_fp8_matmul(bits)

    def quantize(x, input_scale=None):
        return quantize_fp8_per_token_ref(x, input_scale) if quantize_inputs else (x, torch.ones(x.shape[0]))

    def linear(x, weight, weight_scale, bias=None, input_scale=None):
        return matmul(*quantize(x, input_scale), weight, weight_scale, bias, x.dtype)

    monkeypatch.setattr(ops, "fp8_linear", linear)
    monkeypatch.setattr(ops, "fp8_matmul", matmul)
    monkeypatch.setattr(ops, "silu_and_mul_quantize_fp8", lambda x: quantize(silu_and_mul_ref(x)))
    monkeypatch.setattr(ops, "rms_norm_quantize_fp8", lambda x, weight, eps, residual=None: quantize(
        rms_norm_ref(x, weight, eps) if residual is None else rms_norm_ref(x, weight, eps, residual)[0]))


def test_gpu_bounds_hold_under_emulated_fast_accumulation(monkeypatch, tiny_checkpoints, hf_fake_quantized):
    """Where GPU_MEAN_REL and GPU_MAX_REL come from, re-measured on the CPU: the model with every W8A8 GEMM
    summed as Hopper's FP8 tensor cores do, but one bit worse (13 significant bits), stays within them in
    prefill and decode; with its activations left unquantized (a wiring error they must catch) it does not."""
    emulate_fast_accumulation(monkeypatch, bits=13)
    for arch in ARCHS:
        runner = make_runner(tiny_checkpoints[arch], quantization="fp8")
        ids = [runner.tokenizer.encode(text) for text in PROMPTS]
        got = torch.cat([every_position_logits(runner, i) for i in ids])
        assert_w8a8_logits(got, torch.cat([hf_fake_quantized[arch](i) for i in ids]), "cuda")
    runner = make_runner(tiny_checkpoints["tiny-llama"], quantization="fp8")
    assert_w8a8_logits(*decode_steps(runner, hf_fake_quantized["tiny-llama"], True), "cuda")
    emulate_fast_accumulation(monkeypatch, bits=13, quantize_inputs=False)
    runner = make_runner(tiny_checkpoints["tiny-llama"], quantization="fp8")
    ids = runner.tokenizer.encode(PROMPTS[1])
    with pytest.raises(AssertionError, match="relative logit error"):
        assert_w8a8_logits(every_position_logits(runner, ids), hf_fake_quantized["tiny-llama"](ids), "cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernels run compiled in the tests above")
@pytest.mark.slow  # a model's prefill in the interpreter: ~5 s; the kernels' own tests stay in the fast tier
def test_triton_kernels_in_the_interpreter_compute_the_w8a8_function(monkeypatch, tiny_checkpoints,
                                                                      hf_fake_quantized):
    """Every op through its Triton kernel (TRITON_INTERPRET=1): the quantizer and the FP8 GEMM in prefill."""
    monkeypatch.setenv("LLM_ENGINE_KERNELS", "triton")
    importlib.reload(ops)
    try:
        runner = make_runner(tiny_checkpoints["tiny-qwen2"], quantization="fp8")
        ids = runner.tokenizer.encode(PROMPTS[0])[:12]
        logits = every_position_logits(runner, ids)
    finally:
        monkeypatch.delenv("LLM_ENGINE_KERNELS")
        importlib.reload(ops)
    torch.testing.assert_close(logits, hf_fake_quantized["tiny-qwen2"](ids), atol=ATOL, rtol=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernels run compiled in the tests above")
@pytest.mark.slow  # a prefill and 3 decode steps in the interpreter, twice: ~15 s
def test_triton_kernels_in_the_interpreter_decode_as_the_references_with_fp8_weights_and_kv(
        monkeypatch, tiny_checkpoints, hf_fake_quantized, small_batch_fusion):
    """Every op through its Triton kernel against every op through its torch reference: the FP8 KV write and
    attention, the small-batch FP8 projections (fused or not) and the quantizers, in a prefill then decode steps."""
    def logits(mode: str) -> torch.Tensor:
        monkeypatch.setenv("LLM_ENGINE_KERNELS", mode)
        importlib.reload(ops)
        runner = make_runner(tiny_checkpoints["tiny-llama"], quantization="fp8", kv_cache_dtype="fp8_e4m3")
        return decode_steps(runner, hf_fake_quantized["tiny-llama"], True, steps=3)[0]

    try:
        kernels, references = logits("triton"), logits("ref")
    finally:
        monkeypatch.delenv("LLM_ENGINE_KERNELS")
        importlib.reload(ops)
    torch.testing.assert_close(kernels, references, atol=ATOL, rtol=0)
    assert torch.equal(kernels.argmax(-1), references.argmax(-1))


@pytest.mark.parametrize("arch", ARCHS)
def test_fp8_model_stays_near_the_unquantized_one(arch, tiny_checkpoints, capsys):
    """The stated bounds (module docstring); the agreement is printed (pytest -s shows it)."""
    exact, fp8 = make_runner(tiny_checkpoints[arch]), make_runner(tiny_checkpoints[arch], quantization="fp8")
    errors, agree, total = [], 0, 0
    for text in PROMPTS:
        ids = exact.tokenizer.encode(text)
        ref, got = every_position_logits(exact, ids), every_position_logits(fp8, ids)
        errors += ((got - ref).norm(dim=-1) / ref.norm(dim=-1)).tolist()
        agree += int((got.argmax(-1) == ref.argmax(-1)).sum())
        total += len(ids)
    mean, worst = sum(errors) / len(errors), max(errors)
    with capsys.disabled():
        print(f"\n{arch} FP8 vs fp32 logits: relative error mean {mean:.3f}, max {worst:.3f}; "
              f"teacher-forced argmax agreement {agree}/{total} ({100 * agree / total:.0f}%)", file=sys.stderr)
    assert mean <= 0.35 and worst <= 1.25 and agree / total >= 0.5


def test_llm_serves_both_ways_in_alike(tiny_checkpoints):
    """Through the LLM front: quantization "fp8" on tiny-llama and the FP8 checkpoint generate the same."""
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outputs = []
    for folder, quantization in ((tiny_checkpoints["tiny-llama"], "fp8"), (tiny_checkpoints["tiny-llama-fp8"], None)):
        with LLM(str(folder), device="cpu", max_model_len=256, quantization=quantization) as llm:
            outputs.append([o.token_ids for o in llm.generate(PROMPTS, greedy)])
    assert outputs[0] == outputs[1] and all(len(t) == 12 for t in outputs[0])


def test_engine_settings_take_quantization(tiny_checkpoints, tmp_path):
    """config.pbtxt's parameter, engine.json and vllm_backend's model.json `quantization`."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "backends" / "triton_llm"))
    try:
        from engine_settings import load_settings
        from vllm_engine_args import translate
    finally:
        sys.path.pop(0)
    folder = str(tiny_checkpoints["tiny-llama"])
    params = {"model": {"string_value": folder}, "device": {"string_value": "cpu"}}
    config, _, _ = load_settings({"parameters": {**params, "quantization": {"string_value": "fp8"}}}, tmp_path)
    assert config.quantization == "fp8" and config.weight_quantization.online
    config, _, _ = load_settings({"parameters": {**params, "quantization": {"string_value": "none"}}}, tmp_path)
    assert config.quantization is None and config.weight_quantization is None
    (tmp_path / "engine.json").write_text(json.dumps({"quantization": "fp8"}))
    assert load_settings({"parameters": params}, tmp_path)[0].weight_quantization.online
    assert translate({"model": folder, "quantization": "fp8"}, "model.json")[0]["quantization"] == "fp8"
    assert translate({"model": folder, "quantization": None}, "model.json")[0] == {"model": folder}
    for wrong in ("awq", "FP8"):
        with pytest.raises(ValueError, match=rf"quantization '{wrong}' \(supported: fp8, compressed-tensors or null\)"):
            translate({"model": folder, "quantization": wrong}, "model.json")


def test_fp8_on_a_gpu_before_ada_fails_at_start_naming_the_setting(tiny_checkpoints, monkeypatch):
    """Triton has no e4m3 type below compute capability 8.9: said before any weight loads."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA A100")
    folder = str(tiny_checkpoints["tiny-llama"])
    cuda = torch.device("cuda", 0)
    with pytest.raises(ValueError, match=r"quantization 'fp8' and kv_cache_dtype 'fp8_e4m3' need FP8 e4m3, .* "
                                         r"compute capability >= 8.9 .*; cuda:0 \(NVIDIA A100\) is 8.0"):
        check_fp8_support(EngineConfig(model=folder, device="cpu", quantization="fp8", kv_cache_dtype="fp8_e4m3"), cuda)
    check_fp8_support(EngineConfig(model=folder, device="cpu"), cuda)   # bf16: any GPU
    check_fp8_support(EngineConfig(model=folder, device="cpu", quantization="fp8"), torch.device("cpu"))
    with pytest.raises(ValueError, match=r"the checkpoint's quantization_config \(.*config.json\) needs FP8 e4m3"):
        check_fp8_support(EngineConfig(model=str(tiny_checkpoints["tiny-llama-fp8"]), device="cpu"), cuda)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (8, 9))
    check_fp8_support(EngineConfig(model=folder, device="cpu", quantization="fp8"), cuda)


@pytest.mark.parametrize("dtype", [torch.float8_e5m2, torch.int8])
@pytest.mark.parametrize("quantization", [None, "fp8"])
def test_weights_of_other_8_bit_or_integer_types_are_refused(tiny_checkpoints, tmp_path, dtype, quantization):
    """A quantized checkpoint whose config was lost: not read as values, nor quantized again."""
    folder = shutil.copytree(tiny_checkpoints["tiny-llama"], tmp_path / "int8")
    state = load_file(str(folder / "model.safetensors"))
    name = "model.layers.0.mlp.down_proj.weight"
    state[name] = state[name].clamp(-1, 1).to(dtype)
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"checkpoint tensor {name} is {dtype}: a weight must be float16"):
        load_model(EngineConfig(model=str(folder), device="cpu", quantization=quantization))


@pytest.mark.slow  # starts a worker process
def test_two_ranks_quantize_their_own_shards_and_run(tiny_checkpoints):
    """quantization "fp8" with tensor_parallel_size 2 (gloo): the worker quantizes its shard as it loads.
    Its row-parallel projections quantize their columns alone (weights at load, inputs per token), so
    the logits are not one rank's: within the stated FP8 bound of them."""
    config = dict(device="cpu", dtype="float32", max_model_len=256, block_size=4, num_kv_blocks=128,
                  quantization="fp8", enable_prefix_caching=False)
    folder = str(tiny_checkpoints["tiny-llama"])
    logits = []
    with LLM(folder, **config) as one, LLM(folder, tensor_parallel_size=2, **config) as two:
        for llm in (one, two):
            runner = llm.engine.model_runner
            logits.append(every_position_logits(runner, runner.tokenizer.encode(PROMPTS[0])))
        greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
        assert [len(o.token_ids) for o in two.generate(PROMPTS, greedy)] == [8, 8]
    errors = (logits[1] - logits[0]).norm(dim=-1) / logits[0].norm(dim=-1)
    assert errors.mean() <= 0.35


def test_make_random_model_writes_the_same_model_in_fp8(tmp_path):
    """benchmarks/make_random_model.py --quantization fp8 (the GPU benchmarks' FP8 checkpoint): its
    compressed-tensors folder loads tensor for tensor as its bf16 folder of the same seed quantized at load."""
    from benchmarks import make_random_model

    for name, extra in (("bf16", []), ("fp8", ["--quantization", "fp8"])):
        assert make_random_model.main(["--shape", "llama-tiny-test", "--out", str(tmp_path / name), *extra]) == 0
    online = load_model(EngineConfig(model=str(tmp_path / "bf16"), device="cpu", quantization="fp8"))
    written = load_model(EngineConfig(model=str(tmp_path / "fp8"), device="cpu"))
    assert written.model.layers[0].mlp.down_proj.weight.dtype == FP8
    _assert_same_state(_state(online), _state(written))
    index = json.loads((tmp_path / "fp8" / "model.safetensors.index.json").read_text())
    tensors = load_file(str(next((tmp_path / "fp8").glob("*.safetensors"))))
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
    assert set(index["weight_map"]) == set(tensors)
