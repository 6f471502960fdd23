"""`POST /v1/embeddings` through an embed model (the `embed` ensemble): texts in batches of
`embed_batch` (its tokenizer's max_texts), vectors as floats or base64 (little-endian float32), and
`usage` as the model's tokenizer counts (tokens.py)."""
from __future__ import annotations

import asyncio
import base64

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse

from ragstack.openai_frontend import metrics, models, tokens
from ragstack.openai_frontend import triton as t
from ragstack.openai_frontend.disconnect import unless_gone
from ragstack.openai_frontend.errors import APIError
from ragstack.openai_frontend.frontend import Frontend
from ragstack.openai_frontend.request_body import parse
from ragstack.openai_frontend.pooling_schemas import EmbeddingRequest

PARAMS = {"text": "input"}   # what the model's messages name -> the request's field


async def embeddings(request: Request, frontend: Frontend) -> JSONResponse:
    body = await parse(request, EmbeddingRequest, frontend.limits)
    served = await models.served(frontend.triton, body.model, "embeddings")
    metrics.served_model(request, served.name)
    texts = body.texts(frontend.limits)
    if body.dimensions is not None and body.dimensions != served.dimensions:
        raise APIError(400, f"dimensions: model '{served.name}' makes {served.dimensions}-dimensional embeddings "
                            f"and cannot shorten them; got {body.dimensions}", "dimensions")
    size = frontend.limits.embed_batch
    batches = [{"text": t.texts(texts[i:i + size])} for i in range(0, len(texts), size)]

    async def embed(inputs: dict) -> tuple[np.ndarray, int]:
        outputs, count = await asyncio.gather(frontend.triton.infer(served.name, inputs, PARAMS),
                                              tokens.count(frontend.triton, served.name, inputs, PARAMS))
        return outputs["embedding"], count

    done = await unless_gone(request, asyncio.gather(*(embed(b) for b in batches)))
    vectors = np.concatenate([v for v, _ in done]).astype("<f4")
    used = sum(c for _, c in done)
    data = [{"object": "embedding", "index": i,
             "embedding": base64.b64encode(v.tobytes()).decode() if body.encoding_format == "base64" else v.tolist()}
            for i, v in enumerate(vectors)]
    return JSONResponse({"object": "list", "data": data, "model": served.name,
                         "usage": {"prompt_tokens": used, "total_tokens": used}})
