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


@dataclass
class Frontend:
    triton: Triton
    limits: FrontendLimits
    api_key: str | None      # set: every API request must carry it as a bearer token
    admin_key: str | None    # set: model load and unload need it (x-ragstack-admin-key)
    embed_gate: asyncio.Semaphore = field(init=False)    # this worker's share of EMBED_IN_FLIGHT
    rerank_gate: asyncio.Semaphore = field(init=False)   # and of RERANK_IN_FLIGHT

    def __post_init__(self):
        self.embed_gate = asyncio.Semaphore(max(1, EMBED_IN_FLIGHT // self.limits.workers))
        self.rerank_gate = asyncio.Semaphore(max(1, RERANK_IN_FLIGHT // self.limits.workers))
