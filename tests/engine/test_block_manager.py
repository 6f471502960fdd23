from llm_engine.core.block_manager import BlockManager
from llm_engine.core.sequence import Sequence
from llm_engine.sampling_params import SamplingParams

BS = 4


def seq(tokens) -> Sequence:
    return Sequence(token_ids=list(tokens), sampling_params=SamplingParams())


def computed(bm: BlockManager, s: Sequence) -> Sequence:
    """Pretend the runner computed all of s's tokens (as the scheduler does after a step)."""
    s.num_computed_tokens = len(s)
    bm.cache_computed_blocks(s)
    return s


def cached(bm: BlockManager, tokens) -> None:
    """A sequence of `tokens` computed and freed: its full blocks stay in the prefix cache."""
    s = seq(tokens)
    bm.allocate(s)
    computed(bm, s)
    bm.free(s)


def test_allocate_covers_all_tokens_and_free_returns_them():
    bm = BlockManager(8, BS)
    s = seq(range(10))
    assert bm.allocate(s)
    assert len(s.block_table) == 3 and len(set(s.block_table)) == 3
    assert bm.num_used_blocks == 3 and bm.num_free_blocks == 5
    bm.free(s)
    assert s.block_table == [] and bm.num_used_blocks == 0


def test_out_of_blocks_is_reported_not_raised():
    bm = BlockManager(2, BS)
    big = seq(range(9))  # needs 3 blocks
    assert not bm.can_allocate(big)
    assert not bm.allocate(big)
    assert big.block_table == [] and bm.num_free_blocks == 2
    s = seq(range(8))
    assert bm.allocate(s)
    s.append_token(99)  # the 9th token starts a third block
    assert not bm.can_append(s)
    assert not bm.append_slot(s)
    assert len(s.block_table) == 2


def test_append_slot_adds_a_block_only_at_a_boundary():
    bm = BlockManager(8, BS)
    s = seq(range(3))
    bm.allocate(s)
    s.append_token(3)
    assert bm.append_slot(s) and len(s.block_table) == 1  # position 3 still fits block 0
    s.append_token(4)
    assert bm.append_slot(s) and len(s.block_table) == 2
    assert bm.append_slot(s) and len(s.block_table) == 2  # idempotent


def test_prefix_is_reused_and_shared():
    bm = BlockManager(8, BS)
    a = seq(range(10))
    bm.allocate(a)
    computed(bm, a)
    b = seq([*range(8), 50, 51, 52])
    assert bm.allocate(b)
    assert b.num_cached_tokens == 8 and b.num_computed_tokens == 8
    assert b.block_table[:2] == a.block_table[:2]
    assert b.block_table[2] != a.block_table[2]
    assert bm.num_used_blocks == 4
    bm.free(a)
    assert bm.num_used_blocks == 3  # the shared blocks are still held by b
    bm.free(b)
    assert bm.num_used_blocks == 0


def test_cached_blocks_survive_their_sequence():
    bm = BlockManager(8, BS)
    cached(bm, range(9))
    b = seq(range(9))
    assert bm.allocate(b) and b.num_cached_tokens == 8


def test_last_token_is_never_a_cache_hit():
    bm = BlockManager(8, BS)
    a = seq(range(8))
    bm.allocate(a)
    computed(bm, a)
    b = seq(range(8))
    bm.allocate(b)
    assert b.num_cached_tokens == 4  # the second block holds the last token: recomputed
    assert b.num_computed_tokens == 4


def test_blocks_are_not_hits_before_their_kv_is_computed():
    bm = BlockManager(8, BS)
    a = seq(range(12))
    bm.allocate(a)  # admitted but not yet computed
    a.num_computed_tokens = 4  # first chunk done
    bm.cache_computed_blocks(a)
    b = seq(range(12))
    bm.allocate(b)
    assert b.num_cached_tokens == 4


def test_lru_eviction_of_unreferenced_cached_blocks():
    bm = BlockManager(4, BS)
    for tokens in (range(100, 108), range(200, 208)):  # "old" is released first, then "new"
        s = seq(tokens)
        bm.allocate(s)
        computed(bm, s)
        bm.free(s)
    assert bm.num_free_blocks == 4 and bm.num_used_blocks == 0
    filler = seq(range(300, 308))  # two fresh blocks: both must be evicted, the oldest: "old"
    assert bm.allocate(filler)
    bm.free(filler)  # never computed, so not cached: back to the free list
    again_new = seq(range(200, 209))
    assert bm.allocate(again_new) and again_new.num_cached_tokens == 8
    bm.free(again_new)
    again_old = seq(range(100, 109))
    assert bm.allocate(again_old) and again_old.num_cached_tokens == 0


def test_a_sequences_tail_is_evicted_before_its_head():
    bm = BlockManager(4, BS)
    a = seq(range(12))
    bm.allocate(a)
    computed(bm, a)
    bm.free(a)
    one = seq(range(500, 503))
    bm.allocate(one)  # takes the never-used block
    two = seq(range(600, 603))
    bm.allocate(two)  # evicts exactly one cached block: a's last
    bm.free(one)
    bm.free(two)
    b = seq(range(13))
    assert bm.allocate(b) and b.num_cached_tokens == 8


def test_a_hit_on_an_evictable_block_costs_no_extra_block():
    bm = BlockManager(3, BS)
    a = seq(range(8))
    bm.allocate(a)
    computed(bm, a)
    bm.free(a)  # both blocks cached and evictable, one block never used
    b = seq(range(12))  # 2 hits + 1 new block: fits only if the hits are not also counted as free
    assert bm.can_allocate(b) and bm.allocate(b)
    assert b.num_cached_tokens == 8 and bm.num_free_blocks == 0


def test_duplicate_prefixes_computed_concurrently_are_released_cleanly():
    bm = BlockManager(8, BS)
    a, b = seq(range(9)), seq(range(9))
    bm.allocate(a)
    bm.allocate(b)  # a is not computed yet: no hit, its own blocks
    computed(bm, a)
    computed(bm, b)
    bm.free(a)
    bm.free(b)
    assert bm.num_used_blocks == 0 and bm.num_free_blocks == 8
    c = seq(range(9))
    assert bm.allocate(c) and c.num_cached_tokens == 8


def test_prefix_caching_can_be_disabled():
    bm = BlockManager(8, BS, enable_prefix_caching=False)
    cached(bm, range(9))
    b = seq(range(9))
    bm.allocate(b)
    assert b.num_cached_tokens == 0


def test_a_prompt_scoring_sequence_hits_only_the_positions_it_scored():
    bm = BlockManager(16, BS)
    cached(bm, range(13))
    scored = Sequence(token_ids=list(range(13)), sampling_params=SamplingParams(prompt_logprobs=0))
    bm.allocate(scored)
    assert scored.num_cached_tokens == 0   # nothing scored yet: every position must run
    bm.free(scored)
    scored.prompt_logprob_mark = 9   # preempted after scoring 9 positions: their first two blocks may be hits
    bm.allocate(scored)
    assert scored.num_cached_tokens == 8


def test_generated_tokens_are_cached_too():
    bm = BlockManager(8, BS)
    a = seq(range(3))
    bm.allocate(a)
    a.num_computed_tokens = 3
    for t in (3, 4, 5):  # decode: the runner computes each sampled token in the next step
        a.append_token(t)
        bm.append_slot(a)
        a.num_computed_tokens += 1
        bm.cache_computed_blocks(a)
    bm.free(a)
    b = seq(range(6))
    bm.allocate(b)
    assert b.num_cached_tokens == 4
