"""Paged KV-cache block allocation with prefix caching.

A block holds the KV of `block_size` consecutive tokens. Once a block is full and its KV computed,
it is registered under a hash chained over all tokens up to its end, so another sequence with the
same prefix reuses it instead of recomputing. Unreferenced registered blocks stay cached until the
pool runs dry; then the least recently freed is evicted. Nothing here raises when the pool is
exhausted: allocate / append_slot return False and the scheduler preempts.
"""
from __future__ import annotations

from collections import OrderedDict, deque

from llm_engine.core.sequence import Sequence


class _Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None          # set once the block is full and its KV computed
        self.token_ids: tuple[int, ...] = ()  # checked on a hit so a hash collision is never a wrong hit

    def reset(self) -> None:
        self.ref_count = 0
        self.hash = None
        self.token_ids = ()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._blocks = [_Block(i) for i in range(num_blocks)]
        self._free: deque[int] = deque(range(num_blocks))         # never-registered blocks
        self._evictable: OrderedDict[int, None] = OrderedDict()    # cached, ref 0, oldest first
        self._hash_to_block: dict[int, int] = {}

    # --- pool state -------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now (free plus evictable cached ones)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # --- admission ----------------------------------------------------------------------------

    def can_allocate(self, seq: Sequence) -> bool:
        hits = self._match_prefix(seq)
        return self._new_blocks_available(seq, hits)

    def allocate(self, seq: Sequence, reserve: int = 0) -> bool:
        """Give `seq` blocks for all its tokens, reusing cached prefix blocks, if `reserve` blocks stay
        free beside them.

        Sets num_cached_tokens and num_computed_tokens to the reused prefix. Returns False (and
        changes nothing) when the pool cannot hold the sequence and the reserve.
        """
        assert not seq.block_table, f"sequence {seq.seq_id} already holds blocks"
        hits = self._match_prefix(seq)
        if not self._new_blocks_available(seq, hits, reserve):
            return False
        for block_id in hits:
            block = self._blocks[block_id]
            if block.ref_count == 0:
                del self._evictable[block_id]
            block.ref_count += 1
        table = list(hits)
        for _ in range(self.blocks_needed(len(seq)) - len(hits)):
            table.append(self._take_block())
        seq.block_table = table
        seq.num_cached_tokens = len(hits) * self.block_size
        seq.num_computed_tokens = seq.num_cached_tokens
        return True

    def _match_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks holding seq's leading full blocks. The last token is never a hit: the
        runner must compute at least one token to produce the logits to sample from. A sequence
        that asks for prompt logprobs gets hits only over the positions it scored (a recompute after
        preemption): the others must run to be scored."""
        if not self.enable_prefix_caching:
            return []
        max_blocks = (len(seq) - 1) // self.block_size
        params = seq.sampling_params
        if params is not None and params.prompt_logprobs is not None:
            max_blocks = min(max_blocks, seq.prompt_logprob_mark // self.block_size)
        hashes = self._full_block_hashes(seq, max_blocks)
        hits = []
        bs = self.block_size
        for i, h in enumerate(hashes):
            block_id = self._hash_to_block.get(h)
            if block_id is None or self._blocks[block_id].token_ids != tuple(seq.token_ids[i * bs:(i + 1) * bs]):
                break
            hits.append(block_id)
        return hits

    def _new_blocks_available(self, seq: Sequence, hits: list[int], reserve: int = 0) -> bool:
        # A hit on an evictable block takes it out of the evictable pool without costing a new one.
        reclaimed = sum(1 for b in hits if self._blocks[b].ref_count == 0)
        return self.blocks_needed(len(seq)) - len(hits) <= self.num_free_blocks - reclaimed - reserve

    # --- decode -------------------------------------------------------------------------------

    def can_append(self, seq: Sequence) -> bool:
        return not self._needs_block(seq) or self.num_free_blocks > 0

    def append_slot(self, seq: Sequence) -> bool:
        """Make room for seq's last token (the one about to be computed): a new block when it
        starts one. Returns False (and changes nothing) when none is free."""
        if not self._needs_block(seq):
            return True
        if self.num_free_blocks == 0:
            return False
        seq.block_table.append(self._take_block())
        return True

    def _needs_block(self, seq: Sequence) -> bool:
        return len(seq.block_table) < self.blocks_needed(len(seq))

    # --- after a step -------------------------------------------------------------------------

    def cache_computed_blocks(self, seq: Sequence) -> None:
        """Register seq's blocks that are now full AND computed, so later requests can reuse them.

        Called after each step. Registering at allocation instead would let a request admitted
        while this one is still mid-prefill "hit" blocks whose KV was never written.
        """
        if not self.enable_prefix_caching:
            return
        num_full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        first = num_full
        while first > 0 and self._blocks[seq.block_table[first - 1]].hash is None:
            first -= 1
        if first == num_full:
            return
        hashes = self._full_block_hashes(seq, num_full)
        bs = self.block_size
        for i in range(first, num_full):
            block = self._blocks[seq.block_table[i]]
            block.hash = hashes[i]
            block.token_ids = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            # Two requests may compute the same prefix concurrently; the first registration wins
            # and the duplicate goes back to the free list when released.
            self._hash_to_block.setdefault(hashes[i], block.block_id)

    def _full_block_hashes(self, seq: Sequence, num_blocks: int) -> list[int]:
        """Hashes of seq's first `num_blocks` full blocks, extending seq.block_hashes as needed."""
        hashes = seq.block_hashes
        bs = self.block_size
        while len(hashes) < num_blocks:
            i = len(hashes)
            prev = hashes[-1] if hashes else None
            hashes.append(hash((prev, *seq.token_ids[i * bs:(i + 1) * bs])))
        return hashes[:num_blocks]

    # --- release ------------------------------------------------------------------------------

    def free(self, seq: Sequence) -> None:
        """Drop seq's references. Blocks go in reverse order so a prefix's tail is evicted before
        its head (a shorter shared prefix stays useful longer)."""
        for block_id in reversed(seq.block_table):
            block = self._blocks[block_id]
            block.ref_count -= 1
            if block.ref_count > 0:
                continue
            if block.hash is not None and self._hash_to_block.get(block.hash) == block_id:
                self._evictable[block_id] = None
            else:
                block.reset()
                self._free.append(block_id)
        seq.block_table = []

    def _take_block(self) -> int:
        if self._free:
            block_id = self._free.popleft()
        else:
            block_id, _ = self._evictable.popitem(last=False)
            del self._hash_to_block[self._blocks[block_id].hash]
        block = self._blocks[block_id]
        block.reset()
        block.ref_count = 1
        return block_id
