"""ragstack.stub_watch's reading of a model config: the instances Triton starts for it, by name (a dead
stub is one of these with no process). The watch itself, with the real server: tests/faults/test_stub_crash.py."""
from __future__ import annotations

from ragstack import stub_watch
from ragstack.process_tree import Stub
from ragstack.stub_watch import instance_names


def test_instances_of_each_group_by_triton_s_names():
    config = {"name": "embedder", "instance_group": [{"name": "embedder_0", "kind": "KIND_CPU", "count": 2},
                                                     {"kind": "KIND_CPU", "count": 1}]}
    assert instance_names(config) == {"embedder_0_0", "embedder_0_1", "embedder_1_0"}


def test_a_gpu_group_names_its_instances_on_each_gpu_alike():
    config = {"name": "llm", "instance_group": [{"name": "llm_0", "kind": "KIND_GPU", "count": 2, "gpus": [0, 1]}]}
    assert instance_names(config) == {"llm_0_0", "llm_0_1"}


def test_a_config_without_groups_has_one_instance():
    assert instance_names({"name": "retriever"}) == {"retriever_0_0"}


def test_a_model_whose_stubs_keep_dying_is_reloaded_at_most_max_reloads_times(monkeypatch):
    """The deaths and Triton are stand-ins here: each look finds the stub dead, then reborn by the reload."""
    stub = Stub("retriever", "1", "retriever_0_0")
    alive = {101: stub}
    monkeypatch.setattr(stub_watch, "server_stubs", lambda _pid: dict(alive))
    calls = []

    def post(path, body):
        calls.append(path)
        if path.endswith("/load"):
            alive[100 + len(calls)] = stub
        return [{"name": "retriever", "version": "1", "state": "READY"}] if path.endswith("/index") else {}

    watch = stub_watch.StubWatch(1, "127.0.0.1:1", max_reloads=2, log=lambda _line: None)
    monkeypatch.setattr(watch, "_post", post)
    monkeypatch.setattr(watch, "_get", lambda _path: {"name": "retriever", "instance_group": [{"count": 1}]})
    assert watch.check() == []  # the first look: the stub runs
    alive.clear()
    assert watch.check() == []  # gone: unloading, say
    alive[101] = stub
    assert watch.check() == []  # back (a reload's new stub), not a death
    for _ in range(3):
        alive.clear()
        assert watch.check() == []  # gone, its version READY: a death only if it stays so at the next look
        assert watch.check() == ["retriever"]
        assert watch.check() == []  # the next look: the reloaded stub runs (none, once left as it is)
    assert [line.rsplit("'retriever' ", 1)[1].split(":")[0] for line in watch.reloads] == \
        ["reloaded", "reloaded", "left as it is"]
    assert calls.count("/repository/models/retriever/load") == 2
