"""SamplingParams.prompt_logprobs: every prompt token after the first scored from the raw logits, against
HF transformers on the tiny checkpoints, and through chunked prefill, preemption and the prefix cache on the
counting fake model (conftest.CountingRunner)."""
from __future__ import annotations

import functools

import pytest
import torch
from engine_steps import drain
from tiny_checkpoints import tiny_checkpoints  # noqa: F401  (a fixture)

from llm_engine import LLM
from llm_engine.sampling_params import SamplingParams

GREEDY = dict(temperature=0)
LONG_PROMPT = "Retrieval augmented generation combines a search engine with a language model, and the server"


def run(engine, requests: dict[str, tuple[str, SamplingParams]]) -> dict[str, list]:
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
    return drain(engine)


# --- the counting fake model: "abc" is certain at every position, "aXc" is not at the X ---------------

def counting_scores(prompt: str) -> list[float | None]:
    """The fake model's logprob of each prompt byte: about 0 where it follows its predecessor + 1."""
    certain = -(torch.tensor(20.0).exp() + 259).log().item() + 20.0
    uncertain = -(torch.tensor(20.0).exp() + 259).log().item()
    return [None] + [certain if ord(b) == ord(a) + 1 else uncertain for a, b in zip(prompt, prompt[1:])]


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_each_prompt_token_is_scored_once_over_chunks(fake_engine, async_scheduling):
    # A 6-token budget splits the 20-token prompt over steps next to the other request's decodes.
    engine = fake_engine(max_num_batched_tokens=6, async_scheduling=async_scheduling)
    prompt = "abcdefgXijklmnopqrst"
    outs = run(engine, {"scored": (prompt, SamplingParams(max_tokens=3, prompt_logprobs=2, **GREEDY)),
                        "plain": ("abc", SamplingParams(max_tokens=8, **GREEDY))})
    first = outs["scored"][0]
    assert first.prompt_logprobs == pytest.approx(counting_scores(prompt), abs=1e-5)
    assert first.prompt_top_logprobs[0] is None
    x = prompt.index("X")
    assert first.prompt_top_logprobs[x].rank > 1 and first.prompt_top_logprobs[x + 2].rank == 1
    assert list(first.prompt_top_logprobs[x].top)[0] == ord("h")  # what the model expected, 2 of them
    assert all(len(t.top) == 2 for t in first.prompt_top_logprobs[1:])
    assert outs["scored"][-1].prompt_logprobs == first.prompt_logprobs
    assert all(o.prompt_logprobs is None for o in outs["plain"])


def test_a_preempted_sequence_scores_its_prompt_once(fake_engine):
    prompts = {f"r{i}": "abcdefghijklmnop"[i:] + "qrs" for i in range(4)}
    params = SamplingParams(max_tokens=12, prompt_logprobs=0, ignore_eos=True, **GREEDY)
    engine = fake_engine(num_kv_blocks=12, max_num_batched_tokens=8)
    outs = run(engine, {rid: (p, params) for rid, p in prompts.items()})
    assert engine.get_stats().num_preemptions > 0
    for rid, prompt in prompts.items():
        got = outs[rid][-1]
        assert got.prompt_logprobs == pytest.approx(counting_scores(prompt), abs=1e-5)
        assert all(t.top == {} for t in got.prompt_top_logprobs[1:])


def test_a_scored_request_takes_no_prefix_cache_hit(fake_engine):
    engine = fake_engine()
    prompt = "abcdefghijklmnopq"  # four full blocks of 4
    run(engine, {"warm": (prompt, SamplingParams(max_tokens=2))})
    outs = run(engine, {"cached": (prompt, SamplingParams(max_tokens=2)),
                        "scored": (prompt, SamplingParams(max_tokens=2, prompt_logprobs=0))})
    assert outs["cached"][-1].stats.num_cached_tokens == 16
    assert outs["scored"][-1].stats.num_cached_tokens == 0
    assert len(outs["scored"][-1].prompt_logprobs) == len(prompt)


def test_a_one_token_prompt_has_only_the_first_entry(fake_engine):
    outs = run(fake_engine(), {"r": ("a", SamplingParams(max_tokens=2, prompt_logprobs=3))})
    assert outs["r"][0].prompt_logprobs == [None] and outs["r"][0].prompt_top_logprobs == [None]


def test_prompt_logprobs_are_bounded_like_logprobs():
    with pytest.raises(ValueError, match=r"prompt_logprobs must be in \[0, 20\], got 21"):
        SamplingParams(prompt_logprobs=21)
    with pytest.raises(ValueError, match="prompt_logprobs must be an integer, got True"):
        SamplingParams(prompt_logprobs=True)


# --- the real model against HF transformers ----------------------------------------------------------

@functools.cache
def hf_prompt_logprobs(path: str, ids: tuple[int, ...]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float().log_softmax(-1)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_prompt_logprobs_match_hf_transformers_over_chunks(name, tiny_checkpoints, device):
    # An 8-token budget splits the prompt into chunks beside the other request's decodes (on a GPU, the
    # scored chunks run eagerly or through the piecewise graphs, the decodes through the decode graphs).
    llm = LLM(str(tiny_checkpoints[name]), device=device.type, dtype="float32", max_model_len=256,
              max_num_batched_tokens=8)
    outs = run(llm.engine, {"scored": (LONG_PROMPT, SamplingParams(max_tokens=2, prompt_logprobs=5, **GREEDY)),
                            "other": ("The quick brown fox", SamplingParams(max_tokens=12, **GREEDY))})
    out = outs["scored"][-1]
    ids = out.prompt_token_ids
    expected = hf_prompt_logprobs(str(tiny_checkpoints[name]), tuple(ids))
    assert out.prompt_logprobs[0] is None and out.prompt_top_logprobs[0] is None
    assert len(out.prompt_logprobs) == len(ids) > 8
    for p in range(1, len(ids)):
        row = expected[p - 1]
        assert out.prompt_logprobs[p] == pytest.approx(row[ids[p]].item(), abs=1e-4), p
        assert out.prompt_top_logprobs[p].rank == int((row > row[ids[p]]).sum()) + 1
        top = out.prompt_top_logprobs[p].top
        want = row.topk(5)
        assert list(top) == want.indices.tolist()
        assert list(top.values()) == pytest.approx(want.values.tolist(), abs=1e-4)
