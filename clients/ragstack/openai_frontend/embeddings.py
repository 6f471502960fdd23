"""`POST /v1/embeddings` through an embed model (the `embed` ensemble): texts in batches of
`embed_batch` (its tokenizer's max_texts), vectors as floats or base64 (little-endian float32), and
`usage` as the model's tokenizer counts (tokens.py); vLLM's `id` (`embd-` and the request_id given) and
`created` beside OpenAI's fields. An input longer than the model reads is refused, as OpenAI and vLLM
refuse it, unless vLLM's `truncate_prompt_tokens` asks for it to be cut."""
from __future__ import annotations

import base64
import time
import uuid

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse

from ragstack.openai_frontend import metrics, models, pooling
from ragstack.openai_frontend import triton as t
from ragstack.openai_frontend.errors import APIError
from ragstack.openai_frontend.frontend import Frontend
from ragstack.openai_frontend.pooling_schemas import EmbeddingRequest
from ragstack.openai_frontend.request_body import parse

PARAMS = {"text": "input"}   # what the model's messages name -> the request's field


async def embeddings(request: Request, frontend: Frontend) -> JSONResponse:
    body = await parse(request, EmbeddingRequest, frontend.limits)
    served = await models.served(frontend.triton, body.model, "embeddings")
    metrics.served_model(request, served.name)
    texts = body.texts(frontend.limits)
    if body.dimensions is not None and body.dimensions != served.dimensions:
        raise APIError(400, f"dimensions: model '{served.name}' makes {served.dimensions}-dimensional embeddings "
                            f"and cannot shorten them; got {body.dimensions}", "dimensions")
    pooling.check_texts([(body.param(i), text) for i, text in enumerate(texts)], served.name,
                        await pooling.max_text_bytes(frontend.triton, served.name))
    size = frontend.limits.embed_batch
    batches = [{"text": t.texts(texts[i:i + size])} for i in range(0, len(texts), size)]
    ran = await pooling.run(request, frontend.triton, served.name, batches, PARAMS, frontend.embed_gate)
    pooling.check_cut(ran, body.truncate_prompt_tokens, served.name, body.param, must_ask=True)
    vectors = np.concatenate([o["embedding"] for o in ran.outputs]).astype("<f4")
    data = [{"object": "embedding", "index": i,
             "embedding": base64.b64encode(v.tobytes()).decode() if body.encoding_format == "base64" else v.tolist()}
            for i, v in enumerate(vectors)]
    return JSONResponse({"id": f"embd-{body.request_id or uuid.uuid4().hex}", "object": "list",
                         "created": int(time.time()), "data": data, "model": served.name,
                         "usage": {"prompt_tokens": ran.used(), "total_tokens": ran.used()}})
