"""The session fixture's guard against an aborted server (tests/server_crash.py), on a server of its own:
a fatal signal in the log is found (by the launcher too), the stacks are taken, the hung server is killed
without waiting for a drain, and a fresh server on the same ports serves."""
from __future__ import annotations

import pytest

from ragstack.fatal_signal import LogWatch
from ragstack.launcher import TritonServer
from server_crash import replace_if_aborted
from server_helpers import FIXTURE_REPOSITORY, free_server_options

pytestmark = pytest.mark.server


def test_an_aborted_server_is_reported_and_replaced(tmp_path):
    options = free_server_options(model_repositories=[FIXTURE_REPOSITORY], models=["echo"], exit_timeout_s=3)
    with TritonServer(options, work_dir=tmp_path) as server:
        watch = LogWatch(server.log_path)
        assert replace_if_aborted(server, watch) is None
        aborted = server.process.pid
        with open(server.log_path, "ab") as log:  # as Triton's handler logs it, then hangs (a live process)
            log.write(b"double free or corruption (fasttop)\nSignal (6) received.\n")
        # the launcher sees it too (what `ragstack serve` watches), and stops the hung server at once
        assert server.crashed() and "Signal (6) received." in server.exit_report()
        after_abort = server.log_path.stat().st_size
        failure = replace_if_aborted(server, watch)
        # killed, not asked to drain (a hung handler would not hear it; this one would have logged it)
        assert b"Signal (2) received." not in server.log_path.read_bytes()[after_abort:]
        assert failure is not None and f"pid {aborted}" in failure and "Signal (6) received." in failure
        assert server.process.pid != aborted and server.is_ready()
        assert not server.crashed() and server.exit_report() is None  # the fresh server's own watch
        # the line is reported once, and the stop's own "Signal (2) received." is no abort
        assert replace_if_aborted(server, watch) is None
