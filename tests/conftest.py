"""One real Triton server for the whole test run, on free ports, stopped at the end."""
from __future__ import annotations

import os
import pytest

from ragstack.launcher import DEFAULT_REPOSITORIES, TritonServer
from server_helpers import FIXTURE_REPOSITORY, free_server_options

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def triton_server(tmp_path_factory):
    """The project's repositories plus the test fixtures' repository; every model loaded at start."""
    options = free_server_options(model_repositories=[*DEFAULT_REPOSITORIES, FIXTURE_REPOSITORY])
    server = TritonServer(options, work_dir=tmp_path_factory.mktemp("triton"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def pytest_terminal_summary(terminalreporter):
    """How many bad-input cases the property-based tests sent (tests/bad_input.py counts them)."""
    from bad_input import TRIED  # noqa: PLC0415 - only when those tests ran

    if TRIED:
        terminalreporter.write_sep("-", f"bad input: {sum(TRIED.values())} cases tried")
        for key, count in sorted(TRIED.items()):
            terminalreporter.write_line(f"  {key}: {count}")
