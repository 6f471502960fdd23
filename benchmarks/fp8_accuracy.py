"""FP8 weights against bf16 on the same weights (issue 25's accuracy report, for the 8B shape on a GPU).

Two engines' model runners, one after the other on the same checkpoint: bf16, then FP8 (quantization
"fp8", or a compressed-tensors checkpoint given with --fp8-model). For each of --prompts random prompts
of --prompt-len tokens: the logits at every position, teacher-forced (one step, a sequence per prefix),
compared as ||fp8 - bf16|| / ||bf16|| per position and as argmax agreement; then --gen greedy tokens from
each prompt by each model, compared as the share of positions equal and the first position they differ.
On the tiny CI models the same comparison is a test with stated bounds (tests/engine/test_fp8_model.py).

    python -m benchmarks.fp8_accuracy --model /tmp/l8b --json /tmp/fp8_accuracy.json
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import time
from pathlib import Path

import torch

from llm_engine.config import EngineConfig
from llm_engine.core.scheduled_batch import ScheduledBatch
from llm_engine.core.sequence import Sequence
from llm_engine.worker.model_runner import ModelRunner


def every_position_logits(runner: ModelRunner, ids: list[int]) -> torch.Tensor:
    """float32 logits [len(ids), vocab] on the CPU, teacher-forced: one step, one sequence per prefix."""
    seqs, next_block = [], 0
    for n in range(1, len(ids) + 1):
        seq = Sequence(token_ids=list(ids[:n]), sampling_params=None)
        seq.block_table = list(range(next_block, next_block + -(-n // runner.block_size)))
        next_block += len(seq.block_table)
        seqs.append(seq)
    return runner.execute(ScheduledBatch(seqs, [len(s) for s in seqs], [True] * len(seqs))).float().cpu()


def greedy(runner: ModelRunner, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    blocks = -(-(len(prompts[0]) + new_tokens) // runner.block_size)
    seqs = []
    for i, ids in enumerate(prompts):
        seq = Sequence(token_ids=list(ids), sampling_params=None)
        seq.block_table = list(range(i * blocks, (i + 1) * blocks))
        seqs.append(seq)
    num_new = [len(p) for p in prompts]
    for _ in range(new_tokens):
        logits = runner.execute(ScheduledBatch(seqs, num_new, [True] * len(seqs)))
        for seq, n, token in zip(seqs, num_new, logits.argmax(dim=-1).tolist()):
            seq.num_computed_tokens += n
            seq.append_token(token)
        num_new = [1] * len(seqs)
    return [s.token_ids[len(p):] for s, p in zip(seqs, prompts)]


def run(model: str, quantization: str | None, prompts: list[list[int]], new_tokens: int) -> dict:
    prompt_len = len(prompts[0])
    blocks = max(len(prompts) * -(-(prompt_len + new_tokens) // 16), sum(-(-n // 16) for n in range(prompt_len + 1)))
    config = EngineConfig(model=model, dtype="bfloat16", quantization=quantization, num_kv_blocks=blocks + 16,
                          enforce_eager=True, max_model_len=prompt_len + new_tokens + 16,
                          max_num_seqs=max(prompt_len, len(prompts)))
    t0 = time.perf_counter()
    runner = ModelRunner(config)
    load_s = time.perf_counter() - t0
    with torch.inference_mode():
        logits = [every_position_logits(runner, ids) for ids in prompts]
        tokens = greedy(runner, prompts, new_tokens)
    weights_gb = sum(p.numel() * p.element_size() for p in runner.model.parameters()) / 1e9
    del runner
    gc.collect()
    torch.cuda.empty_cache()
    return {"logits": logits, "tokens": tokens, "load_s": load_s, "weights_gb": weights_gb}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="an unquantized (bf16) HF checkpoint folder")
    parser.add_argument("--fp8-model", default=None,
                        help="a compressed-tensors FP8 checkpoint of the same weights (default: --model quantized "
                             "at load)")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--gen", type=int, default=64, help="greedy tokens per prompt")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(10, vocab - 10) for _ in range(args.prompt_len)] for _ in range(args.prompts)]
    bf16 = run(args.model, None, prompts, args.gen)
    fp8 = run(args.fp8_model or args.model, None if args.fp8_model else "fp8", prompts, args.gen)

    errors, agree, positions = [], 0, 0
    for ref, got in zip(bf16["logits"], fp8["logits"]):
        errors += ((got - ref).norm(dim=-1) / ref.norm(dim=-1)).tolist()
        agree += int((got.argmax(-1) == ref.argmax(-1)).sum())
        positions += ref.shape[0]
    same = sum(a == b for x, y in zip(bf16["tokens"], fp8["tokens"]) for a, b in zip(x, y))
    first_diff = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x))
                  for x, y in zip(bf16["tokens"], fp8["tokens"])]
    errors.sort()
    result = {
        "model": args.model, "fp8_model": args.fp8_model or f"{args.model} quantized at load",
        "prompts": args.prompts, "prompt_len": args.prompt_len, "gen": args.gen,
        "logits_rel_error_mean": sum(errors) / len(errors), "logits_rel_error_p50": errors[len(errors) // 2],
        "logits_rel_error_p99": errors[int(0.99 * (len(errors) - 1))], "logits_rel_error_max": errors[-1],
        "teacher_forced_argmax_agreement": agree / positions,
        "greedy_token_agreement": same / (args.gen * args.prompts), "greedy_first_difference": first_diff,
        "weights_gb": {"bf16": bf16["weights_gb"], "fp8": fp8["weights_gb"]},
        "load_s": {"bf16": bf16["load_s"], "fp8": fp8["load_s"]},
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
    }
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
