"""benchmarks/scaling_sim.py: the capacity model from the measured H200 figures, and the HPA rule of deploy/k8s
replayed on load curves: steady load stays at the minimum, a step up is met within the pods' start-up and the
queue drains, a step down waits out the stabilization window and sheds one pod per policy period, a burst past
what the pods can start in time shows the queue it builds."""
from __future__ import annotations

import math

import pytest

from benchmarks import scaling_sim as sim

SLO_S = 1.0


@pytest.fixture(scope="module")
def capacity():
    return sim.capacity_at_slo(SLO_S)


@pytest.fixture(scope="module")
def rule():
    return sim.Rule.from_hpa()


def test_the_capacity_at_an_slo_is_read_from_the_measured_table(capacity):
    # TTFT p99 968 ms at 64 streams, 4,052 ms at 256: 64 is the largest within 1 s.
    assert capacity.concurrency == 64
    assert capacity.rps == pytest.approx(5747 / 320)
    assert capacity.hold_s == pytest.approx(64 / (5747 / 320))
    assert sim.capacity_at_slo(0.3).concurrency == 18             # between 16 (225 ms) and 64 (968 ms)
    assert sim.capacity_at_slo(5.0).concurrency == 256             # beyond the table: its last point
    tighter = [sim.capacity_at_slo(s).concurrency for s in (0.05, 0.1, 0.3, 0.6, 1.0, 2.0)]
    assert tighter == sorted(tighter)
    with pytest.raises(ValueError, match="no concurrency meets"):
        sim.capacity_at_slo(0.02)                                  # even one stream's TTFT is 32 ms
    # Longer answers: fewer requests a second at the same concurrency.
    assert sim.capacity_at_slo(SLO_S, output_tokens=640).rps == pytest.approx(capacity.rps / 2)


def test_replicas_for_a_rate(capacity):
    assert sim.replicas_for(40, capacity) == math.ceil(40 / (capacity.rps * 0.75)) == 3
    assert sim.replicas_for(0.1, capacity) == 1
    assert sim.replicas_for(40, capacity, utilization=1.0) == 3
    assert sim.replicas_for(54, capacity, utilization=1.0) == 4


def test_the_rule_is_the_hpa_of_deploy_k8s(rule):
    assert rule.targets == {"ragstack_llm_requests_running": 48, "ragstack_llm_requests_waiting": 4,
                            "ragstack_llm_kv_cache_usage": 0.8, "ragstack_triton_queue_seconds": 0.05}
    assert (rule.min_replicas, rule.max_replicas) == (2, 8)
    assert rule.down_window_s == 600 and rule.up_window_s == 0
    assert sim._quantity("800m") == 0.8 and sim._quantity("48") == 48


def run(capacity, rule, curve, **options):
    return sim.Simulation(capacity, rule, **options).run(curve)


def test_steady_load_within_the_minimum_stays_there(capacity, rule):
    samples = run(capacity, rule, [(0, 10), (1800, 10)])
    assert {s.replicas for s in samples} == {rule.min_replicas}
    assert max(s.waiting for s in samples) == 0
    assert max(s.ttft_s for s in samples) < SLO_S


def test_a_step_up_is_met_within_the_start_up_and_the_queue_drains(capacity, rule):
    startup = 180
    samples = run(capacity, rule, [(0, 10), (600, 10), (601, 40), (3000, 40)], startup_s=startup)
    after = [s for s in samples if s.t > 600]
    needed = sim.replicas_for(40, capacity)
    asked = next(s.t for s in after if s.replicas >= needed)
    assert asked - 600 <= 30 + 2 * rule.sync_s                    # the metrics' lag and a sync or two
    ready = next(s.t for s in after if s.ready >= needed)
    assert ready - asked <= startup + rule.sync_s
    # The queue built while pods started drains, and the objective holds again.
    settled = [s for s in samples if s.t > ready + 300]
    assert settled and max(s.waiting for s in settled) < 1 and max(s.ttft_s for s in settled) < SLO_S
    assert max(s.replicas for s in samples) <= rule.max_replicas


def test_a_step_down_waits_out_the_window_and_sheds_a_pod_per_period(capacity, rule):
    # An hour at 40 req/s settles on what the running target asks (the start-up's overshoot shed), then 10 req/s.
    samples = run(capacity, rule, [(0, 40), (3600, 40), (3601, 10), (7200, 10)])
    assert samples[3600].replicas == sim.replicas_for(40, capacity) == 3
    drops = [s.t for prev, s in zip(samples, samples[1:]) if s.replicas < prev.replicas and s.t > 3600]
    assert drops and drops[0] >= 3600 + rule.down_window_s       # nothing goes within the window
    assert all(b - a >= 300 for a, b in zip(drops, drops[1:]))   # one pod per 5 minutes
    assert samples[-1].replicas == rule.min_replicas
    assert max(s.waiting for s in samples if s.t > 3600) == 0    # shrinking never queued a request


def test_a_burst_faster_than_pods_start_queues_until_they_are_ready(capacity, rule):
    samples = run(capacity, rule, [(0, 20), (600, 20), (601, 60), (1500, 60)], startup_s=180)
    burst = [s for s in samples if s.t > 600]
    worst = max(burst, key=lambda s: s.queue_wait_s)
    assert worst.queue_wait_s > SLO_S                            # the minimum's headroom is all there is
    assert samples[-1].waiting < 1 and samples[-1].ready >= sim.replicas_for(60, capacity, utilization=1.0)


def test_the_script_prints_the_capacity_the_targets_and_the_replay(capsys):
    assert sim.main(["--curve", "0:10,600:40,1200:40", "--every", "600"]) == 0
    printed = capsys.readouterr().out
    assert "64 streams (max_num_seqs), 18.0 req/s" in printed
    assert "suggested targets: running 48 per pod" in printed
    lines = [line for line in printed.splitlines() if line.strip().split(" ")[0].isdigit()]
    assert [int(line.split()[0]) for line in lines] == [0, 600, 1200]
    assert "over the objective" in printed
