"""`POST /v1/rerank` (and `/rerank`), in the shape vLLM and the Jina and Cohere rerank APIs share:
`query`, `documents` (strings or {"text"}), `top_n`, `return_documents` in; `results` with `index`,
`relevance_score` (the reranker's score, best first) and `document` out. Documents go to a rerank
model (the `rerank` ensemble) in batches of `rerank_batch`."""
from __future__ import annotations

import asyncio
import uuid

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse

from ragstack.openai_frontend import metrics, models, tokens
from ragstack.openai_frontend import triton as t
from ragstack.openai_frontend.disconnect import unless_gone
from ragstack.openai_frontend.frontend import Frontend
from ragstack.openai_frontend.request_body import parse
from ragstack.openai_frontend.pooling_schemas import RerankRequest

PARAMS = {"query": "query", "passages": "documents", "text": "documents"}


async def rerank(request: Request, frontend: Frontend) -> JSONResponse:
    body = await parse(request, RerankRequest, frontend.limits)
    served = await models.served(frontend.triton, body.model, "rerank")
    metrics.served_model(request, served.name)
    texts = body.texts(frontend.limits)
    size = frontend.limits.rerank_batch
    batches = [{"query": t.text(body.query), "passages": t.texts(texts[i:i + size])}
               for i in range(0, len(texts), size)]

    async def score(inputs: dict) -> tuple[np.ndarray, int]:
        outputs, count = await asyncio.gather(frontend.triton.infer(served.name, inputs, PARAMS),
                                              tokens.count(frontend.triton, served.name, inputs, PARAMS))
        return outputs["scores"].reshape(-1), count

    done = await unless_gone(request, asyncio.gather(*(score(b) for b in batches)))
    scores = np.concatenate([s for s, _ in done])
    order = sorted(range(len(texts)), key=lambda i: -scores[i])[:body.top_n]
    results = [{"index": i, "relevance_score": float(scores[i]),
                **({"document": {"text": texts[i]}} if body.return_documents else {})} for i in order]
    return JSONResponse({"id": f"rerank-{uuid.uuid4().hex}", "model": served.name, "results": results,
                         "usage": {"total_tokens": sum(c for _, c in done)}})
