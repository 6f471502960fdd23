"""inflight.py: the workers' shared count for max_inflight, each writing its own slot; a dead worker's slot
zeroed by the supervisor."""
from __future__ import annotations

from ragstack.openai_frontend import inflight


def test_the_workers_admit_n_times_max_inflight_between_them(tmp_path, monkeypatch):
    path = str(tmp_path / "inflight")
    inflight.create_file(path, 2)
    monkeypatch.setenv(inflight.ENV, f"{path}:0:2")
    first = inflight.from_environment(2)
    second = inflight.SharedInflight(2, path, 1, 2)
    for _ in range(4):   # all of a burst on the first worker
        assert not first.full()
        first.add(1)
    assert first.full() and second.full() and second.total() == 4
    inflight.clear(path, 0)   # the first worker died: its requests are gone
    assert second.total() == 0 and not second.full()


def test_one_process_counts_its_own(monkeypatch):
    monkeypatch.delenv(inflight.ENV, raising=False)
    alone = inflight.from_environment(1)
    assert not alone.full()
    alone.add(1)
    assert alone.full() and alone.total() == 1
