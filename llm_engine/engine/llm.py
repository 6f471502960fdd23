"""Offline batch generation: `LLM(model).generate(prompts, params)`."""
from __future__ import annotations

import itertools
from collections import deque
from typing import Sequence as SequenceT

from tqdm.auto import tqdm

from llm_engine.config import EngineConfig
from llm_engine.engine.llm_engine import LLMEngine
from llm_engine.errors import EngineOverloadedError, RequestRefusedError
from llm_engine.outputs import RequestOutput
from llm_engine.sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    def __init__(self, model: str, **config) -> None:
        """`config` are EngineConfig fields (dtype, max_model_len, num_kv_blocks, ...)."""
        self.engine = LLMEngine(EngineConfig(model=model, **config))
        self._ids = itertools.count()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def close(self) -> None:
        """Stop the tensor-parallel workers, if any; also on leaving a `with LLM(...)` block."""
        self.engine.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def generate(self, prompts: Prompt | SequenceT[Prompt],
                 sampling_params: SamplingParams | SequenceT[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Run every prompt to completion; final outputs in prompt order.

        Prompts are fed as the waiting queue has room, so any number may be passed. Raises
        ValueError for a bad prompt or parameter, RequestFailedError if a request fails.
        """
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        elif len(sampling_params) != len(prompts):
            raise ValueError(f"got {len(sampling_params)} sampling_params for {len(prompts)} prompts")

        request_ids = [f"llm-{next(self._ids)}" for _ in prompts]
        pending = deque(zip(request_ids, prompts, sampling_params))
        results: dict[str, RequestOutput] = {}
        engine = self.engine
        with tqdm(total=len(prompts), desc="generate", disable=not use_tqdm) as bar:
            try:
                while len(results) < len(prompts):
                    while pending:
                        try:
                            engine.add_request(*pending[0], final_only=True)
                        except EngineOverloadedError:
                            break
                        pending.popleft()
                    for out in engine.step():
                        if out.error is not None:
                            raise RequestRefusedError.of(out.request_id, out.error, out.error_is_input)
                        if out.finished:
                            results[out.request_id] = out
                            bar.update(1)
            except BaseException:
                for rid in request_ids:  # leave the engine clean for the next call
                    engine.abort_request(rid)
                raise
        return [results[rid] for rid in request_ids]
