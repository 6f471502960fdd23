"""What runs when, and where its KV lives: the scheduler (continuous batching, chunked prefill,
preemption), the block manager (paged KV blocks, prefix caching) and the sequences they track.
Pure Python: no torch, no device."""
