"""The engine's model through ModelRunner against HF transformers on the same float32 weights.

Prefill, chunked prefill, paged step-by-step decode, mixed batches and greedy generation, for
each architecture; on CPU with the torch reference ops, and once with the Triton kernels in the
interpreter. On a GPU the same cases run on CUDA (Triton kernels, CUDA graphs for decode).
"""
from __future__ import annotations

import importlib

import pytest
import torch
from tiers import in_full_run
from tiny_checkpoints import tiny_checkpoints  # noqa: F401  (session fixture)
from transformers import AutoModelForCausalLM

from llm_engine.config import EngineConfig
from llm_engine.core.scheduled_batch import ScheduledBatch
from llm_engine.core.sequence import Sequence
from llm_engine.kernels import SKINNY_MAX_ROWS
from llm_engine.kernels.launch_config import override_launch_params
from llm_engine.model import ops
from llm_engine.worker.model_runner import ModelRunner

ARCHS = ["tiny-llama", "tiny-mistral", "tiny-qwen2"]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
ATOL = 1e-4
NUM_BLOCKS = 64
BLOCK_SIZE = 4  # small blocks: short prompts still span several, non-adjacent blocks

PROMPTS = [
    "The capital of France is",
    "Retrieval augmented generation combines a search engine with a language model, so",
    "Two plus two",
]


def make_runner(folder, device, **overrides) -> ModelRunner:
    config = dict(model=str(folder), dtype="float32", device=device, num_kv_blocks=NUM_BLOCKS,
                  block_size=BLOCK_SIZE, max_num_seqs=8, max_model_len=256)
    config.update(overrides)
    return ModelRunner(EngineConfig(**config))


@pytest.fixture(scope="module")
def hf_models(tiny_checkpoints):
    return {name: AutoModelForCausalLM.from_pretrained(str(tiny_checkpoints[name]), dtype=torch.float32).eval()
            for name in ARCHS}


def hf_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


class Blocks:
    """Hands out blocks in a scrambled order, so a sequence's blocks are neither adjacent nor sorted."""

    def __init__(self) -> None:
        self.free = torch.randperm(NUM_BLOCKS, generator=torch.Generator().manual_seed(0)).tolist()

    def sequence(self, ids: list[int], capacity: int) -> Sequence:
        seq = Sequence(token_ids=list(ids), sampling_params=None)
        seq.block_table = [self.free.pop() for _ in range(-(-capacity // BLOCK_SIZE))]
        return seq


def step(runner, seqs, num_new, sample=None) -> torch.Tensor:
    """Run one step and account the computed tokens, as the scheduler would."""
    sample = sample or [s.num_computed_tokens + n == len(s) for s, n in zip(seqs, num_new)]
    logits = runner.execute(ScheduledBatch(seqs=seqs, num_new_tokens=num_new, sample=sample)).cpu()
    for s, n in zip(seqs, num_new):
        s.num_computed_tokens += n
    return logits


@pytest.fixture(params=DEVICES)
def run_device(request):
    return request.param


@pytest.fixture(params=["unfused", "fused", "fused, one row on CUDA cores"])
def small_batch_fusion(request):
    """The paths of a small decode batch: cuBLAS projections with separate norm, gate and residual ops,
    and the projections with those fused in (kernels/skinny_linear.py, on wherever max_rows allows),
    a single row on the tensor cores or on the CUDA cores."""
    with override_launch_params("skinny_linear", max_rows=0 if request.param == "unfused" else SKINNY_MAX_ROWS,
                                single_row_on_cuda_cores=request.param.endswith("CUDA cores")):
        yield request.param


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_batch_matches_hf(arch, run_device, tiny_checkpoints, hf_models):
    runner = make_runner(tiny_checkpoints[arch], run_device)
    prompts = [runner.tokenizer.encode(p) for p in PROMPTS]
    blocks = Blocks()
    seqs = [blocks.sequence(p, len(p)) for p in prompts]
    logits = step(runner, seqs, [len(p) for p in prompts])
    assert logits.shape == (len(prompts), runner.vocab_size) and logits.dtype == torch.float32
    for row, ids in zip(logits, prompts):
        torch.testing.assert_close(row, hf_logits(hf_models[arch], ids)[-1], atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_chunked_prefill_then_paged_decode_match_hf(arch, run_device, tiny_checkpoints, hf_models, small_batch_fusion):
    """Prompts prefilled in two chunks (the first not sampled), then teacher-forced decode steps
    for all of them at once through the paged cache."""
    runner = make_runner(tiny_checkpoints[arch], run_device)
    texts = [runner.tokenizer.encode(p + " the answer is four and the sky is blue") for p in PROMPTS]
    num_decode = 6
    prompts = [t[: len(t) - num_decode] for t in texts]
    blocks = Blocks()
    seqs = [blocks.sequence(p, len(t)) for p, t in zip(prompts, texts)]
    first = [len(p) // 2 + 1 for p in prompts]
    assert step(runner, seqs, first).shape == (0, runner.vocab_size)
    logits = step(runner, seqs, [len(p) - f for p, f in zip(prompts, first)])
    expected = [hf_logits(hf_models[arch], t) for t in texts]
    for i, p in enumerate(prompts):
        torch.testing.assert_close(logits[i], expected[i][len(p) - 1], atol=ATOL, rtol=0)
    for k in range(num_decode):
        for s, t in zip(seqs, texts):
            s.append_token(t[len(s)])
        logits = step(runner, seqs, [1] * len(seqs))
        for i, s in enumerate(seqs):
            torch.testing.assert_close(logits[i], expected[i][len(s) - 1], atol=ATOL, rtol=0,
                                       msg=lambda m: f"decode step {k}, sequence {i}: {m}")


@pytest.mark.parametrize("arch", ["tiny-qwen2"])
def test_mixed_decode_and_prefill_batch_matches_hf(arch, run_device, tiny_checkpoints, hf_models):
    runner = make_runner(tiny_checkpoints[arch], run_device)
    a, b = (runner.tokenizer.encode(p) for p in PROMPTS[:2])
    blocks = Blocks()
    first, second = blocks.sequence(a, len(a) + 1), blocks.sequence(b, len(b))
    step(runner, [first], [len(a)])
    first.append_token(b[0])
    logits = step(runner, [first, second], [1, len(b)])
    torch.testing.assert_close(logits[0], hf_logits(hf_models[arch], a + b[:1])[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[1], hf_logits(hf_models[arch], b)[-1], atol=ATOL, rtol=0)


def greedy_generate(runner, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """A minimal engine loop: one prefill step for all prompts, then batched decode steps."""
    blocks = Blocks()
    seqs = [blocks.sequence(p, len(p) + max_new_tokens) for p in prompts]
    eos = set(runner.eos_token_ids)
    active, num_new = list(seqs), [len(p) for p in prompts]
    while active:
        logits = step(runner, active, num_new)
        for s, token in zip(active, logits.argmax(dim=-1).tolist()):
            s.append_token(token)
        active = [s for s in active if s.output_token_ids[-1] not in eos and s.num_output_tokens < max_new_tokens]
        num_new = [1] * len(active)
    return [s.output_token_ids for s in seqs]


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_generation_matches_hf_generate(arch, run_device, tiny_checkpoints, hf_models, small_batch_fusion):
    runner = make_runner(tiny_checkpoints[arch], run_device)
    prompts = [runner.tokenizer.encode(p) for p in PROMPTS]
    max_new_tokens = 16
    got = greedy_generate(runner, prompts, max_new_tokens)
    model = hf_models[arch]
    for ids, tokens in zip(prompts, got):
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 do_sample=False, max_new_tokens=max_new_tokens)
        assert tokens == out[0, len(ids):].tolist()


def test_fp8_kv_cache_stays_close(run_device, tiny_checkpoints, hf_models):
    runner = make_runner(tiny_checkpoints["tiny-llama"], run_device, kv_cache_dtype="fp8_e4m3")
    assert runner.kv_cache.kv.dtype == torch.float8_e4m3fn
    ids = runner.tokenizer.encode(PROMPTS[1])
    blocks = Blocks()
    seq = blocks.sequence(ids[:-1], len(ids))
    step(runner, [seq], [len(ids) - 1])
    seq.append_token(ids[-1])
    logits = step(runner, [seq], [1])[0]
    expected = hf_logits(hf_models["tiny-llama"], ids)[-1]
    # e4m3 keeps ~2 significant digits per element: the logits move, but stay aligned with the exact ones.
    assert torch.nn.functional.cosine_similarity(logits, expected, dim=0) > 0.99


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the cuda cases run the Triton kernels compiled")
# 2-3 s each in the interpreter: the fast tier keeps "fused", whose decode step runs the fused projection
# kernel beside every other kernel (prefill's rows run the separate norm and gate kernels either way).
@pytest.mark.parametrize("small_batch_fusion", [*in_full_run("unfused"), "fused",
                                                *in_full_run("fused, one row on CUDA cores")], indirect=True)
def test_triton_kernels_in_the_interpreter_match_hf(monkeypatch, tiny_checkpoints, hf_models, small_batch_fusion):
    """Every op through its Triton kernel (TRITON_INTERPRET=1, set by conftest), prefill + decode."""
    monkeypatch.setenv("LLM_ENGINE_KERNELS", "triton")
    importlib.reload(ops)
    try:
        runner = make_runner(tiny_checkpoints["tiny-mistral"], "cpu")
        texts = [runner.tokenizer.encode(p) for p in PROMPTS[:2]]
        blocks = Blocks()
        seqs = [blocks.sequence(t[:-1], len(t)) for t in texts]
        step(runner, seqs, [len(t) - 1 for t in texts])
        for s, t in zip(seqs, texts):
            s.append_token(t[-1])
        logits = step(runner, seqs, [1, 1])
    finally:
        monkeypatch.delenv("LLM_ENGINE_KERNELS")
        importlib.reload(ops)
    for row, t in zip(logits, texts):
        torch.testing.assert_close(row, hf_logits(hf_models["tiny-mistral"], t)[-1], atol=ATOL, rtol=0)
