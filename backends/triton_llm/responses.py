"""The output tensors of one request's responses, as vllm_backend sends them: `text_output` always,
the other outputs only when their return_* input asked (docs/additional_outputs.md in vllm_backend):
`finish_reason` ("None" until the last), `cumulative_logprob`, `logprobs` (JSON per response: for
each new token, {token id: {logprob, rank, decoded_token, bytes}} over the sampled token and the N most
likely; `bytes`, ours, the token's own, where its decoded_token may be "" or U+FFFD for part of a character;
`sampled`, ours, true on the sampled token's entry alone, which pieces cannot tell apart from an alternative's),
`num_input_tokens`, `num_output_tokens` (this response's tokens when streaming); and
`prompt_logprobs` (JSON in the first response, null after: per prompt token the same entries over its
N most likely tokens, the prompt token's own entry last; the first token's alone, its logprob and rank
null, as nothing before it scores it; the own entries' pieces add up to the decoded prompt); and
`stop_reason` (vLLM's, JSON: null until the last response, stop_reason.py).
"""
from __future__ import annotations

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from llm_engine.engine.detokenizer import IncrementalDetokenizer
from llm_request import LLMRequest
from prompt_pieces import prompt_pieces
from stop_reason import stop_reason_json

# vLLM's OpenAI server's floor: a token a constraint masked has logprob -inf, which JSON cannot hold.
LOGPROB_FLOOR = -9999.0


def finite(logprob: float | None) -> float | None:
    return logprob if logprob is None or logprob >= LOGPROB_FLOOR else LOGPROB_FLOOR


class ResponseBuilder:
    def __init__(self, req: LLMRequest, tokenizer) -> None:
        self.req = req
        self.tokenizer = tokenizer
        self._cumulative = 0.0
        self._sent_tokens = 0
        self._sent_logprobs = 0
        self._sent_prompt_logprobs = False
        # The sampled tokens' text, piece by piece, so that the rank-1 pieces add up to the text.
        self._pieces: IncrementalDetokenizer | None = None

    def response(self, out, text: str, final: bool) -> pb_utils.InferenceResponse:
        """`out`: the engine's RequestOutput so far; `text`: this response's text."""
        req, returns = self.req, self.req.returns
        tensors = [pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_))]
        new_tokens = out.token_ids[self._sent_tokens:] if req.stream else out.token_ids
        if "return_finish_reason" in returns:
            reason = str(out.finish_reason) if final else "None"
            tensors.append(pb_utils.Tensor("finish_reason", np.array([reason.encode()], dtype=np.object_)))
        if "return_cumulative_logprob" in returns:
            self._cumulative += sum((out.logprobs or [])[self._sent_logprobs:])
            tensors.append(pb_utils.Tensor("cumulative_logprob", np.array([self._cumulative], dtype=np.float32)))
        if "return_logprobs" in returns:
            tensors.append(pb_utils.Tensor("logprobs", np.array([self._logprobs(out, final)], dtype=np.object_)))
        if "return_num_input_tokens" in returns:
            tensors.append(pb_utils.Tensor("num_input_tokens",
                                           np.array([len(out.prompt_token_ids)], dtype=np.uint32)))
        if "return_num_output_tokens" in returns:
            tensors.append(pb_utils.Tensor("num_output_tokens", np.array([len(new_tokens)], dtype=np.uint32)))
        if "return_prompt_logprobs" in returns:
            tensors.append(pb_utils.Tensor("prompt_logprobs", np.array([self._prompt_logprobs(out)], dtype=np.object_)))
        if "return_stop_reason" in returns:
            reason = stop_reason_json(out.stop_reason, final)
            tensors.append(pb_utils.Tensor("stop_reason", np.array([reason], dtype=np.object_)))
        self._sent_tokens = len(out.token_ids)
        self._sent_logprobs = len(out.logprobs or [])
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def _logprobs(self, out, final: bool) -> bytes:
        if self.req.sampling.get("logprobs") is None or out.top_logprobs is None:
            return b"null"  # as vllm_backend, when the request did not ask for logprobs
        if self._pieces is None:
            self._pieces = IncrementalDetokenizer(self.tokenizer, out.prompt_token_ids, [],
                                                  self.req.sampling.get("skip_special_tokens", True))
        start = self._sent_tokens if self.req.stream else 0
        entries = []
        tokens = out.token_ids[start:]
        skip = self.req.sampling.get("skip_special_tokens", True)
        decode, token_bytes = self.tokenizer.decode, self.tokenizer.token_bytes
        for i, (token, logprob, top) in enumerate(zip(tokens, out.logprobs[start:], out.top_logprobs[start:])):
            last = final and i == len(tokens) - 1
            self._pieces.add_token(token, check_stop=False, last=last)
            piece = self._pieces.emit(finished=last)
            # An alternative is no part of the text: a special one shows its own text (vLLM's), so special
            # tokens no longer all read ""; the sampled token reads as its piece of the text.
            entry = {str(t): {"logprob": finite(lp), "rank": rank + 1, "decoded_token": decode([t], False),
                              "bytes": token_bytes(t, False)} for rank, (t, lp) in enumerate(top.top.items())}
            entry[str(token)] = {"logprob": finite(logprob), "rank": top.rank, "decoded_token": piece,
                                 "bytes": token_bytes(token, skip), "sampled": True}
            entries.append(entry)
        return json.dumps(entries).encode()

    def _prompt_logprobs(self, out) -> bytes:
        if self._sent_prompt_logprobs or out.prompt_logprobs is None:
            return b"null"
        self._sent_prompt_logprobs = True
        skip = False   # the prompt as it was: its special tokens shown, as vLLM's prompt logprobs show them
        ids = out.prompt_token_ids
        entries = []
        decoded: dict[int, dict] = {}  # a long prompt's top tokens repeat: each decoded once
        token_bytes = self.tokenizer.token_bytes
        pieces = prompt_pieces(self.tokenizer, ids, given_as_ids=self.req.prompt_token_ids is not None)
        for token, piece, logprob, top in zip(ids, pieces, out.prompt_logprobs, out.prompt_top_logprobs):
            own = {"logprob": None, "rank": None, "decoded_token": piece, "bytes": token_bytes(token, skip)}
            if top is None:  # the first token: nothing before it to score it
                entries.append({str(token): own})
                continue
            for t in top.top:
                if t not in decoded:
                    decoded[t] = {"decoded_token": self.tokenizer.decode([t], skip), "bytes": token_bytes(t, skip)}
            entry = {str(t): {"logprob": finite(lp), "rank": rank + 1, **decoded[t]}
                     for rank, (t, lp) in enumerate(top.top.items()) if t != token}
            entry[str(token)] = {**own, "logprob": finite(logprob), "rank": top.rank}
            entries.append(entry)
        return json.dumps(entries).encode()
