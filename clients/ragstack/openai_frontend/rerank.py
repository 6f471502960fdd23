"""`POST /v1/rerank` (and `/rerank`, `/v2/rerank`), in the shape vLLM and the Jina and Cohere rerank APIs
share: `query`, `documents` (strings or {"text"}), `top_n` (0 or null: all), `return_documents` in;
`results` with `index`, `relevance_score` (the reranker's score, activated as vLLM's unless `use_activation`
is false: pooling_schemas.Scored; best first) and `document`, Cohere's
`meta` out. Documents go to a rerank model (the `rerank` ensemble) in batches of `rerank_batch`, each cut
at the model's limit without a word, as Cohere and Jina do."""
from __future__ import annotations

import uuid

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse

from ragstack.openai_frontend import metrics, models, pooling
from ragstack.openai_frontend import triton as t
from ragstack.openai_frontend.frontend import Frontend
from ragstack.openai_frontend.pooling_schemas import RerankRequest
from ragstack.openai_frontend.request_body import parse

PARAMS = {"query": "query", "passages": "documents", "text": "documents"}


async def rerank(request: Request, frontend: Frontend) -> JSONResponse:
    """vLLM's and Jina's `/v1/rerank` and `/rerank`, Cohere v1's: documents returned unless asked not to."""
    return await _rerank(request, frontend, version="1", documents=True)


async def rerank_v2(request: Request, frontend: Frontend) -> JSONResponse:
    """Cohere v2's `/v2/rerank`: no documents unless asked for."""
    return await _rerank(request, frontend, version="2", documents=False)


async def _rerank(request: Request, frontend: Frontend, version: str, documents: bool) -> JSONResponse:
    body = await parse(request, RerankRequest, frontend.limits)
    served = await models.served(frontend.triton, body.model, "rerank")
    metrics.served_model(request, served.name)
    texts = body.texts(frontend.limits)
    pooling.check_texts([("query", body.query), *((f"documents[{i}]", text) for i, text in enumerate(texts))],
                        served.name, await pooling.max_text_bytes(frontend.triton, served.name))
    scores, ran = await scored(request, frontend, served.name, body.score_output(served), [(body.query, texts)],
                               PARAMS)
    pooling.check_cut(ran, body.truncate_prompt_tokens, served.name, lambda i: f"documents[{i}] with the query",
                      must_ask=False)
    top_n = body.top_n if body.top_n and body.top_n > 0 else None   # vLLM's: 0 or less, every document
    order = sorted(range(len(texts)), key=lambda i: -scores[i])[:top_n]
    returned = documents if body.return_documents is None else body.return_documents
    results = [{"index": i, "relevance_score": float(scores[i]),
                **({"document": {"text": texts[i]}} if returned else {})} for i in order]
    return JSONResponse({"id": f"rerank-{uuid.uuid4().hex}", "model": served.name, "results": results,
                         "usage": {"prompt_tokens": ran.used(), "total_tokens": ran.used()},
                         "meta": {"api_version": {"version": version}, "billed_units": {"search_units": 1}}})


async def scored(request: Request, frontend: Frontend, model: str, output: str,
                 groups: list[tuple[str, list[str]]], params: dict[str, str]) -> tuple[np.ndarray, pooling.Ran]:
    """Each group's passages scored against its query by the rerank model, in batches of `rerank_batch`;
    its `output` (scores or activated_scores) in the groups' order. The batches in flight hold the process's
    rerank gate (Frontend): more would only wait in the reranker's queue, which refuses requests past its
    max_queue_size (256)."""
    size = frontend.limits.rerank_batch
    batches = [{"query": t.text(query), "passages": t.texts(passages[i:i + size])}
               for query, passages in groups for i in range(0, len(passages), size)]
    ran = await pooling.run(request, frontend.triton, model, batches, params, frontend.rerank_gate)
    return np.concatenate([o[output].reshape(-1) for o in ran.outputs]), ran
