"""tests/server_crash.run_test: a test during which the session server aborted runs once more, only its
last run counts, no test runs a third time, the session's reruns are bounded, and the summary lists
every abort, also from pytest-xdist's workers. Run as a pytest session of its own, with conftest hooks that
abort as the marker says."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from server_crash import MAX_RERUNS

TESTS = Path(__file__).resolve().parents[1]

CONFTEST = f'''
import sys
sys.path.insert(0, {str(TESTS)!r})
import pytest
from server_crash import hand_to_controller, run_test, summarize_aborts, take_from_worker

ABORTS, CALLS = [], {{}}

def pytest_configure(config):
    config.addinivalue_line("markers", "aborts(n): the first n runs see the server abort")

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if call.when == "call":
        CALLS[item.name] = CALLS.get(item.name, 0) + 1
        marker = item.get_closest_marker("aborts")
        if marker and CALLS[item.name] <= marker.args[0]:
            report.outcome, report.longrepr = "failed", "the server aborted"
            report.server_abort = f"Signal (6) received. (run {{CALLS[item.name]}} of {{item.name}})"

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    run_test(item, nextitem, ABORTS)
    return True

def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):
        hand_to_controller(session.config, ABORTS)

@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    take_from_worker(node, ABORTS)

def pytest_terminal_summary(terminalreporter):
    summarize_aborts(terminalreporter, ABORTS)
    terminalreporter.write_line(f"CALLS {{sorted(CALLS.items())}}")
'''

TESTS_FILE = '''
import pytest

SETUPS = []

@pytest.fixture(scope="module")
def shared():
    SETUPS.append(1)
    return len(SETUPS)

@pytest.mark.aborts(1)
def test_aborts_once(shared):
    assert shared == 1  # the module's fixture is not set up again for the second run

@pytest.mark.aborts(2)
def test_aborts_in_its_second_run_too(shared):
    pass

@pytest.mark.aborts(1)
def test_aborts_after_the_reruns_are_spent(shared):
    pass

def test_plain(shared):
    pass
'''


def test_an_aborted_test_runs_once_more_and_the_reruns_are_bounded(tmp_path):
    assert MAX_RERUNS == 2, "the cases below spend exactly two reruns"
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_cases.py").write_text(TESTS_FILE)
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "-rA",
                          "test_cases.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = run.stdout
    assert "2 failed, 2 passed" in out, out
    assert "PASSED test_cases.py::test_aborts_once" in out and "PASSED test_cases.py::test_plain" in out, out
    assert "FAILED test_cases.py::test_aborts_in_its_second_run_too" in out, out
    assert "FAILED test_cases.py::test_aborts_after_the_reruns_are_spent" in out, out
    # no test ran a third time; the one past the session's reruns ran once
    assert ("CALLS [('test_aborts_after_the_reruns_are_spent', 1), ('test_aborts_in_its_second_run_too', 2), "
            "('test_aborts_once', 2), ('test_plain', 1)]") in out, out
    assert "the session server aborted 4 time(s)" in out, out
    assert "during test_cases.py::test_aborts_once; the test ran once more, on a fresh server. Signal (6)" in out, out
    assert "run 2 of test_aborts_in_its_second_run_too" in out and "failed on it (no run left)" in out, out


def test_the_summary_lists_the_aborts_of_xdist_workers(tmp_path):
    """`make test` runs two workers: each one's aborts reach the controller's summary."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_cases.py").write_text(TESTS_FILE)
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile",
                          "test_cases.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = run.stdout
    assert "2 failed, 2 passed" in out, out
    assert "the session server aborted 4 time(s)" in out, out
    assert "during test_cases.py::test_aborts_once; the test ran once more, on a fresh server. Signal (6)" in out, out
