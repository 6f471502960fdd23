"""`POST /score` and `/v1/score`: vLLM's score API (sentence-transformers' `CrossEncoder.predict` over HTTP).
Pairs of texts in: `text_1` and `text_2` (or vLLM's newer names, pooling_schemas.SCORE_SIDES), each a string or
a list of strings, paired 1 x N (one first text with every second text) or N x N (one by one); one score per pair
out, in `data` by the pair's index (not sorted, unlike rerank), with `usage` as vLLM counts it.

Each pair goes through the same rerank model and path as `/v1/rerank`, so its score is rerank's
`relevance_score` for the same query and document (identical for the same query and document list; else up to
float32 rounding, the model's batches being other sizes): the cosine of the two texts' embeddings for the bundled
reranker (version 1, pair-cosine; vLLM's score of an embedding model is that cosine too), and for a cross-encoder
export the sigmoid of its logit (or the activation its config names), as vLLM answers, or with `use_activation:
false` the logit itself (pooling_schemas.Scored). A pair longer than the model reads is refused, as vLLM refuses
it, unless `truncate_prompt_tokens` asks for the cut (pooling.check_cut)."""
from __future__ import annotations

import time
import uuid

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse

from ragstack.openai_frontend import metrics, models, pooling
from ragstack.openai_frontend.frontend import Frontend
from ragstack.openai_frontend.pooling_schemas import ScoreRequest
from ragstack.openai_frontend.request_body import parse
from ragstack.openai_frontend.rerank import scored


async def score(request: Request, frontend: Frontend) -> JSONResponse:
    """vLLM's `/score` and `/v1/score`: one score per (text_1, text_2) pair from a rerank model."""
    body = await parse(request, ScoreRequest, frontend.limits)
    served = await models.served(frontend.triton, body.model, "score")
    metrics.served_model(request, served.name)
    first, second = body.sides(frontend.limits)
    pooling.check_texts([(side.param(i), text) for side in (first, second) for i, text in enumerate(side.texts)],
                        served.name, await pooling.max_text_bytes(frontend.triton, served.name))
    first_of = [i if len(first.texts) > 1 else 0 for i in range(len(second.texts))]   # pair i's first text
    # The rerank model takes one query and many passages a request: the pairs that share a first text go
    # together, and each other first text is a request of its own, run side by side (rerank.scored), where
    # the reranker's dynamic batcher merges their pairs into its batches again.
    groups: dict[str, list[int]] = {}
    for i in range(len(second.texts)):
        groups.setdefault(first.texts[first_of[i]], []).append(i)
    order = [i for pairs in groups.values() for i in pairs]   # the pairs as the model scores them
    scores, ran = await scored(request, frontend, served.name, body.score_output(served),
                               [(query, [second.texts[i] for i in pairs]) for query, pairs in groups.items()],
                               {"query": first.field, "passages": second.field, "text": second.field})
    at = {i: k for k, i in enumerate(order)}

    def blamed(k: int) -> str:
        """The field a pair past the model's limit is refused under: its first text where every one of its
        several pairs is cut (the first text is the long one), else its second text."""
        pairs = groups[first.texts[first_of[order[k]]]]
        if len(pairs) > 1 and all(ran.truncated[at[i]] for i in pairs):
            return first.param(first_of[order[k]])
        return second.param(order[k])

    pooling.check_cut(ran, body.truncate_prompt_tokens, served.name,
                      lambda k: f"{second.param(order[k])} with {first.param(first_of[order[k]])}", must_ask=True,
                      param=blamed)
    by_pair = np.empty_like(scores)
    by_pair[order] = scores
    data = [{"index": i, "object": "score", "score": float(value)} for i, value in enumerate(by_pair)]
    return JSONResponse({"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                         "model": served.name, "data": data,
                         "usage": {"prompt_tokens": ran.used(), "total_tokens": ran.used(), "completion_tokens": 0}})
