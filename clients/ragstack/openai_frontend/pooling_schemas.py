"""The embeddings and rerank request bodies, as OpenAI (embeddings) and vLLM, Jina and Cohere (rerank) define
them, and their size checks."""
from __future__ import annotations

from typing import Any, Literal

from ragstack.openai_frontend.errors import APIError
from ragstack.openai_frontend.limits import FrontendLimits
from ragstack.openai_frontend.schemas import Strict, check_text


class EmbeddingRequest(Strict):
    model: str
    input: Any
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None

    def texts(self, limits: FrontendLimits) -> list[str]:
        texts = [self.input] if isinstance(self.input, str) else self.input
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise APIError(400, "input must be a string or a non-empty list of strings (token ids are not "
                                "supported)", "input")
        if len(texts) > limits.max_embedding_inputs:
            raise APIError(400, f"input has {len(texts)} items; the limit is {limits.max_embedding_inputs} "
                                "(max_embedding_inputs)", "input")
        for i, text in enumerate(texts):
            check_text(text, f"input[{i}]", limits)
        return texts


class Document(Strict):
    text: str


class RerankRequest(Strict):
    model: str
    query: str
    documents: list[str | Document]
    top_n: int | None = None
    return_documents: bool = True

    def texts(self, limits: FrontendLimits) -> list[str]:
        if not self.documents:
            raise APIError(400, "documents must hold at least one document", "documents")
        if len(self.documents) > limits.max_rerank_documents:
            raise APIError(400, f"documents has {len(self.documents)} items; the limit is "
                                f"{limits.max_rerank_documents} (max_rerank_documents)", "documents")
        if self.top_n is not None and self.top_n < 1:
            raise APIError(400, f"top_n must be at least 1, got {self.top_n}", "top_n")
        check_text(self.query, "query", limits)
        texts = [d if isinstance(d, str) else d.text for d in self.documents]
        for i, text in enumerate(texts):
            check_text(text, f"documents[{i}]", limits)
        return texts
