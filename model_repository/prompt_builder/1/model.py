"""prompt_builder: the question and its reranked passages -> chat messages with numbered
citations [1], [2], ..., and a JSON list of the sources they cite.

The passages are sorted by the reranker's scores (best first) here; the top_n best that fit in
max_context_chars are kept. A passage that does not fit whole is left out, except the first,
which is cut to the budget so that an answer always has some context.
"""
import json

import numpy as np
import triton_python_backend_utils as pb_utils


def _required(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:  # Triton 2.51 lets a required input go missing when a model has optional ones
        raise ValueError(f"{name}: missing input")
    return tensor


def _texts(request, name, required=True):
    tensor = _required(request, name) if required else pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    texts = []
    for i, value in enumerate(tensor.as_numpy().reshape(-1)):
        try:  # refused, not replaced: the text goes into the prompt and back to the client
            texts.append(value.decode("utf-8") if isinstance(value, bytes) else str(value))
        except UnicodeDecodeError:
            raise ValueError(f"{name}[{i}] is not valid UTF-8") from None
    return texts


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        self.default_top_n = int(params.get("default_top_n", "4"))
        self.max_top_n = int(params.get("max_top_n", "16"))
        self.max_passages = int(params.get("max_passages", "64"))
        self.max_passage_bytes = int(params.get("max_passage_bytes", "16384"))
        self.max_context_chars = int(params.get("max_context_chars", "4000"))
        self.max_query_chars = int(params.get("max_query_chars", "2000"))
        self.system_prompt = params.get("system_prompt", "")

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                messages, sources = self._build(request)
            except ValueError as error:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(str(error), pb_utils.TritonError.INVALID_ARG)))
                continue
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("messages", np.array([json.dumps(messages).encode()], dtype=object)),
                pb_utils.Tensor("sources", np.array([json.dumps(sources).encode()], dtype=object)),
            ]))
        return responses

    def _build(self, request):
        (query,) = _texts(request, "query")
        query = query.strip()
        if not query:
            raise ValueError("query is empty")
        if len(query) > self.max_query_chars:
            raise ValueError(f"query: {len(query)} characters; the limit is {self.max_query_chars}")
        passages, sources = _texts(request, "passages"), _texts(request, "sources")
        ids = _texts(request, "passage_ids", required=False)
        ids = [""] * len(passages) if ids is None else ids
        scores = _required(request, "scores").as_numpy().reshape(-1)
        counts = {"passages": len(passages), "sources": len(sources), "passage_ids": len(ids), "scores": len(scores)}
        if len(set(counts.values())) != 1:
            raise ValueError("passages, sources, passage_ids and scores must have one entry per passage; got "
                             + ", ".join(f"{name} {n}" for name, n in counts.items()))
        if len(passages) > self.max_passages:
            raise ValueError(f"passages: {len(passages)} in the request; the limit is {self.max_passages}")
        for i, passage in enumerate(passages):
            if len(passage.encode()) > self.max_passage_bytes:
                raise ValueError(f"passages[{i}] is {len(passage.encode())} bytes; the limit is {self.max_passage_bytes}")
        if not np.isfinite(scores).all():  # NaN would sort anywhere and is not JSON in `sources`
            raise ValueError(f"scores[{int(np.argmax(~np.isfinite(scores)))}] is not a finite number")
        top_n = self._top_n(request)

        order = np.argsort(-scores, kind="stable")[:top_n]
        blocks, cited, used = [], [], 0
        for i in order:
            text = " ".join(passages[i].split())
            if used + len(text) > self.max_context_chars:
                if blocks:
                    continue  # a shorter, lower-ranked passage may still fit
                text = text[:self.max_context_chars]
            n = len(blocks) + 1
            blocks.append(f"[{n}] (source: {sources[i]})\n{text}")
            cited.append({"n": n, "source": sources[i], "passage_id": ids[i], "score": float(scores[i])})
            used += len(text)
        context = "\n\n".join(blocks) if blocks else "(no passages were found)"
        user = (f"Context:\n{context}\n\nQuestion: {query}\n\n"
                "Answer from the context above and cite the passages you use as [n].")
        messages = [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": user}]
        return messages, cited

    def _top_n(self, request):
        tensor = pb_utils.get_input_tensor_by_name(request, "top_n")
        if tensor is None:
            return self.default_top_n
        values = tensor.as_numpy().reshape(-1)
        if values.size != 1:
            raise ValueError(f"top_n: {values.size} values; send one")
        top_n = int(values[0])
        if not 1 <= top_n <= self.max_top_n:
            raise ValueError(f"top_n: {top_n} is out of range; it must be 1 to {self.max_top_n}")
        return top_n
