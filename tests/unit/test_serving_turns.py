"""bench_serving's turns: two systems on one server send a level's requests in rounds, taking turns (ABBA), so
that a drift of the server over the level falls on both alike; each system's row pools its own rounds, and
the server's counters that grew during a system's runs count for it alone; and the frontend's own share of TTFT."""
from __future__ import annotations

from benchmarks.bench_serving import in_turns, own_share


def test_systems_take_turns_and_pool_their_own_rounds():
    order, counter = [], {"n": 0.0}
    systems = [("grpc", "triton", list(range(10))), ("frontend", "openai", list(range(100, 110)))]

    def run(api, requests):
        order.append((api, list(requests)))
        counter["n"] += 1 if api == "triton" else 100   # what the server counted during this run
        return [r * 10 for r in requests], 0.5 if api == "triton" else 0.25

    pooled = in_turns(systems, 4, run, lambda: {("n", "llm"): counter["n"]})

    assert [api for api, _ in order] == ["triton", "openai", "openai", "triton",
                                         "triton", "openai", "openai", "triton"]
    assert order[0][1] == [0, 4, 8] and order[1][1] == [100, 104, 108]   # every 4th request in round 0
    results, seconds, counters = pooled["grpc"]
    assert sorted(results) == [r * 10 for r in range(10)]                # each request once
    assert seconds == 2.0 and counters == {("n", "llm"): 4.0}
    results, seconds, counters = pooled["frontend"]
    assert sorted(results) == [r * 10 for r in range(100, 110)]
    assert seconds == 1.0 and counters == {("n", "llm"): 400.0}


def test_one_round_runs_each_system_once_in_order():
    runs = []
    pooled = in_turns([("a", "triton", [1, 2]), ("b", "openai", [3])], 1,
                      lambda api, requests: (runs.append(api) or list(requests), 1.0), dict)
    assert runs == ["triton", "openai"]
    assert pooled == {"a": ([1, 2], 1.0, {}), "b": ([3], 1.0, {})}


def test_the_frontends_own_share_is_its_ttft_outside_the_server_over_grpcs():
    frontend = {"ttft_mean_ms": 30.0, "first_response_ms": 26.0}
    grpc = {"ttft_mean_ms": 27.5, "first_response_ms": 25.0}
    assert own_share(frontend, grpc) == ", the frontend's own share of TTFT (means, outside the server) +1.5 ms"
    assert own_share({"ttft_mean_ms": 30.0, "first_response_ms": None}, grpc) == ""
