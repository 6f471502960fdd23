"""lm-evaluation-harness against the OpenAI frontend, unchanged: its `local-completions` model (the request flow
of `lm_eval --model local-completions --model_args base_url=...`) scores loglikelihood requests, sent as token
ids with echo and logprobs as it does by default, and as text; the scores are HF transformers' on the same
checkpoint. Its generate_until requests (greedy, stop strings) answer as the official client's."""
from __future__ import annotations

import functools

import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.models.openai_completions import LocalCompletionsAPI
from openai import OpenAI

from server_helpers import TINY_LLM, tiny_llm_ids

pytestmark = pytest.mark.server
PAIRS = [("Paged attention stores keys", " and values"), ("The KV cache", " holds"), ("A", " quick brown fox")]


@functools.cache
def hf_loglikelihood(context: str, continuation: str) -> tuple[float, bool]:
    """Sum of the continuation tokens' logprobs given the context, and whether each was the argmax."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(TINY_LLM), dtype=torch.float32).eval()
    context_ids, continuation_ids = tiny_llm_ids(context), tiny_llm_ids(continuation)
    ids = context_ids + continuation_ids
    with torch.inference_mode():
        logprobs = model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    rows = logprobs[len(context_ids) - 1:len(ids) - 1]
    target = torch.tensor(continuation_ids)
    return float(rows.gather(1, target[:, None]).sum()), bool((rows.argmax(-1) == target).all())


@pytest.mark.parametrize("tokenized", [True, False], ids=["token ids", "text"])
def test_lm_eval_local_completions_scores_loglikelihood_as_hf(triton_server, tokenized):
    lm = LocalCompletionsAPI(base_url=f"{triton_server.openai_url}/v1/completions", model="llm",
                             tokenizer=str(TINY_LLM), tokenized_requests=tokenized, num_concurrent=2, max_retries=1)
    requests = [Instance("loglikelihood", {}, pair, idx) for idx, pair in enumerate(PAIRS)]
    for pair, (logprob, greedy) in zip(PAIRS, lm.loglikelihood(requests, disable_tqdm=True)):
        expected, expected_greedy = hf_loglikelihood(*pair)
        assert logprob == pytest.approx(expected, abs=1e-3), pair
        assert greedy == expected_greedy, pair


@pytest.mark.parametrize("tokenized", [True, False], ids=["token ids", "text"])
def test_lm_eval_local_completions_generates_until_as_the_openai_client(triton_server, tokenized):
    lm = LocalCompletionsAPI(base_url=f"{triton_server.openai_url}/v1/completions", model="llm",
                             tokenizer=str(TINY_LLM), tokenized_requests=tokenized, max_retries=1)
    contexts = ["Question: what does a KV cache hold?\nAnswer:", "The quick brown fox"]
    asked = {"until": ["\n\n", "."], "max_gen_toks": 12}
    answers = lm.generate_until([Instance("generate_until", {}, (context, dict(asked)), idx)
                                 for idx, context in enumerate(contexts)], disable_tqdm=True)
    with OpenAI(base_url=f"{triton_server.openai_url}/v1", api_key="unused", max_retries=0) as client:
        for context, answer in zip(contexts, answers):
            direct = client.completions.create(model="llm", prompt=context, max_tokens=12, temperature=0,
                                               stop=asked["until"], seed=1234)
            assert answer == direct.choices[0].text and answer, context
