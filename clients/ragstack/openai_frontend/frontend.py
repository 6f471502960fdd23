"""What every handler needs: Triton, the limits, the keys, and the gates on the pooling models' queues."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ragstack.openai_frontend.limits import FrontendLimits
from ragstack.openai_frontend.triton import Triton

# Batches in flight at once to the embed and rerank ensembles from all the workers: half of the embedder's and
# the reranker's queues (max_queue_size 512 and 256), which refuse every request past them; the other half
# stays for rag's steps and other clients.
EMBED_IN_FLIGHT = 256
RERANK_IN_FLIGHT = 128


@dataclass(frozen=True)
class Gate:
    """A worker's batches in flight to one model. Each request's batches past `size` wait on a semaphore of
    their own, not among the worker's waiters: a request sent behind one of 1,000 batches then waits for the
    next free slot, not for those 1,000 (pooling.run)."""
    shared: asyncio.Semaphore
    size: int

    @classmethod
    def of(cls, size: int) -> Gate:
        return cls(asyncio.Semaphore(size), size)


@dataclass
class Frontend:
    triton: Triton
    limits: FrontendLimits
    api_key: str | None      # set: every API request must carry it as a bearer token
    admin_key: str | None    # set: model load and unload need it (x-ragstack-admin-key)
    embed_gate: Gate = field(init=False)    # this worker's share of EMBED_IN_FLIGHT
    rerank_gate: Gate = field(init=False)   # and of RERANK_IN_FLIGHT

    def __post_init__(self):
        self.embed_gate = Gate.of(max(1, EMBED_IN_FLIGHT // self.limits.workers))
        self.rerank_gate = Gate.of(max(1, RERANK_IN_FLIGHT // self.limits.workers))
