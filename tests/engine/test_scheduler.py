from types import SimpleNamespace

import pytest

from llm_engine.core.block_manager import BlockManager
from llm_engine.core.scheduler import Scheduler
from llm_engine.core.sequence import Sequence, SequenceStatus
from llm_engine.sampling_params import SamplingParams

EOS = 2
BS = 4


def make(num_blocks=64, max_num_seqs=8, max_num_batched_tokens=32, max_model_len=256):
    config = SimpleNamespace(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                             max_model_len=max_model_len)
    return Scheduler(config, BlockManager(num_blocks, BS), [EOS])


def seq(n, rid="", first=10, **params):
    params.setdefault("max_tokens", 8)
    return Sequence(token_ids=list(range(first, first + n)), sampling_params=SamplingParams(**params),
                    request_id=rid)


def step(sched, token=7):
    """One engine step with a fake model that always samples `token`."""
    batch = sched.schedule()
    n_sampled = sum(batch.sample)
    sched.postprocess(batch, [token] * n_sampled, [None] * n_sampled)
    return batch


def shape(batch):
    return [(s.request_id, n, smp) for s, n, smp in zip(batch.seqs, batch.num_new_tokens, batch.sample)]


def test_long_prompt_is_chunked_and_sampled_only_at_its_end():
    sched = make(max_num_batched_tokens=8)
    sched.add(seq(20, "a"))
    assert shape(step(sched)) == [("a", 8, False)]
    assert shape(step(sched)) == [("a", 8, False)]
    assert shape(step(sched)) == [("a", 4, True)]
    assert shape(step(sched)) == [("a", 1, True)]  # now decoding


def test_decodes_go_first_and_prefill_chunks_fill_the_rest_of_the_budget():
    sched = make(max_num_batched_tokens=8)
    sched.add(seq(3, "a"))
    sched.add(seq(3, "b"))
    step(sched)  # both prefilled in one step: 6 tokens
    sched.add(seq(30, "long"))
    assert shape(step(sched)) == [("a", 1, True), ("b", 1, True), ("long", 6, False)]
    assert shape(step(sched)) == [("a", 1, True), ("b", 1, True), ("long", 6, False)]


def test_new_requests_join_at_the_next_step():
    sched = make()
    sched.add(seq(3, "a"))
    step(sched)
    sched.add(seq(5, "b"))
    assert shape(step(sched)) == [("a", 1, True), ("b", 5, True)]


def test_max_num_seqs_limits_running():
    sched = make(max_num_seqs=2)
    for rid in "abc":
        sched.add(seq(3, rid))
    batch = step(sched)
    assert [s.request_id for s in batch.seqs] == ["a", "b"]
    assert [s.request_id for s in sched.waiting] == ["c"]


def test_fcfs_never_skips_the_head_of_the_queue():
    sched = make(num_blocks=4, max_num_batched_tokens=64)
    sched.add(seq(8, "a", max_tokens=4))  # 2 blocks (3 with its outputs)
    step(sched)
    sched.add(seq(9, "big", first=100, max_tokens=2))  # needs 3 blocks: does not fit next to a
    sched.add(seq(2, "small", first=200, max_tokens=2))  # would fit, but must wait behind "big"
    batch = step(sched)
    assert [s.request_id for s in batch.seqs] == ["a"]
    assert [s.request_id for s in sched.waiting] == ["big", "small"]


def test_admission_leaves_a_free_block_per_running_sequence():
    """Admitted into the pool's last block, c would be preempted at the next step, when a and b cross into
    their second blocks: it waits for that headroom instead."""
    sched = make(num_blocks=4, max_num_batched_tokens=64)
    for i, rid in enumerate("abc"):
        sched.add(seq(4, rid, first=10 * (i + 1), max_tokens=6))
    assert [s.request_id for s in step(sched).seqs] == ["a", "b"]
    assert [s.request_id for s in sched.waiting] == ["c"]
    assert shape(step(sched)) == [("a", 1, True), ("b", 1, True)]
    assert sched.num_preemptions == 0


def test_preemption_by_recompute_frees_the_newest_and_requeues_it_first():
    sched = make(num_blocks=3, max_num_batched_tokens=64)
    old, new = seq(4, "old", max_tokens=6), seq(4, "new", max_tokens=6)
    sched.add(old)
    sched.add(new)
    step(sched)  # both prefilled: 1 block each, each sampled one token
    step(sched)  # both cross into a second block: only one is free -> the newer is preempted
    assert sched.num_preemptions == 1
    assert new.status is SequenceStatus.WAITING and new.num_computed_tokens == 0
    assert new.block_table == [] and sched.waiting[0] is new
    assert old.status is SequenceStatus.RUNNING and len(old.block_table) == 2
    assert new.token_ids[4:] == [7]  # its generated token is kept and recomputed


def test_preempted_requests_all_complete():
    sched = make(num_blocks=6, max_num_batched_tokens=16)
    seqs = [seq(5, f"r{i}", first=10 * i, max_tokens=9, ignore_eos=True) for i in range(5)]
    for s in seqs:
        sched.add(s)
    for _ in range(200):
        if not sched.has_unfinished():
            break
        step(sched)
    assert not sched.has_unfinished()
    assert sched.num_preemptions > 0
    assert all(s.finish_reason == "length" and s.num_output_tokens == 9 for s in seqs)
    assert sched.block_manager.num_used_blocks == 0


def test_a_sequence_that_cannot_ever_fit_is_rejected_at_add():
    sched = make(num_blocks=2)
    with pytest.raises(ValueError, match="needs 3 KV blocks; the cache holds 2 blocks of 4 tokens"):
        sched.add(seq(6, "a", max_tokens=5))


@pytest.mark.parametrize("where", ["running", "waiting", "mid-prefill"])
def test_abort_frees_blocks_at_once(where):
    sched = make(max_num_batched_tokens=8)
    s = seq(20 if where == "mid-prefill" else 3, "a")
    sched.add(s)
    if where != "waiting":
        step(sched)
        assert sched.block_manager.num_used_blocks > 0
    assert sched.abort("a") is s
    assert s.finish_reason == "abort" and s.is_finished
    assert sched.block_manager.num_used_blocks == 0 and not sched.has_unfinished()
    assert sched.abort("a") is None
    assert step(sched).seqs == []


def run_one(sched, s, tokens):
    sched.add(s)
    for t in tokens:
        step(sched, t)
        if s.is_finished:
            break
    return s


def test_finishes_on_eos_unless_ignored():
    s = run_one(make(), seq(3), [5, EOS, 6])
    assert s.finish_reason == "stop" and s.output_token_ids == [5, EOS]
    s = run_one(make(), seq(3, ignore_eos=True, max_tokens=3), [5, EOS, 6])
    assert s.finish_reason == "length" and s.output_token_ids == [5, EOS, 6]


def test_finishes_on_stop_token_ids():
    s = run_one(make(), seq(3, stop_token_ids=[9]), [5, 9, 6])
    assert s.finish_reason == "stop" and s.output_token_ids == [5, 9]


def test_min_tokens_suppresses_stopping_before_it():
    s = run_one(make(), seq(3, min_tokens=3, stop_token_ids=[9]), [EOS, 9, EOS, 4])
    assert s.finish_reason == "stop" and s.output_token_ids == [EOS, 9, EOS]


def test_finishes_at_max_tokens_and_at_max_model_len():
    s = run_one(make(), seq(3, max_tokens=2), [5] * 5)
    assert s.finish_reason == "length" and s.num_output_tokens == 2
    s = run_one(make(max_model_len=5), seq(3, max_tokens=None), [5] * 5)
    assert s.finish_reason == "length" and len(s) == 5


def test_prefix_cache_hits_skip_computation():
    sched = make(max_num_batched_tokens=64)
    a = run_one(sched, seq(10, "a", max_tokens=1), [5])
    assert a.is_finished
    b = seq(11, "b", max_tokens=1)
    sched.add(b)
    batch = step(sched)
    assert b.num_cached_tokens == 8 and shape(batch) == [("b", 3, True)]
    assert sched.num_cached_tokens == 8
