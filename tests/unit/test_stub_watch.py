"""ragstack.stub_watch's reading of a model config: the instances Triton starts for it, by name (a dead
stub is one of these with no process). The watch itself, with the real server: tests/faults/test_stub_crash.py."""
from __future__ import annotations

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
