"""Checkpoint folders -> ModelConfig, EngineConfig, Tokenizer and weights; clear errors for bad folders."""
from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_checkpoints import tiny_checkpoints  # noqa: F401  (session fixture)
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from llm_engine.config import EngineConfig
from llm_engine.model.layers.rotary_embedding import compute_inv_freq
from llm_engine.model.loader import SafetensorsCheckpoint, load_model
from llm_engine.model.tokenizer import Tokenizer
from llm_engine.model_config import ModelConfig
from llm_engine.worker.distributed import TensorParallelGroup


@pytest.fixture
def copy_of(tiny_checkpoints, tmp_path):
    """copy_of(name) -> a scratch copy of a tiny checkpoint folder, free to break."""
    def make(name):
        return shutil.copytree(tiny_checkpoints[name], tmp_path / name)
    return make


def edit_json(path, **changes):
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


# --- ModelConfig --------------------------------------------------------------------------------

def test_model_configs_of_each_architecture(tiny_checkpoints):
    llama = ModelConfig.from_pretrained(tiny_checkpoints["tiny-llama"])
    assert llama.architecture == "LlamaForCausalLM"
    assert (llama.num_attention_heads, llama.num_key_value_heads, llama.head_dim) == (4, 2, 16)
    assert llama.rope_theta == 500000.0  # hub layout: rope_theta + rope_scaling
    assert llama.rope_scaling == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 256}
    assert not llama.qkv_bias and not llama.tie_word_embeddings and llama.dtype == torch.float32
    qwen = ModelConfig.from_pretrained(tiny_checkpoints["tiny-qwen2"])  # transformers-5 rope_parameters layout
    assert qwen.qkv_bias and not qwen.o_proj_bias and qwen.tie_word_embeddings and qwen.rope_scaling is None
    assert qwen.rope_theta == 1000000.0 and qwen.sliding_window is None
    tok = Tokenizer(tiny_checkpoints["tiny-qwen2"])
    assert qwen.eos_token_ids == (tok.hf_tokenizer.convert_tokens_to_ids("<|im_end|>"),)


@pytest.mark.parametrize("rope_scaling", [
    None,
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
])
def test_rope_frequencies_equal_transformers(rope_scaling):
    hf = LlamaConfig(hidden_size=4096, num_attention_heads=32, rope_theta=500000.0, rope_scaling=rope_scaling)
    rope_type = rope_scaling["rope_type"] if rope_scaling else None
    if rope_type is None:
        expected = 1.0 / (500000.0 ** (torch.arange(0, 128, 2, dtype=torch.int64).float() / 128))
    else:
        expected, _ = ROPE_INIT_FUNCTIONS[rope_type](hf, "cpu")
    assert torch.equal(compute_inv_freq(128, 500000.0, rope_scaling), expected)


def test_unsupported_architecture_is_named(copy_of):
    folder = copy_of("tiny-llama")
    edit_json(folder / "config.json", architectures=["GPT2LMHeadModel"])
    with pytest.raises(ValueError, match=r"GPT2LMHeadModel.*not supported.*LlamaForCausalLM"):
        ModelConfig.from_pretrained(folder)


def test_unsupported_rope_type_is_named(copy_of):
    folder = copy_of("tiny-llama")
    edit_json(folder / "config.json", rope_scaling={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(ValueError, match=r"rope_type 'yarn' is not supported"):
        ModelConfig.from_pretrained(folder)


def test_missing_folder_and_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ModelConfig.from_pretrained(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="config.json"):
        ModelConfig.from_pretrained(tmp_path)


# --- EngineConfig -------------------------------------------------------------------------------

def test_engine_config_defaults(tiny_checkpoints):
    config = EngineConfig(model=str(tiny_checkpoints["tiny-mistral"]), device="cpu")
    assert config.max_model_len == 2048  # the model's max_position_embeddings
    assert config.torch_dtype == torch.float32 and config.kv_cache_torch_dtype == torch.float32
    assert not config.use_cuda_graphs
    assert EngineConfig(model=str(tiny_checkpoints["tiny-mistral"]), device="cpu",
                        kv_cache_dtype="fp8_e4m3").kv_cache_torch_dtype == torch.float8_e4m3fn


def test_step_size_defaults_depend_on_the_device(tiny_checkpoints, monkeypatch):
    folder = str(tiny_checkpoints["tiny-llama"])
    cpu = EngineConfig(model=folder, device="cpu")
    assert (cpu.max_num_seqs, cpu.max_num_batched_tokens) == (256, 2048)
    monkeypatch.setattr("llm_engine.config._resolve_device", lambda device: torch.device("cuda", 0))
    # 1024 with FP8 KV on an H100 or H200, whose pool holds them
    for memory_gib, kv_cache_dtype, max_num_seqs in ((40, "fp8_e4m3", 512), (80, "auto", 512),
                                                     (80, "fp8_e4m3", 1024)):
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(
            total_memory=memory_gib << 30))
        gpu = EngineConfig(model=folder, kv_cache_dtype=kv_cache_dtype)
        assert (gpu.max_num_seqs, gpu.max_num_batched_tokens) == (max_num_seqs, 8192)
    assert EngineConfig(model=folder, max_num_seqs=64).max_num_seqs == 64


@pytest.mark.parametrize("field, value, message", [
    ("dtype", "float64", r"dtype must be one of .*'float64'"),
    ("kv_cache_dtype", "int8", r"kv_cache_dtype must be one of .*'int8'"),
    ("block_size", 12, r"block_size must be a power of two .* 12"),
    ("max_model_len", 4096, r"max_model_len 4096 exceeds the model's max_position_embeddings 2048"),
    ("max_num_seqs", 0, r"max_num_seqs must be an integer >= 1, got 0"),
    ("max_num_batched_tokens", 0, r"max_num_batched_tokens must be an integer >= 1"),
    ("gpu_memory_utilization", 1.5, r"gpu_memory_utilization must be in \(0, 1\], got 1.5"),
    ("num_kv_blocks", 0, r"num_kv_blocks must be an integer >= 1"),
    ("max_waiting", 0, r"max_waiting must be an integer >= 1"),
    ("device", "tpu", r"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got 'tpu'"),
    ("tensor_parallel_size", 0, r"tensor_parallel_size must be an integer >= 1"),
])
def test_engine_config_rejects_bad_values(tiny_checkpoints, field, value, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(model=str(tiny_checkpoints["tiny-llama"]), **{"device": "cpu", field: value})


# --- weights ------------------------------------------------------------------------------------

def test_fused_weights_stack_the_checkpoint_tensors(tiny_checkpoints):
    folder = tiny_checkpoints["tiny-qwen2"]
    model = load_model(EngineConfig(model=str(folder), device="cpu"))
    state = load_file(str(folder / "model.safetensors"))
    attn = model.model.layers[1].self_attn
    p = "model.layers.1."
    for kind in ("weight", "bias"):
        expected = torch.cat([state[f"{p}self_attn.{n}_proj.{kind}"] for n in "qkv"])
        assert torch.equal(getattr(attn.qkv_proj, kind), expected)
    gate_up = torch.cat([state[f"{p}mlp.gate_proj.weight"], state[f"{p}mlp.up_proj.weight"]])
    assert torch.equal(model.model.layers[1].mlp.gate_up_proj.weight, gate_up)
    assert model.lm_head is None  # tied: the LM head reads embed_tokens


def test_sharded_checkpoint_is_read_through_its_index(tiny_checkpoints):
    folder = tiny_checkpoints["tiny-mistral"]
    with SafetensorsCheckpoint(folder) as checkpoint:
        assert len(set(checkpoint.weight_map.values())) > 1
        assert tuple(checkpoint.get_slice("lm_head.weight").get_shape()) == (512, 64)


def test_loads_straight_into_the_target_dtype(tiny_checkpoints):
    model = load_model(EngineConfig(model=str(tiny_checkpoints["tiny-llama"]), device="cpu", dtype="bfloat16"))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.model.layers[0].self_attn.attn.rotary_emb.cos_sin_cache.dtype == torch.float32


def test_missing_weights_file(copy_of):
    folder = copy_of("tiny-llama")
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"no \*.safetensors weights"):
        load_model(EngineConfig(model=str(folder), device="cpu"))


def test_missing_shard(copy_of):
    folder = copy_of("tiny-mistral")
    (folder / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"missing from the folder: model-00002-of-00003.safetensors"):
        load_model(EngineConfig(model=str(folder), device="cpu"))


def test_missing_and_unknown_tensors_are_named(copy_of):
    folder = copy_of("tiny-llama")
    state = load_file(str(folder / "model.safetensors"))
    del state["model.layers.1.self_attn.k_proj.weight"]
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing 1 tensor.*model.layers.1.self_attn.k_proj.weight"):
        load_model(EngineConfig(model=str(folder), device="cpu"))
    state["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(32, 64)
    state["model.layers.1.mlp.gate_proj.bias"] = torch.zeros(128)
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=r"does not use.*model.layers.1.mlp.gate_proj.bias"):
        load_model(EngineConfig(model=str(folder), device="cpu"))


def test_shape_mismatch_is_named(copy_of):
    folder = copy_of("tiny-llama")
    edit_json(folder / "config.json", intermediate_size=96)
    with pytest.raises(ValueError, match=r"model.layers.0.mlp.gate_proj.weight has shape \(128, 64\); .*\(96, 64\)"):
        load_model(EngineConfig(model=str(folder), device="cpu"))


# --- tensor-parallel shards ---------------------------------------------------------------------

class RecordedSlice:
    """A checkpoint slice that notes which part of its tensor was read."""

    def __init__(self, tensor_slice, name: str, reads: dict) -> None:
        self.tensor_slice, self.name, self.reads = tensor_slice, name, reads

    def get_shape(self):
        return self.tensor_slice.get_shape()

    def __getitem__(self, index):
        self.reads[self.name] = index
        return self.tensor_slice[index]


def load_rank(monkeypatch, folder, rank: int, size: int = 2) -> tuple[torch.nn.Module, dict]:
    """Rank `rank`'s model shard (no process group needed to build and load one) and what it read."""
    reads = {}
    get_slice = SafetensorsCheckpoint.get_slice
    monkeypatch.setattr(SafetensorsCheckpoint, "get_slice",
                        lambda self, name: RecordedSlice(get_slice(self, name), name, reads))
    config = EngineConfig(model=str(folder), device="cpu", tensor_parallel_size=size)
    return load_model(config, TensorParallelGroup(rank, size)), reads


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_reads_only_its_block_of_each_split_tensor(tiny_checkpoints, monkeypatch, rank):
    folder = tiny_checkpoints["tiny-qwen2"]  # q/k/v biases, tied embeddings
    model, reads = load_rank(monkeypatch, folder, rank)
    state = load_file(str(folder / "model.safetensors"))
    assert set(reads) == set(state)
    for name, index in reads.items():
        tensor = state[name]
        if name.endswith("norm.weight"):
            assert tensor[index].shape == tensor.shape, name  # replicated: read whole
            continue
        dim = 1 if name.endswith(("o_proj.weight", "down_proj.weight")) else 0  # row- / column-parallel
        half = tensor.shape[dim] // 2
        assert torch.equal(tensor[index], tensor.narrow(dim, rank * half, half)), name
    p = "model.layers.1."
    block = {n: state[f"{p}self_attn.{n}_proj.weight"].chunk(2)[rank] for n in "qkv"}
    assert torch.equal(model.model.layers[1].self_attn.qkv_proj.weight, torch.cat([block[n] for n in "qkv"]))
    assert torch.equal(model.model.layers[1].mlp.down_proj.weight, state[f"{p}mlp.down_proj.weight"].chunk(2, 1)[rank])
    assert torch.equal(model.model.embed_tokens.weight, state["model.embed_tokens.weight"].chunk(2)[rank])


def test_a_vocabulary_that_does_not_split_evenly_is_padded(copy_of, monkeypatch):
    folder = copy_of("tiny-llama")  # untied LM head
    state = load_file(str(folder / "model.safetensors"))
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        state[name] = state[name][:511].contiguous()
    save_file(state, str(folder / "model.safetensors"))
    edit_json(folder / "config.json", vocab_size=511)
    model, _ = load_rank(monkeypatch, folder, rank=1)
    for name, param in (("model.embed_tokens.weight", model.model.embed_tokens.weight),
                        ("lm_head.weight", model.lm_head.weight)):
        assert param.shape == (256, 64)
        assert torch.equal(param[:255], state[name][256:]) and not param[255].any(), name


def test_a_split_tensor_of_the_wrong_shape_is_named(copy_of, monkeypatch):
    folder = copy_of("tiny-llama")
    state = load_file(str(folder / "model.safetensors"))
    state["model.layers.0.mlp.up_proj.weight"] = state["model.layers.0.mlp.up_proj.weight"][:127].contiguous()
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=r"up_proj.weight has shape \(127, 64\); tensor-parallel rank 0 of 2 "
                                         r"expects \(128, 64\), split along dim 0 into blocks of 64"):
        load_rank(monkeypatch, folder, rank=0)


# --- tokenizer ----------------------------------------------------------------------------------

def test_tokenizer_round_trip_eos_and_chat_template(tiny_checkpoints):
    tok = Tokenizer(tiny_checkpoints["tiny-llama"])
    text = "The capital of France is Paris."
    ids = tok.encode(text)
    assert ids and tok.decode(ids) == text
    im_end = tok.hf_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token_ids == (im_end,) and tok.eos_token_id == im_end
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    rendered = tok.apply_chat_template(messages, tokenize=False)
    assert rendered == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                        "<|im_start|>assistant\n")
    assert tok.apply_chat_template(messages) == tok.encode(rendered, add_special_tokens=False)
    assert tok.decode(tok.apply_chat_template(messages), skip_special_tokens=False) == rendered


def test_tokenizer_needs_tokenizer_json(copy_of):
    folder = copy_of("tiny-llama")
    (folder / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Tokenizer(folder)
