"""Shared fixtures: one real Triton server for the whole test run (one per pytest-xdist worker: `make test`
runs two; free ports, stopped at the end), and a tiny cross-encoder with a scratch repository to export it
into.

The tiers: unit/ and engine/ (`make test-fast`: no server), server/ (the session server and servers of
their own), faults/ (killed processes, overload, load cycles). The server packages are imported in the
fixtures that need them, so the engine tests also run where they are not installed (a GPU machine).
"""
from __future__ import annotations

import collections
import os
import shutil
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1] / "model_repository"
_SESSION_SERVER: list = []  # [the session's TritonServer, the LogWatch of its log] while it serves
_SERVER_ABORTS: list = []   # server_crash.Abort: each abort of the session server, for the summary
_WORKERS_BAD_INPUT = (collections.Counter(), collections.Counter())  # the xdist workers' bad_input counts

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Under pytest-xdist (`make test`, `make test-fast`) each worker gets its share of the cores for torch's threads. Left
# at one thread per core, every worker's OpenMP team spans all cores, and its barriers stall whenever
# another worker holds one: on 2 cores with 2 workers a tiny model's decode steps took 5 s that take
# 0.08 s alone, and the fast tier ran 86 s instead of 60 (the engine process sizes its threads for the
# same reason: llm_engine/engine/engine_process.py, torch_threads). Read before torch is imported.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // _WORKERS)))
    if "torch" in sys.modules:  # imported by a plugin before this file: too late for the variable
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session")
def triton_server(tmp_path_factory):
    """The project's repositories plus the test fixtures' repository; every model loaded at start; the
    OpenAI frontend beside it (`openai_url`)."""
    from ragstack.launcher import DEFAULT_REPOSITORIES, TritonServer
    from ragstack.fatal_signal import LogWatch
    from server_helpers import FIXTURE_REPOSITORY, free_server_options

    options = free_server_options(openai=True, model_repositories=[*DEFAULT_REPOSITORIES, FIXTURE_REPOSITORY])
    server = TritonServer(options, work_dir=tmp_path_factory.mktemp("triton"))
    server.start()
    _SESSION_SERVER[:] = [server, LogWatch(server.log_path)]
    try:
        yield server
    finally:
        _SESSION_SERVER.clear()
        server.stop()


@pytest.fixture(scope="session")
def tiny_cross_encoder(tmp_path_factory) -> Path:
    """A randomly initialised BertForSequenceClassification with MiniLM's vocabulary."""
    from ragstack.tiny_checkpoints import write_tiny_cross_encoder

    return write_tiny_cross_encoder(tmp_path_factory.mktemp("tiny-cross-encoder"))


@pytest.fixture()
def repository(tmp_path) -> Path:
    """A scratch repository with the project's reranker config: a cross-encoder must fit it."""
    (tmp_path / "reranker").mkdir()
    shutil.copy(REPOSITORY / "reranker" / "config.pbtxt", tmp_path / "reranker" / "config.pbtxt")
    return tmp_path


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test shows its server's last log lines, whether the server exited or still runs (a
    request that timed out): CI keeps no log files. After each test, a fatal signal in the session server's
    log since the last one fails that test with the aborting threads' stacks, a fresh server serves the
    rest, and pytest_runtest_protocol runs the test once more (tests/server_crash.py says why)."""
    report = (yield).get_result()
    if report.failed:
        for value in getattr(item, "funcargs", {}).values():
            if type(value).__name__ == "TritonServer" and value.process is not None:
                code = value.process.poll()
                title = "tritonserver still running" if code is None else f"tritonserver exited with code {code}"
                report.sections.append((f"{title}: its last log lines", value.tail_log(40)))
    if call.when == "call" and _SESSION_SERVER:
        from server_crash import replace_if_aborted

        failure = replace_if_aborted(*_SESSION_SERVER)
        if failure is not None:
            report.outcome = "failed"
            report.longrepr = f"during this test, the session's {failure}"
            report.server_abort = failure


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """A test on the session server runs once more if the server aborted during it (server_crash.run_test)."""
    if "triton_server" not in getattr(item, "fixturenames", ()):
        return None
    from server_crash import run_test

    run_test(item, nextitem, _SERVER_ABORTS)
    return True


def pytest_sessionfinish(session):
    """Under pytest-xdist (`make test`) a worker hands its session server's aborts and its bad-input counts
    to the controller, whose terminal summary lists them."""
    if not hasattr(session.config, "workeroutput"):
        return
    from server_crash import hand_to_controller

    hand_to_controller(session.config, _SERVER_ABORTS)
    bad_input = sys.modules.get("bad_input")
    if bad_input is not None:
        session.config.workeroutput["bad_input"] = [dict(bad_input.TRIED), dict(bad_input.UNANSWERED)]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """The controller's side of pytest_sessionfinish: a worker's aborts and counts, added to its own."""
    from server_crash import take_from_worker

    take_from_worker(node, _SERVER_ABORTS)
    for total, counts in zip(_WORKERS_BAD_INPUT, getattr(node, "workeroutput", {}).get("bad_input", ())):
        total.update(counts)


def pytest_terminal_summary(terminalreporter):
    """The session server's aborts, and how many bad-input cases the property-based tests sent
    (tests/bad_input.py counts them)."""
    if _SERVER_ABORTS:
        from server_crash import summarize_aborts

        summarize_aborts(terminalreporter, _SERVER_ABORTS)
    tried, unanswered = (collections.Counter(counts) for counts in _WORKERS_BAD_INPUT)
    bad_input = sys.modules.get("bad_input")  # imported only by the tests that send bad input
    if bad_input is not None:
        tried.update(bad_input.TRIED)
        unanswered.update(bad_input.UNANSWERED)
    if tried:
        terminalreporter.write_sep("-", f"bad input: {sum(tried.values())} cases tried")
        for key, count in sorted(tried.items()):
            terminalreporter.write_line(f"  {key}: {count}")
        if unanswered:
            from bad_input import REQUEST_TIMEOUT_S

            for model, count in sorted(unanswered.items()):
                terminalreporter.write_line(f"  {model}: {count} request(s) unanswered in {REQUEST_TIMEOUT_S} s, "
                                            "sent again (the server never answered them)", red=True)
