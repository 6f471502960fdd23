import math

import pytest
import torch

from llm_engine.core.sequence import Sequence
from llm_engine.sampling_params import SamplingParams
from llm_engine.worker.sampler import Sampler, generator_seed

V = 32
EOS = 3


def seq(prompt=(1, 2), output=(), **params) -> Sequence:
    s = Sequence(token_ids=list(prompt), sampling_params=SamplingParams(**params))
    for t in output:
        s.append_token(t)
    return s


@pytest.fixture
def sampler():
    return Sampler([EOS])


def logits_for(n, seed=0):
    return torch.randn(n, V, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_rows_are_exactly_argmax_and_input_is_untouched(sampler):
    logits = logits_for(6)
    before = logits.clone()
    seqs = [seq(temperature=0) for _ in range(6)]
    assert sampler(logits, seqs).token_ids == logits.argmax(-1).tolist()
    assert torch.equal(logits, before)


def test_greedy_rows_stay_argmax_in_a_mixed_batch(sampler):
    logits = logits_for(6)
    seqs = [seq(temperature=0 if i % 2 else 1.0, top_k=3, top_p=0.5) for i in range(6)]
    out = sampler(logits, seqs).token_ids
    assert out[1::2] == logits.argmax(-1).tolist()[1::2]


def reference_penalties(row, s):
    """vLLM semantics, one token at a time."""
    p = s.sampling_params
    row = row.clone()
    for t in set(s.token_ids):
        row[t] = row[t] / p.repetition_penalty if row[t] > 0 else row[t] * p.repetition_penalty
    for t in set(s.output_token_ids):
        row[t] -= p.frequency_penalty * s.output_token_ids.count(t) + p.presence_penalty
    return row


def test_penalties_match_a_per_token_reference(sampler):
    logits = logits_for(3)
    seqs = [
        seq(prompt=(1, 2, 2, 5), output=(5, 7, 7, 7), temperature=0, repetition_penalty=1.7,
            frequency_penalty=0.5, presence_penalty=0.3),
        seq(prompt=(9,), output=(), temperature=0, repetition_penalty=0.6),
        seq(prompt=(4, 4), output=(4, 8), temperature=0),  # no penalty: untouched
    ]
    processed = sampler._apply_penalties(logits.clone(), seqs)
    for i, s in enumerate(seqs):
        torch.testing.assert_close(processed[i], reference_penalties(logits[i], s))


def test_repetition_penalty_steers_greedy_away(sampler):
    logits = torch.zeros(1, V)
    logits[0, 5], logits[0, 6] = 2.0, 1.5
    assert sampler(logits, [seq(prompt=(5,), temperature=0, repetition_penalty=2.0)]).token_ids == [6]


def draw_many(sampler, logits_row, n=4000, **params):
    logits = logits_row.expand(n, -1).contiguous()
    return torch.tensor(sampler(logits, [seq(**params) for _ in range(n)]).token_ids)


def test_samples_follow_the_tempered_distribution(sampler):
    row = torch.tensor([2.0, 1.0, 0.0, -1.0] + [-30.0] * (V - 4))
    for temperature in (1.0, 0.5):
        counts = torch.bincount(draw_many(sampler, row, temperature=temperature), minlength=V).float()
        expected = torch.softmax(row / temperature, -1) * counts.sum()
        assert counts[4:].sum() == 0
        # 4000 draws: a 5-sigma band around each expected count
        assert torch.all((counts[:4] - expected[:4]).abs() <= 5 * expected[:4].sqrt() + 5)


def test_top_k_top_p_min_p_restrict_the_support(sampler):
    row = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1] + [1e-6] * (V - 4)))
    assert set(draw_many(sampler, row, top_k=2).tolist()) == {0, 1}
    assert set(draw_many(sampler, row, top_p=0.35).tolist()) == {0}
    assert set(draw_many(sampler, row, top_p=0.65).tolist()) == {0, 1}  # 0.4 + 0.3 reaches 0.65
    assert set(draw_many(sampler, row, top_p=0.75).tolist()) == {0, 1, 2}
    assert set(draw_many(sampler, row, min_p=0.45).tolist()) == {0, 1, 2}  # p >= 0.45 * 0.4
    assert set(draw_many(sampler, row, min_p=0.6).tolist()) == {0, 1}
    assert set(draw_many(sampler, row, top_k=1).tolist()) == {0}


def test_seeded_rows_do_not_depend_on_the_batch(sampler):
    target = seq(output=(4, 4), seed=1234, temperature=1.0)
    row = logits_for(1, seed=7)
    alone = [sampler(row, [target]).token_ids[0] for _ in range(3)]
    assert len(set(alone)) == 1
    for other_seed in range(4):
        others = logits_for(4, seed=other_seed)
        batch = torch.cat([others[:2], row, others[2:]])
        seqs = [seq(temperature=1.0), seq(temperature=0.7, seed=9), target, seq(temperature=0), seq()]
        assert sampler(batch, seqs).token_ids[2] == alone[0]


def test_seeded_draws_change_with_position_and_seed(sampler):
    row = torch.zeros(1, V)  # uniform: any repetition would be a coincidence
    by_position = {sampler(row, [seq(output=(1,) * k, seed=5)]).token_ids[0] for k in range(12)}
    by_seed = {sampler(row, [seq(seed=s)]).token_ids[0] for s in range(12)}
    assert len(by_position) > 3 and len(by_seed) > 3


def test_seeds_that_differ_in_the_sign_bit_draw_apart(sampler, device):
    """Every int64 seed is its own (the frontend wraps seed + i within int64): the generator's seeds differ, and
    on a GPU (whose generator reads 64 bits; the CPU's reads 32) so do the draws."""
    row = torch.zeros(1, V, device=device)

    def draws(seed: int) -> tuple[int, ...]:
        return tuple(sampler(row, [seq(output=(1,) * k, seed=seed)]).token_ids[0] for k in range(8))

    for low in (-1, 0, 5):
        high = low + 2**63 if low < 0 else low - 2**63
        assert all(generator_seed(low, k) != generator_seed(high, k) for k in range(8))
        assert device.type == "cpu" or draws(low) != draws(high), (low, high)


def test_min_tokens_masks_eos_and_stop_ids(sampler):
    logits = torch.zeros(3, V)
    logits[:, EOS] = 50.0
    logits[:, 9] = 40.0
    seqs = [
        seq(output=(1,), temperature=0, min_tokens=2, stop_token_ids=[9]),  # both masked
        seq(output=(1, 1), temperature=0, min_tokens=2, stop_token_ids=[9]),  # reached: eos allowed
        seq(output=(1,), temperature=0, min_tokens=2, ignore_eos=True),  # eos not a stop: not masked
    ]
    out = sampler(logits, seqs).token_ids
    assert out[0] not in (EOS, 9) and out[1:] == [EOS, EOS]


def test_logprobs_of_the_chosen_tokens(sampler):
    logits = logits_for(3)
    seqs = [seq(temperature=0, logprobs=True), seq(temperature=0.5, logprobs=True), seq(temperature=0)]
    out = sampler(logits, seqs)
    assert out.logprobs[2] is None
    greedy = out.token_ids[0]
    assert math.isclose(out.logprobs[0], torch.log_softmax(logits[0], -1)[greedy].item(), rel_tol=1e-5)
    tok = out.token_ids[1]
    assert math.isclose(out.logprobs[1], torch.log_softmax(logits[1] / 0.5, -1)[tok].item(), rel_tol=1e-5)


def test_logprobs_are_renormalised_after_top_k(sampler):
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2] + [1e-9] * (V - 3)]))
    out = sampler(logits, [seq(top_k=2, logprobs=True, seed=0)])
    p = {0: 0.5 / 0.8, 1: 0.3 / 0.8}[out.token_ids[0]]
    assert math.isclose(out.logprobs[0], math.log(p), rel_tol=1e-4)


@pytest.mark.parametrize("seed", range(4))
def test_ranks_and_most_likely_tokens_match_the_distribution(sampler, seed):
    """Fresh random logits; each row's rank and top-N against log_softmax computed here in float64."""
    logits = logits_for(4, seed=seed)
    seqs = [seq(temperature=0, logprobs=3), seq(temperature=0.7, logprobs=0, seed=seed),
            seq(temperature=1.0, logprobs=5, seed=seed + 1), seq(temperature=0)]
    out = sampler(logits, seqs)
    assert out.top_logprobs[3] is None and out.logprobs[3] is None
    for row, (n, temperature) in enumerate([(3, 1.0), (0, 0.7), (5, 1.0)]):
        reference = torch.log_softmax(logits[row].double() / temperature, -1)
        token, top = out.token_ids[row], out.top_logprobs[row]
        assert top.rank == int((reference > reference[token]).sum()) + 1
        expected = reference.topk(n) if n else None
        assert list(top.top) == ([] if expected is None else expected.indices.tolist())
        for token_id, lp in top.top.items():
            assert math.isclose(lp, reference[token_id].item(), rel_tol=1e-5, abs_tol=1e-6)
    assert out.top_logprobs[0].rank == 1  # greedy: the most likely token


def test_logprobs_true_means_the_tokens_own_only():
    assert SamplingParams(logprobs=True).logprobs == 0 and SamplingParams(logprobs=False).logprobs is None
    with pytest.raises(ValueError, match=r"logprobs must be in \[0, 20\], got 21"):
        SamplingParams(logprobs=21)


def test_logit_bias_is_added_before_the_penalties_and_steers_greedy(sampler):
    logits = logits_for(4)
    top = logits.argmax(-1).tolist()
    seqs = [
        seq(temperature=0, logit_bias={5: 100}),                                  # forced
        seq(temperature=0, logit_bias={top[1]: -100}),                           # banned
        seq(prompt=(1, 2, 9), temperature=0, logit_bias={9: 7.5}, repetition_penalty=1.5),
        seq(temperature=0),                                                       # untouched
    ]
    out = sampler(logits, seqs)
    assert out.token_ids[0] == 5 and out.token_ids[1] != top[1] and out.token_ids[3] == top[3]
    banned = logits[1].clone()
    banned[top[1]] -= 100
    assert out.token_ids[1] == banned.argmax().item()
    row = logits[2].clone()
    row[9] += 7.5
    expected = reference_penalties(row, seqs[2])
    assert out.token_ids[2] == expected.argmax().item()


def test_logit_bias_shapes_the_sampled_distribution_and_its_logprobs(sampler):
    logits = torch.zeros(1, V)
    out = sampler(logits, [seq(temperature=1.0, seed=1, logprobs=0, logit_bias={"4": 100, "6": 100})])
    assert out.token_ids[0] in (4, 6)
    assert out.logprobs[0] == pytest.approx(math.log(0.5), abs=1e-4)


def test_logit_bias_cannot_unmask_a_token(sampler):
    logits = torch.zeros(1, V)
    logits[0, 9] = 1.0
    out = sampler(logits, [seq(output=(1,), temperature=0, min_tokens=2, stop_token_ids=[9], logit_bias={9: 100})])
    assert out.token_ids[0] != 9


def test_allowed_token_ids_restrict_every_pick(sampler):
    logits = logits_for(3)
    seqs = [seq(temperature=0, allowed_token_ids=[2, 11]),
            seq(temperature=1.0, seed=4, allowed_token_ids=[5, 6, 7], logprobs=0),
            seq(temperature=0, allowed_token_ids=[2, 11], logit_bias={11: 100})]
    out = sampler(logits, seqs)
    assert out.token_ids[0] == (2 if logits[0, 2] > logits[0, 11] else 11)
    assert out.token_ids[1] in (5, 6, 7) and out.token_ids[2] == 11
    kept = logits[1, [5, 6, 7]]
    assert out.logprobs[1] == pytest.approx((kept - kept.logsumexp(0))[out.token_ids[1] - 5].item(), abs=1e-4)
