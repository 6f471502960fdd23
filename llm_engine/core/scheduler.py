"""Iteration-level continuous batching with chunked prefill and preemption by recompute.

Each step spends a token budget (max_num_batched_tokens): first one token for every running
decode, then prefill chunks for running sequences still mid-prompt, then newly admitted requests
(FCFS). A long prompt is thus split over steps and never stalls the decodes. When the KV pool runs
out, the most recently admitted running sequence is preempted: its blocks are freed and it goes
back to the front of the waiting queue to be recomputed (its prefix is often still cached).
A sequence that asks for prompt logprobs gets each chunk's prompt positions scored (the batch's
prompt_rows), from where its earlier chunks stopped.
"""
from __future__ import annotations

from collections import deque
from typing import Iterable

from llm_engine.core.block_manager import BlockManager
from llm_engine.core.scheduled_batch import ScheduledBatch
from llm_engine.core.sequence import Sequence, SequenceStatus, placeholder_token


class Scheduler:
    def __init__(self, config, block_manager: BlockManager, eos_token_ids: Iterable[int]) -> None:
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_model_len = config.max_model_len
        self.block_manager = block_manager
        self.eos_token_ids = frozenset(eos_token_ids)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []   # admission order: the last one is preempted first
        self.num_preemptions = 0
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache, over all admissions
        self._scoring: set[Sequence] = set()  # sequences with prompt positions still to score

    # --- queue management ---------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        self.check(seq)
        seq.status = SequenceStatus.WAITING
        if seq.sampling_params.prompt_logprobs is not None and seq.num_prompt_tokens > 1:
            self._scoring.add(seq)
        self.waiting.append(seq)

    def check(self, seq: Sequence) -> None:
        """ValueError if the sequence could never run: one that cannot fit in the whole pool would
        wait (or preempt itself) forever."""
        max_tokens = seq.sampling_params.max_tokens
        max_len = self.max_model_len if max_tokens is None else min(len(seq) + max_tokens, self.max_model_len)
        bm = self.block_manager
        if bm.blocks_needed(max_len) > bm.num_blocks:
            raise ValueError(
                f"prompt + max_tokens = {max_len} tokens needs {bm.blocks_needed(max_len)} KV blocks; "
                f"the cache holds {bm.num_blocks} blocks of {bm.block_size} tokens")

    def abort(self, request_id: str) -> Sequence | None:
        """Finish the request's sequence with "abort" and free its blocks at once. A step
        interrupted between advance and resolve (an exception in the host's wait) left a
        placeholder: that token never comes, so it goes."""
        for queue in (self.running, self.waiting):
            for seq in queue:
                if seq.request_id == request_id:
                    self.finish(seq, "abort")
                    if seq.token_ids and seq.token_ids[-1] < 0:
                        seq.token_ids.pop()
                    return seq
        return None

    def finish(self, seq: Sequence, reason: str) -> None:
        """Finish seq now (abort, stop string, ...): free its blocks and drop it from the queues."""
        if seq.is_finished:
            return
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self.block_manager.free(seq)
        self._scoring.discard(seq)
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
        #    a step that had to preempt (the pool is evidently full). A block stays free for each running
        #    sequence: without that headroom a full pool preempts one of them in the next steps (its work
        #    thrown away and redone), and with many sequences a step it did so step after step.
        while self.waiting and budget > 0 and not preempted and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not self.block_manager.allocate(seq, reserve=len(self.running)):
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
        prompt_rows = self._prompt_rows(seqs, num_new) if self._scoring else []
        return ScheduledBatch(seqs=seqs, num_new_tokens=num_new, sample=sample, prompt_rows=prompt_rows)

    def _prompt_rows(self, seqs: list[Sequence], num_new: list[int]) -> list[tuple[int, int, int]]:
        """The prompt positions each chunk scores: from the sequence's mark (or the chunk's start) up to the
        prompt's last position, whose logits pick the first output token instead."""
        rows = []
        for i, (seq, n) in enumerate(zip(seqs, num_new)):
            if seq in self._scoring:
                first = max(seq.num_computed_tokens, seq.prompt_logprob_mark)
                count = min(seq.num_computed_tokens + n, seq.num_prompt_tokens - 1) - first
                if count > 0:
                    rows.append((i, first, count))
        return rows

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        self.running.remove(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    # --- after the model ran ------------------------------------------------------------------
    # A launched step is accounted in two parts, so that the next one can be scheduled before the
    # sampled tokens reach the host: advance (what the step computed; each sampled sequence gets a
    # placeholder token) and resolve (the sampled tokens replace the placeholders).

    def postprocess(self, batch: ScheduledBatch, sampled_token_ids: list[int],
                    logprobs: list[float | None] | None = None, top_logprobs: list | None = None) -> list[Sequence]:
        """advance and resolve at once, the sampled tokens being known."""
        self.advance(batch)
        return self.resolve(batch, sampled_token_ids, logprobs, top_logprobs)

    def advance(self, batch: ScheduledBatch) -> None:
        """Account the computed tokens; each sampled sequence gets the placeholder of its row
        (sequence.placeholder_token) and ends ("length") if that token reaches its length limit."""
        for i, first, count in batch.prompt_rows:
            seq = batch.seqs[i]
            seq.prompt_logprob_mark = first + count
            if seq.prompt_logprob_mark == seq.num_prompt_tokens - 1:
                self._scoring.discard(seq)
        row = -1
        for seq, n, is_sampled in zip(batch.seqs, batch.num_new_tokens, batch.sample):
            row += is_sampled
            if seq.is_finished:  # ended while the step ran (stop string, abort): its token is dropped
                continue
            seq.num_computed_tokens += n
            self.block_manager.cache_computed_blocks(seq)
            if not is_sampled:
                continue
            seq.append_token(placeholder_token(row))
            if self._at_length_limit(seq):
                self.finish(seq, "length")

    def resolve(self, batch: ScheduledBatch, sampled_token_ids: list[int],
                logprobs: list[float | None] | None = None, top_logprobs: list | None = None) -> list[Sequence]:
        """Put the sampled tokens in place of advance's placeholders (`sampled_token_ids`, `logprobs`
        and `top_logprobs` follow batch order over the sampled sequences); finish what a stop token
        ends. Returns the sequences that got a token, in batch order."""
        got = []
        sampled = (seq for seq, is_sampled in zip(batch.seqs, batch.sample) if is_sampled)
        for row, seq in enumerate(sampled):
            if seq.token_ids[-1] != placeholder_token(row):
                continue  # had ended before advance: no token
            seq.token_ids[-1] = sampled_token_ids[row]
            if logprobs is not None and logprobs[row] is not None:
                seq.output_logprobs.append(logprobs[row])
                seq.output_top_logprobs.append(top_logprobs[row])
            got.append(seq)
            if self._is_stop(seq):
                seq.stop_reason = None if self._is_eos(seq) else seq.token_ids[-1]  # as vLLM: the eos has none
                if seq.is_finished:  # ended by its length limit in advance: a stop token is the reason
                    seq.finish_reason = "stop"
                else:
                    self.finish(seq, "stop")
        return got

    def _is_stop(self, seq: Sequence) -> bool:
        return seq.num_output_tokens >= seq.sampling_params.min_tokens and (
            self._is_eos(seq) or seq.token_ids[-1] in seq.sampling_params.stop_token_ids)

    def _is_eos(self, seq: Sequence) -> bool:
        return not seq.sampling_params.ignore_eos and seq.token_ids[-1] in self.eos_token_ids

    def _at_length_limit(self, seq: Sequence) -> bool:
        max_tokens = seq.sampling_params.max_tokens
        return (max_tokens is not None and seq.num_output_tokens >= max_tokens) or len(seq) >= self.max_model_len
