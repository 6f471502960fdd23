"""Write a randomly initialised model of a real architecture's shape in HF format, for benchmarks.

Weights are drawn on the GPU when there is one (an 8B model in seconds), saved as sharded
safetensors with an index, plus config.json, generation_config.json and a word-level tokenizer
covering the whole vocabulary (so any sampled id detokenizes). Nothing is downloaded.

    python -m benchmarks.make_random_model --shape llama3-8b --out /tmp/llama3-8b-random

--quantization fp8 writes the same weights as a compressed-tensors FP8 checkpoint (llm-compressor's
layout, which vLLM loads): each decoder projection quantized by the engine's own quantizer
(llm_engine/model/fp8_checkpoint.py: e4m3, per-channel scales, or --fp8-strategy tensor) from its
bf16 values, so it loads tensor for tensor as the bf16 checkpoint of the same seed quantized at load
(EngineConfig quantization "fp8"):

    python -m benchmarks.make_random_model --shape llama3-8b --out /tmp/l8b-fp8 --quantization fp8
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

SHAPES = {
    "llama3-8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      intermediate_size=14336, vocab_size=128256, max_position_embeddings=131072,
                      rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                         "original_max_position_embeddings": 8192}),
    "llama3-70b": dict(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                       intermediate_size=28672, vocab_size=128256, max_position_embeddings=131072,
                       rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                          "original_max_position_embeddings": 8192}),
    # A few MB: the writer's own tests.
    "llama-tiny-test": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=128, vocab_size=512, max_position_embeddings=2048,
                            rope_theta=10000.0, rope_scaling=None),
    "llama-1b-test": dict(hidden_size=2048, num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4,
                          intermediate_size=8192, vocab_size=32000, max_position_embeddings=8192,
                          rope_theta=10000.0, rope_scaling=None),
}
SHARD_BYTES = 4 << 30


def tensor_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    h, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    head_dim = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * head_dim
    shapes = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,), "lm_head.weight": (vocab, h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h),
            p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        })
    return shapes


def write_tokenizer(out: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    vocab = {f"t{i}": i for i in range(vocab_size - 2)}
    vocab["<unk>"], vocab["</s>"] = vocab_size - 2, vocab_size - 1
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>", "unk_token": "<unk>",
        "model_max_length": 1 << 20}))


def copy_tokenizer(source: Path, out: Path, vocab_size: int) -> int:
    """The tokenizer files of `source` into `out`; its end-of-sequence id."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(source)
    if len(tok) > vocab_size:
        raise SystemExit(f"{source} has {len(tok)} tokens, more than the shape's vocab_size {vocab_size}")
    tok.save_pretrained(out)
    return tok.eos_token_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="an HF tokenizer folder to ship instead of the word-level one (benchmarks/bpe_tokenizer.py: "
                             "structured output needs a tokenizer that can spell JSON)")
    parser.add_argument("--quantization", choices=["fp8"], default=None,
                        help="write a compressed-tensors FP8 checkpoint (decoder projections in e4m3)")
    parser.add_argument("--fp8-strategy", choices=["channel", "tensor"], default="channel",
                        help="FP8 weight scales: one per output channel (default) or one per tensor")
    args = parser.parse_args(argv)

    cfg = dict(SHAPES[args.shape])
    out: Path = args.out
    if (out / "config.json").exists():
        print(f"{out} exists; keeping it")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, args.dtype)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(args.seed)
    shapes = tensor_shapes(cfg)

    itemsize = torch.tensor([], dtype=dtype).element_size()
    shards: list[list[str]] = [[]]
    shard_bytes = 0
    for name, shape in shapes.items():
        if shard_bytes >= SHARD_BYTES:
            shards.append([])
            shard_bytes = 0
        shards[-1].append(name)
        shard_bytes += math.prod(shape) * itemsize

    def quantize(name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        if args.quantization is None:
            return {name: tensor}
        from llm_engine.model.fp8_checkpoint import quantize_state
        return quantize_state({name: tensor}, args.fp8_strategy)

    weight_map, total_size = {}, 0
    bar = tqdm(total=len(shapes), desc=f"random {args.shape}", unit="tensor")
    for i, names in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for name in names:
            shape = shapes[name]
            if name.endswith("norm.weight"):
                tensors[name] = torch.ones(shape, dtype=dtype)
            else:
                # std 1/sqrt(fan_in) keeps activations O(1) through the layers, as a trained model's are.
                t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
                t = t.mul_(1.0 / math.sqrt(shape[-1])).to(dtype)
                tensors.update({n: q.cpu() for n, q in quantize(name, t).items()})
            bar.update(1)
        save_file(tensors, str(out / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, file))
        total_size += sum(t.numel() * t.element_size() for t in tensors.values())
    bar.close()
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total_size}, "weight_map": weight_map}, indent=1))
    vocab = cfg["vocab_size"]
    eos = copy_tokenizer(args.tokenizer, out, vocab) if args.tokenizer else vocab - 1
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
              "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "torch_dtype": args.dtype,
              "bos_token_id": eos, "eos_token_id": eos, "attention_bias": False,
              "mlp_bias": False, "head_dim": cfg["hidden_size"] // cfg["num_attention_heads"], **cfg}
    if args.quantization:
        from llm_engine.model.fp8_checkpoint import quantization_config
        config["quantization_config"] = quantization_config(args.fp8_strategy)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "bos_token_id": eos}))
    if not args.tokenizer:
        write_tokenizer(out, vocab)
    print(f"wrote {out} ({len(shards)} shards, {total_size / 1e9:.2f} GB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
