"""The gateway's parts that need no server: the JSON depth scan, the hop-by-hop header rule, /readyz's rule, and its
limits as flags (`ragstack serve` and `python -m ragstack.gateway` take the same ones)."""
from __future__ import annotations

import argparse
import json

import pytest
from multidict import CIMultiDict

from ragstack import serve
from ragstack.gateway import generate_body, json_depth
from ragstack.gateway import limits as gateway_limits
from ragstack.gateway.limits import GatewayLimits
from ragstack.gateway.livez import readiness_problem
from ragstack.gateway.upstream import end_to_end


@pytest.mark.parametrize("text, depth", [
    (b'"just a string"', 0), (b"3.5", 0), (b"[]", 1), (b'{"a": [1, {"b": [[]]}]}', 5),
    (b'{"a": "[[[[{{{{"}', 1),                      # brackets inside a string do not count
    (b'{"a": "\\"[[[", "b": [[1]]}', 3),            # nor after an escaped quote
    (b'{"a": "\\\\", "b": [[1]]}', 3),              # an escaped backslash ends before the quote
    (b'["\\\\\\"[[", [2]]', 2),
    (b"[" * 130_000 + b"]" * 130_000, 130_000),
    (b"[" * 1000, 1000),                            # unclosed: as deep as a parser would recurse
])
def test_json_depth(text, depth):
    assert json_depth.depth(text) == depth


@pytest.mark.parametrize("text, limit, over", [
    (b'{"a": [1, {"b": [[]]}]}', 5, None), (b'{"a": [1, {"b": [[]]}]}', 4, 5),
    (b'[[1], [2], [3], [4], [5], [6]]', 3, None),      # 7 brackets open, 2 levels deep
    (b'{"a": "[[[[[[[["}', 2, None),                  # brackets in strings count only for the quick bound
])
def test_json_deeper_than_a_limit(text, limit, over):
    assert json_depth.deeper_than(text, limit) == over


def test_json_depth_agrees_with_a_parser_on_nested_data():
    value = {"inputs": [{"name": "x", "data": [[1, 2], [3, 4]], "parameters": {"s": "a]b\"}"}}]}
    assert json_depth.depth(json.dumps(value).encode()) == 5


def test_hop_by_hop_headers_and_those_connection_names_are_dropped():
    headers = CIMultiDict([("Connection", "keep-alive, X-Trace"), ("X-Trace", "1"), ("Keep-Alive", "timeout=5"),
                           ("Transfer-Encoding", "chunked"), ("Upgrade", "h2c"), ("TE", "trailers"),
                           ("Accept-Encoding", "gzip"), ("X-Ragstack-Admin-Key", "k"), ("Content-Length", "3")])
    kept = end_to_end(headers, frozenset({"content-length"}))
    assert list(kept.items()) == [("Accept-Encoding", "gzip"), ("X-Ragstack-Admin-Key", "k")]


def test_limits_round_trip_through_the_flags_of_serve():
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert serve.options_from_args(parser.parse_args([])).gateway == GatewayLimits()
    changed = GatewayLimits(max_body_bytes=1000, idle_timeout_s=2.5, max_connections=10)
    assert serve.options_from_args(parser.parse_args(changed.to_args())).gateway == changed


def test_a_limit_out_of_range_is_named():
    parser = argparse.ArgumentParser()
    gateway_limits.add_arguments(parser)
    with pytest.raises(ValueError, match="max_json_depth must be > 0, got 0"):
        gateway_limits.from_args(parser.parse_args(["--max-json-depth", "0"]))


def test_the_gateways_config_caches_keep_the_newest_entries_up_to_their_bound():
    cache: dict = {}
    for i in range(generate_body.MAX_CACHED + 10):
        generate_body._put(cache, f"/v2/models/m{i}", (i, None))
    assert len(cache) == generate_body.MAX_CACHED
    assert "/v2/models/m9" not in cache and "/v2/models/m10" in cache
    generate_body._put(cache, "/v2/models/m10", (0, None))  # refreshed: the newest again, kept longest
    generate_body._put(cache, "/v2/models/new", (0, None))
    assert "/v2/models/m10" in cache and "/v2/models/m11" not in cache


def test_readyz_leaves_a_new_models_failed_load_out_and_a_served_ones_or_a_moving_one_in():
    ready = {"name": "llm", "state": "READY"}
    failed = {"name": "broken", "state": "UNAVAILABLE", "reason": "Internal: RuntimeError: no"}
    assert readiness_problem([ready, failed], {"llm"}) is None   # Triton's strict readiness: false meanwhile
    assert readiness_problem([failed], set()) == "no model is READY"
    assert readiness_problem([], set()) == "no model is READY"
    assert readiness_problem([ready, {"name": "embed", "state": "LOADING"}], {"llm"}) == "embed LOADING"
    assert readiness_problem([{"name": "llm", "state": "UNLOADING"}, ready], {"llm"}) == "llm UNLOADING"
    # a model it served, reloaded and failed (a stub's death, a bad override): out, though others serve
    embed = {"name": "embed", "state": "READY"}
    assert readiness_problem([embed, {**failed, "name": "llm"}], {"llm", "embed"}) == \
        "llm failed: Internal: RuntimeError: no"
    assert readiness_problem([embed, {"name": "llm", "state": "UNAVAILABLE", "reason": "unloaded"}],
                             {"llm", "embed"}) is None   # unloaded on purpose
