"""ModelRunner mechanics: KV pool sizing, step-input checks, warm-up, CUDA graphs against eager."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from tiny_checkpoints import tiny_checkpoints  # noqa: F401  (session fixture)

from llm_engine.config import EngineConfig
from llm_engine.core.scheduled_batch import ScheduledBatch
from llm_engine.core.sequence import Sequence
from llm_engine.worker.kv_cache import bytes_per_block
from llm_engine.worker.model_runner import ModelRunner

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def runner_for(folder, **config) -> ModelRunner:
    return ModelRunner(EngineConfig(model=str(folder), **{"device": "cpu", "max_model_len": 256, **config}))


def seq_with_blocks(ids, blocks, computed=0) -> Sequence:
    seq = Sequence(token_ids=list(ids), sampling_params=None, num_computed_tokens=computed)
    seq.block_table = list(blocks)
    return seq


def test_cpu_kv_pool_is_sized_from_the_token_budget(tiny_checkpoints):
    runner = runner_for(tiny_checkpoints["tiny-llama"], cpu_kv_cache_tokens=1024, block_size=16)
    assert runner.num_kv_blocks == 64
    # [K|V, layers, blocks, block_size, kv heads, head_dim]
    assert runner.kv_cache.kv.shape == (2, 2, 64, 16, 2, 16)
    assert runner.kv_cache.kv.dtype == torch.float32 and runner.kv_cache.scales is None
    assert bytes_per_block(runner.model_config, 16, torch.float32) == runner.kv_cache.kv[:, :, 0].nbytes
    attn = runner.model.attention_layers[1]
    assert attn.k_cache.data_ptr() == runner.kv_cache.kv[0, 1].data_ptr()


def test_step_inputs_are_checked(tiny_checkpoints):
    runner = runner_for(tiny_checkpoints["tiny-llama"], num_kv_blocks=8, block_size=4)
    short_table = seq_with_blocks(range(10), [0, 1])
    with pytest.raises(ValueError, match=r"has 2 KV blocks for 10 tokens"):
        runner.execute(ScheduledBatch([short_table], [10], [True]))
    past_end = seq_with_blocks(range(4), [0])
    with pytest.raises(ValueError, match=r"scheduled up to token 5 but has 4 tokens"):
        runner.execute(ScheduledBatch([past_end], [5], [True]))
    assert runner.execute(ScheduledBatch([], [], [])).shape == (0, runner.vocab_size)


def test_warmup_leaves_the_kv_pool_untouched(tiny_checkpoints):
    runner = runner_for(tiny_checkpoints["tiny-qwen2"], num_kv_blocks=16, max_num_batched_tokens=64, max_num_seqs=4)
    seq = seq_with_blocks(range(3, 20), range(2))
    runner.execute(ScheduledBatch([seq], [len(seq)], [True]))
    before = runner.kv_cache.kv.clone()
    runner.warmup()
    assert torch.equal(runner.kv_cache.kv, before)
    assert runner.model.attention_layers[0].k_cache.data_ptr() == runner.kv_cache.kv[0, 0].data_ptr()


def test_graph_step_inputs_replayed_on_cpu(tiny_checkpoints):
    """The CUDA-graph decode path (padded rows, static buffers) with each graph's body run eagerly."""
    runner = runner_for(tiny_checkpoints["tiny-llama"], num_kv_blocks=32, block_size=4, max_num_seqs=8)
    replayed = []
    graphs = runner.new_decode_graphs()
    assert graphs.batch_sizes == [1, 2, 4, 8]

    def fake_graph(bs):
        body = graphs.body(bs)
        return SimpleNamespace(replay=lambda: (replayed.append(bs), body()))
    graphs.graphs = {bs: fake_graph(bs) for bs in graphs.batch_sizes}
    runner.decode_graphs = graphs
    # Blocks 1.. in reverse order; block 0 stays free, so a write by a padded row would show there.
    seqs = [seq_with_blocks(range(5, 5 + n), range(4 * i + 4, 4 * i, -1)) for i, n in enumerate((7, 12, 3))]
    runner.execute(ScheduledBatch(seqs, [len(s) for s in seqs], [True] * 3))
    for s in seqs:
        s.num_computed_tokens = len(s)
        s.append_token(42)
    batch = ScheduledBatch(seqs, [1, 1, 1], [True, False, True])
    before = runner.kv_cache.kv.clone()
    graph = runner.execute(batch)
    assert replayed == [4]
    after_graph = runner.kv_cache.kv.clone()
    runner.kv_cache.kv.copy_(before)
    eager = runner.execute_eager(batch)
    assert graph.shape == (2, runner.vocab_size)
    torch.testing.assert_close(graph, eager, atol=1e-5, rtol=0)
    torch.testing.assert_close(after_graph, runner.kv_cache.kv, atol=1e-5, rtol=0)
    assert not after_graph[:, :, 0].any()  # the padded row wrote no KV


def mixed_step(runner, prompt_lens=(7, 30, 12), decoded=2):
    """Sequences in blocks 1.. (block 0 stays free: a padded token's KV write would show there):
    the first `decoded` prefilled (by `runner`) and one token further, the rest in a prefill chunk."""
    seqs = [seq_with_blocks(range(5, 5 + n), range(3 * i + 1, 3 * i + 4)) for i, n in enumerate(prompt_lens)]
    runner.execute(ScheduledBatch(seqs[:decoded], prompt_lens[:decoded], [True] * decoded))
    for s in seqs[:decoded]:
        s.num_computed_tokens = len(s)
        s.append_token(42)
    return seqs, ScheduledBatch(seqs, [1] * decoded + [len(s) for s in seqs[decoded:]], [True] * len(seqs))


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_piecewise_step_on_cpu_matches_the_plain_forward(tiny_checkpoints, name):
    """Decodes plus prefill chunks through the piecewise path (static buffers, tokens padded to a
    bucket, attention between the pieces), each piece run eagerly: the plain forward's logits and
    KV, and no KV written for the padding."""
    runner = runner_for(tiny_checkpoints[name], num_kv_blocks=16, block_size=16)
    seqs, prefill = mixed_step(runner)
    before = runner.kv_cache.kv.clone()
    eager = runner.execute_eager(prefill)
    eager_kv = runner.kv_cache.kv.clone()
    runner.kv_cache.kv.copy_(before)
    runner.piecewise = runner.piecewise_graphs(200)
    assert runner.piecewise.sizes == [128, 256]
    host, layout = runner.prepare_step(prefill, graphs=True)
    assert (layout.piecewise_tokens, layout.num_tokens) == (128, 2 + 12)
    piecewise = runner.execute(prefill)
    torch.testing.assert_close(piecewise, eager, atol=1e-5, rtol=0)
    torch.testing.assert_close(runner.kv_cache.kv, eager_kv, atol=1e-5, rtol=0)
    assert not runner.kv_cache.kv[:, :, 0].any()
    assert runner.execute(ScheduledBatch(seqs[:1], [1], [True])).shape == (1, runner.vocab_size)  # decode-only
    large = [seq_with_blocks(range(150), range(10)) for _ in range(2)]  # 300 tokens: past the last bucket
    assert runner.prepare_step(ScheduledBatch(large, [150, 150], [True, True]), graphs=True)[1].piecewise_tokens == 0


@needs_cuda
def test_kv_pool_is_sized_from_free_gpu_memory(tiny_checkpoints):
    torch.cuda.empty_cache()  # memory cached by earlier tests would count as "in use" here but not in the runner
    free, total = torch.cuda.mem_get_info()
    utilization = min(1.0, (total - free) / total + 0.02)
    runner = ModelRunner(EngineConfig(model=str(tiny_checkpoints["tiny-llama"]), device="cuda",
                                      gpu_memory_utilization=utilization, enforce_eager=True, max_model_len=256))
    block_bytes = bytes_per_block(runner.model_config, runner.block_size, runner.config.kv_cache_torch_dtype)
    assert runner.num_kv_blocks * block_bytes <= 0.02 * total


@needs_cuda
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8_e4m3"])
def test_cuda_graph_decode_matches_eager(tiny_checkpoints, kv_cache_dtype):
    runner = runner_for(tiny_checkpoints["tiny-mistral"], device="cuda", dtype="float32", num_kv_blocks=64,
                        block_size=16, max_num_seqs=8, kv_cache_dtype=kv_cache_dtype)
    assert runner.decode_graphs.batch_sizes == [1, 2, 4, 8]
    prompts = [list(range(5, 5 + n)) for n in (7, 20, 33)]  # 3 sequences: replayed as the size-4 graph
    seqs = [seq_with_blocks(p, range(3 * i, 3 * i + 3)) for i, p in enumerate(prompts)]
    runner.execute(ScheduledBatch(seqs, [len(p) for p in prompts], [True] * 3))
    for s in seqs:
        s.num_computed_tokens = len(s)
        s.append_token(42)
    batch = ScheduledBatch(seqs, [1, 1, 1], [True, False, True])
    graph = runner.execute(batch)
    eager = runner.execute_eager(batch)  # same step again: rewrites the same KV slots
    assert graph.shape == (2, runner.vocab_size)
    # Not bit-equal: the graph's wider block tables give the decode kernel another KV split.
    torch.testing.assert_close(graph, eager, atol=1e-4, rtol=0)


@needs_cuda
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8_e4m3"])
def test_piecewise_cuda_graphs_match_eager(tiny_checkpoints, kv_cache_dtype):
    runner = runner_for(tiny_checkpoints["tiny-qwen2"], device="cuda", dtype="float32", num_kv_blocks=16,
                        block_size=16, max_num_seqs=8, max_num_batched_tokens=256, piecewise_graph_max_tokens=256,
                        kv_cache_dtype=kv_cache_dtype)
    assert runner.piecewise.sizes == [128, 256]
    seqs, prefill = mixed_step(runner)
    before = runner.kv_cache.kv.clone()
    graph = runner.execute(prefill)
    graph_kv = runner.kv_cache.kv.clone()
    runner.kv_cache.kv.copy_(before)
    eager = runner.execute_eager(prefill)
    torch.testing.assert_close(graph, eager, atol=1e-4, rtol=0)
    torch.testing.assert_close(graph_kv.float(), runner.kv_cache.kv.float(), atol=1e-4, rtol=0)
    assert not graph_kv[:, :, 0].float().any()  # the padded tokens wrote no KV


def test_piecewise_buckets_pad_steps_past_1024_tokens_by_under_an_eighth():
    from llm_engine.worker.piecewise_graphs import bucket_sizes

    sizes = bucket_sizes(8192)
    assert sizes[:3] == [128, 256, 384] and sizes[-1] == 8192 and len(sizes) == 32
    assert all(b - a <= b / 8 for a, b in zip(sizes, sizes[1:]) if a >= 1024)
    assert bucket_sizes(200) == [128, 256] and bucket_sizes(1) == [128]
