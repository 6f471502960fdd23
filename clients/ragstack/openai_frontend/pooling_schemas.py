"""The embeddings, rerank and score request bodies, as OpenAI (embeddings), vLLM, Jina and Cohere (rerank) and
vLLM (score) define them, and their size checks.

Vendor fields these servers take are declared: those that change nothing here are accepted, those asking
for something this server does not do are refused naming the field (only the values meaning the default
pass). Any other field is refused as unsupported (OpenAI refuses unknown fields on embeddings)."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import model_validator

from ragstack.openai_frontend.errors import APIError
from ragstack.openai_frontend.limits import FrontendLimits
from ragstack.openai_frontend.models import Served
from ragstack.openai_frontend.schemas import MAX_REQUEST_ID_CHARS, Strict, check_text, token_ids

# vLLM's names of a score request's two sides: text_1 and text_2 in every version, the others in newer ones.
SCORE_SIDES = (("text_1", "text_2"), ("data_1", "data_2"), ("queries", "documents"), ("queries", "items"))
SCORE_FIELDS = tuple(dict.fromkeys(name for pair in SCORE_SIDES for name in pair))
ACTIVATION = ("softmax", "activation", "use_activation")   # vLLM's order: the names it replaced win
IDS_HINT = ("token ids are not supported (LangChain's OpenAIEmbeddings sends tiktoken ids: pass "
            "check_embedding_ctx_length=False)")


class Pooling(Strict):
    # vLLM's: -1, or a count >= the model's limit, cut a longer text there (rerank cuts without being asked;
    # embeddings refuse a longer input without it: embeddings.py)
    truncate_prompt_tokens: int | None = None
    priority: int | None = None   # vLLM's scheduling priority: none here

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        for key in data if isinstance(data, dict) else ():
            if key not in cls.model_fields:
                raise APIError(400, f"'{key[:100]}' is not supported by this endpoint", key[:100])
        return data

    @model_validator(mode="after")
    def _supported(self) -> Pooling:
        if self.priority not in (None, 0):
            raise APIError(400, f"priority: requests here have no priorities; only 0 is accepted, got "
                                f"{self.priority}", "priority")
        cut = self.truncate_prompt_tokens
        if cut is not None and cut != -1 and cut < 1:
            raise APIError(400, "truncate_prompt_tokens must be -1 (cut at the model's limit) or at least 1, "
                                f"got {cut}", "truncate_prompt_tokens")
        return self


class EmbeddingRequest(Pooling):
    model: str | None = None   # vLLM's rule: none given, the one model that serves the endpoint
    input: Any
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    normalize: bool | None = None
    use_activation: bool | None = None   # vLLM's newer name for normalize
    embed_dtype: Literal["float32"] | None = None   # vLLM's base64 element type and byte order: ours only
    endianness: Literal["native", "little"] | None = None
    add_special_tokens: bool | None = None
    request_id: str | None = None   # vLLM's: the answer's id ends with it

    @model_validator(mode="after")
    def _as_served(self) -> EmbeddingRequest:
        for name in ("normalize", "use_activation"):
            if getattr(self, name) is False:
                raise APIError(400, f"{name}: false is not supported; the vectors come as the model computes them "
                                    "(the bundled embedder's are L2-normalised)", name)
        if self.request_id is not None and len(self.request_id) > MAX_REQUEST_ID_CHARS:   # in the answer's id
            raise APIError(400, f"request_id is {len(self.request_id)} characters; the limit is "
                                f"{MAX_REQUEST_ID_CHARS}", "request_id")
        if self.endianness == "native" and sys.byteorder != "little":
            raise APIError(400, "endianness: base64 embeddings are little-endian float32 here; this host is "
                                "big-endian, so ask for little", "endianness")
        if self.add_special_tokens is False:
            raise APIError(400, "add_special_tokens: false is not supported; the model's tokenizer always adds "
                                "them", "add_special_tokens")
        return self

    def texts(self, limits: FrontendLimits) -> list[str]:
        texts = [self.input] if isinstance(self.input, str) else self.input
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            hint = f"; {IDS_HINT}" if _token_ids(self.input) else ""
            raise APIError(400, f"input must be a string or a non-empty list of strings{hint}", "input")
        if len(texts) > limits.max_embedding_inputs:
            raise APIError(400, f"input has {len(texts)} items; the limit is {limits.max_embedding_inputs} "
                                "(max_embedding_inputs)", "input")
        for i, text in enumerate(texts):
            check_text(text, self.param(i), limits)
        return texts

    def param(self, i: int) -> str:
        """How errors name input i: `input` itself when it is one string."""
        return "input" if isinstance(self.input, str) else f"input[{i}]"


class Scored(Pooling):
    """vLLM's rerank and score. vLLM answers a cross-encoder's activated score unless `use_activation` is false
    (a sigmoid of its logit, or the activation its config names), and an embedding model's cosine either way;
    the rerank ensemble's `activated_scores` is that number, and its `scores` the model's own. A rerank model
    of one's own without `activated_scores` answers its `scores`, and refuses an explicit true."""
    use_activation: bool | None = None
    activation: bool | None = None
    softmax: bool | None = None

    def score_output(self, served: Served) -> str:
        """The model output that answers; of the three names, vLLM's precedence: the first given of softmax,
        activation, use_activation (the older names win)."""
        name, asked = next(((n, getattr(self, n)) for n in ACTIVATION if getattr(self, n) is not None),
                           ("use_activation", None))
        if asked is False:
            return "scores"
        if "activated_scores" in served.outputs:
            return "activated_scores"
        if asked:
            raise APIError(400, f"{name}: true is not supported by model '{served.name}': it has no "
                                "activated_scores output, only its own scores (a reranker exported before "
                                "activated_scores existed: export it again); send false or leave it out", name)
        return "scores"


class RerankRequest(Scored):
    model: str | None = None   # vLLM's rule: none given, the one model that serves the endpoint
    query: str
    documents: list[Any]   # strings or objects with a `text` (Cohere's and Jina's; other keys ignored)
    top_n: int | None = None
    return_documents: bool | None = None   # None: the endpoint's default (rerank.py)
    user: str | None = None
    max_tokens_per_doc: int | None = None   # Cohere's; documents are cut at the model's limit
    rank_fields: list[str] | None = None   # Cohere v1's; only the text is ranked

    @model_validator(mode="after")
    def _as_served(self) -> RerankRequest:
        if self.max_tokens_per_doc is not None and self.max_tokens_per_doc < 1:
            raise APIError(400, f"max_tokens_per_doc must be at least 1, got {self.max_tokens_per_doc}",
                           "max_tokens_per_doc")
        if self.rank_fields not in (None, ["text"]):
            raise APIError(400, f"rank_fields: only [\"text\"] is supported, got {str(self.rank_fields)[:100]}",
                           "rank_fields")
        return self

    def texts(self, limits: FrontendLimits) -> list[str]:
        if not self.documents:
            raise APIError(400, "documents must hold at least one document", "documents")
        if len(self.documents) > limits.max_rerank_documents:
            raise APIError(400, f"documents has {len(self.documents)} items; the limit is "
                                f"{limits.max_rerank_documents} (max_rerank_documents)", "documents")
        check_text(self.query, "query", limits)
        texts = [_document_text(d, f"documents[{i}]") for i, d in enumerate(self.documents)]
        for i, text in enumerate(texts):
            check_text(text, f"documents[{i}]", limits)
        return texts


@dataclass(frozen=True)
class Side:
    """One side of a score request's pairs: the field it came in, its texts, and whether it was one string."""
    field: str
    texts: list[str]
    single: bool

    def param(self, i: int) -> str:
        """How a refusal names text i."""
        return self.field if self.single else f"{self.field}[{i}]"


class ScoreRequest(Scored):
    model: str | None = None   # vLLM's rule: none given, the one model that serves the endpoint
    text_1: Any = None   # each side a string or a list of strings, under one of SCORE_SIDES' names
    text_2: Any = None
    data_1: Any = None
    data_2: Any = None
    queries: Any = None
    documents: Any = None
    items: Any = None
    user: str | None = None
    request_id: str | None = None   # vLLM's; accepted, not used
    mm_processor_kwargs: dict[str, Any] | None = None   # vLLM's, for a multimodal model's processor: none here

    @model_validator(mode="after")
    def _as_served(self) -> ScoreRequest:
        if self.mm_processor_kwargs:
            raise APIError(400, "mm_processor_kwargs: the rerank models here read text only; there is no "
                                "multimodal processor to pass them to", "mm_processor_kwargs")
        return self

    def sides(self, limits: FrontendLimits) -> tuple[Side, Side]:
        """The two sides of the pairs, paired as vLLM pairs them: one first text with each second text
        (1 x N), or the first texts with the second texts one by one (N x N)."""
        given = [name for name in SCORE_FIELDS if getattr(self, name) is not None]
        names = next((pair for pair in SCORE_SIDES if set(pair) == set(given)), None)
        if names is None:
            pairs = ", ".join(" and ".join(pair) for pair in SCORE_SIDES)
            got = f"got {', '.join(given)}" if given else "got none"
            # one side alone: the field missing is its partner
            partner = next((b if a == given[0] else a for a, b in SCORE_SIDES if given[0] in (a, b)), None) \
                if len(given) == 1 else None
            raise APIError(400, f"a score request names its pairs' two sides by one of {pairs}; {got}",
                           partner or (given[0] if given else "text_1"))
        first, second = (_side(name, getattr(self, name), limits) for name in names)
        if len(first.texts) > 1 and len(first.texts) != len(second.texts):
            raise APIError(400, f"Input lengths must be either 1:1, 1:N or N:N; got {len(first.texts)} texts in "
                                f"{first.field} and {len(second.texts)} in {second.field}", first.field)
        return first, second


def _side(field: str, value: Any, limits: FrontendLimits) -> Side:
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list):
        raise APIError(400, f"{field} must be a string or a list of strings, got {type(value).__name__}", field)
    if not texts:
        raise APIError(400, f"{field} must hold at least one text", field)
    if len(texts) > limits.max_rerank_documents:
        raise APIError(400, f"{field} has {len(texts)} items; the limit is {limits.max_rerank_documents} "
                            "(max_rerank_documents)", field)
    side = Side(field, texts, isinstance(value, str))
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            why = "the rerank models here read no multimodal content" if isinstance(text, dict) else \
                f"got {type(text).__name__}"
            raise APIError(400, f"{side.param(i)} must be a string; {why}", side.param(i))
        check_text(text, side.param(i), limits)
    return side


def _document_text(document: Any, param: str) -> str:
    if isinstance(document, str):
        return document
    if not isinstance(document, dict):
        raise APIError(400, f"{param} must be a string or an object with a string 'text', got "
                            f"{type(document).__name__}", param)
    if "text" not in document:
        raise APIError(400, f"{param} has no 'text'; a document is a string or an object with a string 'text'",
                       f"{param}.text")
    if not isinstance(document["text"], str):
        raise APIError(400, f"{param}.text must be a string, got {type(document['text']).__name__}", f"{param}.text")
    return document["text"]


def _token_ids(value: Any) -> bool:
    """OpenAI's other input forms: a list of ids or a list of such lists."""
    return token_ids(value) or (isinstance(value, list) and bool(value) and all(token_ids(v) for v in value))


