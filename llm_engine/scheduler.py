"""Iteration-level continuous batching with chunked prefill and preemption by recompute.

Each step spends a token budget (max_num_batched_tokens): first one token for every running
decode, then prefill chunks for running sequences still mid-prompt, then newly admitted requests
(FCFS). A long prompt is thus split over steps and never stalls the decodes. When the KV pool runs
out, the most recently admitted running sequence is preempted: its blocks are freed and it goes
back to the front of the waiting queue to be recomputed (its prefix is often still cached).
"""
from __future__ import annotations

from collections import deque
from typing import Iterable

from llm_engine.batch import ScheduledBatch
from llm_engine.block_manager import BlockManager
from llm_engine.sequence import Sequence, SequenceStatus


class EngineOverloadedError(RuntimeError):
    """The waiting queue is full (max_waiting); the caller should retry later or shed load."""


class Scheduler:
    def __init__(self, config, block_manager: BlockManager, eos_token_ids: Iterable[int]) -> None:
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_model_len = config.max_model_len
        self.max_waiting = config.max_waiting
        self.block_manager = block_manager
        self.eos_token_ids = frozenset(eos_token_ids)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []   # admission order: the last one is preempted first
        self.num_preemptions = 0
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache, over all admissions

    # --- queue management ---------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        if self.max_waiting is not None and len(self.waiting) >= self.max_waiting:
            raise EngineOverloadedError(
                f"waiting queue is full (max_waiting={self.max_waiting}); retry later")
        max_tokens = seq.sampling_params.max_tokens
        max_len = self.max_model_len if max_tokens is None else min(len(seq) + max_tokens, self.max_model_len)
        bm = self.block_manager
        # A sequence that cannot fit in the whole pool would wait (or preempt itself) forever.
        if bm.blocks_needed(max_len) > bm.num_blocks:
            raise ValueError(
                f"prompt + max_tokens = {max_len} tokens needs {bm.blocks_needed(max_len)} KV blocks; "
                f"the cache holds {bm.num_blocks} blocks of {bm.block_size} tokens")
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def abort(self, request_id: str) -> Sequence | None:
        """Finish the request's sequence with "abort" and free its blocks at once."""
        for queue in (self.running, self.waiting):
            for seq in queue:
                if seq.request_id == request_id:
                    self.finish(seq, "abort")
                    return seq
        return None

    def finish(self, seq: Sequence, reason: str) -> None:
        """Finish seq now (abort, stop string, ...): free its blocks and drop it from the queues."""
        if seq.is_finished:
            return
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self.block_manager.free(seq)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # --- one step -----------------------------------------------------------------------------

    def schedule(self) -> ScheduledBatch:
        budget = self.max_num_batched_tokens
        seqs: list[Sequence] = []
        num_new: list[int] = []
        preempted = False

        # 1. Decodes first: they are latency-critical and cost one token each. (A prefill whose
        #    last chunk left exactly one token is scheduled like a decode; same cost, same slot.)
        decodes = [s for s in self.running if s.num_computed_tokens == len(s) - 1]
        for seq in decodes:
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop to make room for an older sequence
            while not self.block_manager.append_slot(seq):
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.status is SequenceStatus.RUNNING:
                seqs.append(seq)
                num_new.append(1)
                budget -= 1

        # 2. Running sequences mid-prefill continue with the budget left.
        for seq in self.running:
            if budget == 0:
                break
            remaining = len(seq) - seq.num_computed_tokens
            if remaining > 1:
                chunk = min(remaining, budget)
                seqs.append(seq)
                num_new.append(chunk)
                budget -= chunk

        # 3. Admit waiting requests in arrival order; never skip the head (FCFS), and admit none in
        #    a step that had to preempt (the pool is evidently full).
        while self.waiting and budget > 0 and not preempted and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not self.block_manager.allocate(seq):
                break
            self.waiting.popleft()
            self.num_cached_tokens += seq.num_cached_tokens
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            chunk = min(len(seq) - seq.num_computed_tokens, budget)
            seqs.append(seq)
            num_new.append(chunk)
            budget -= chunk

        sample = [s.num_computed_tokens + n == len(s) for s, n in zip(seqs, num_new)]
        return ScheduledBatch(seqs=seqs, num_new_tokens=num_new, sample=sample)

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        self.running.remove(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    # --- after the model ran ------------------------------------------------------------------

    def postprocess(self, batch: ScheduledBatch, sampled_token_ids: list[int],
                    logprobs: list[float | None] | None = None) -> list[Sequence]:
        """Account the computed tokens, append the sampled ones, finish what is done.

        `sampled_token_ids` (and `logprobs`) follow batch order over the sampled sequences.
        Returns the sequences that finished in this step.
        """
        finished = []
        i = 0
        for seq, n, is_sampled in zip(batch.seqs, batch.num_new_tokens, batch.sample):
            if seq.is_finished:  # ended while the step ran (a stop string found late): drop its token
                i += is_sampled
                continue
            seq.num_computed_tokens += n
            self.block_manager.cache_computed_blocks(seq)
            if not is_sampled:
                continue
            seq.append_token(sampled_token_ids[i], logprobs[i] if logprobs is not None else None)
            i += 1
            reason = self._finish_reason(seq)
            if reason is not None:
                self.finish(seq, reason)
                finished.append(seq)
        return finished

    def _finish_reason(self, seq: Sequence) -> str | None:
        params = seq.sampling_params
        token = seq.token_ids[-1]
        n_out = seq.num_output_tokens
        if n_out >= params.min_tokens:
            if (not params.ignore_eos and token in self.eos_token_ids) or token in params.stop_token_ids:
                return "stop"
        if (params.max_tokens is not None and n_out >= params.max_tokens) or len(seq) >= self.max_model_len:
            return "length"
        return None
