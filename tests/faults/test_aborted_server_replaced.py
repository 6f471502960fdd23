"""The session fixture's guard against an aborted server (tests/server_crash.py), on a server of its own:
a fatal signal in the log is found, the stacks are taken, and a fresh server on the same ports serves."""
from __future__ import annotations

import os
import signal
import time

import pytest

from ragstack.launcher import TritonServer
from server_crash import LogWatch, replace_if_aborted
from server_helpers import FIXTURE_REPOSITORY, free_server_options

pytestmark = pytest.mark.server


def test_an_aborted_server_is_reported_and_replaced(tmp_path):
    options = free_server_options(model_repositories=[FIXTURE_REPOSITORY], models=["echo"], exit_timeout_s=3)
    with TritonServer(options, work_dir=tmp_path) as server:
        watch = LogWatch(server.log_path)
        assert replace_if_aborted(server, watch) is None
        aborted = server.process.pid
        os.kill(aborted, signal.SIGABRT)  # Triton's handler logs "Signal (6) received."
        deadline = time.monotonic() + 30
        while b"Signal (6) received." not in server.log_path.read_bytes():
            assert time.monotonic() < deadline, server.tail_log(40)
            time.sleep(0.2)
        failure = replace_if_aborted(server, watch)
        assert failure is not None and f"pid {aborted}" in failure and "Signal (6) received." in failure
        assert server.process.pid != aborted and server.is_ready()
        assert replace_if_aborted(server, watch) is None  # the line is reported once

