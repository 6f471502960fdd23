"""A test server that received a fatal signal: found in its log, and the stacks of the aborting threads.

Triton 2.51 aborts now and then on glibc's heap check (`malloc_consolidate(): unaligned fastbin chunk
detected`, `double free or corruption`: server issues 7517 and 8841 report the same under load), and
its signal handler then hangs while it prints a backtrace: the process lives on and answers nothing, so
every later test against it fails by timeout. The session fixture (conftest.py) checks the log after each
test: the test that saw the abort gets the aborting threads' stacks (gdb, attached to the hung process and
its stubs: where the corruption was found), a fresh server serves the tests after it, and the test runs
once more on it. The abort is upstream's (docs/operations.md), so the second run's outcome is the test's;
the terminal summary lists every abort with its stacks. Past MAX_RERUNS aborts in a session a test fails
on the abort itself: a server that aborts that often is a fault to fix, not a race to wait out.
"""
from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from _pytest.runner import runtestprotocol

from ragstack.fatal_signal import LogWatch

# frames of a thread that is aborting or in Triton's signal handler
ABORTING_FRAME = re.compile(
    r"\b(abort|raise|__libc_message|malloc_printerr|ErrorSignalHandler|__pthread_kill\w*)\b")
GDB_TIMEOUT_S = 60
GDB_PARALLEL = 4
MAX_RERUNS = 2  # aborts in one session that let their test run once more


@dataclass(frozen=True)
class Abort:
    nodeid: str
    failure: str  # what replace_if_aborted said: the signal lines, the log's tail, the stacks
    reran: bool   # the test ran once more; False: it failed on this abort


def aborting_stacks(pid: int, dump: Path) -> str:
    """The stacks of the threads that abort, in the process and its children (the Python stubs); every
    thread's stack goes to `dump`. GDB_PARALLEL at once: for the session server's 20 processes, 29 s on 2
    cores against 36 s one by one."""
    if shutil.which("gdb") is None:
        return "(gdb is not installed: no stacks)"
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    targets = [str(pid), *children]
    with ThreadPoolExecutor(GDB_PARALLEL) as pool:
        outputs = list(pool.map(_stacks_of, targets))
    dump.write_text("\n".join(f"===== pid {target}\n{out}" for target, out in zip(targets, outputs)))
    found = [f"pid {target}: {thread}" for target, out in zip(targets, outputs) for thread in aborting_threads(out)]
    return "\n\n".join(found) or f"(no aborting thread found; every stack: {dump})"


def _stacks_of(pid: str) -> str:
    try:
        return subprocess.run(["gdb", "-p", pid, "-batch", "-nx", "-ex", "set pagination off",
                               "-ex", "thread apply all bt 40"], capture_output=True, text=True,
                              timeout=GDB_TIMEOUT_S).stdout
    except subprocess.TimeoutExpired:
        return f"(gdb timed out after {GDB_TIMEOUT_S} s)"


def aborting_threads(gdb_output: str) -> list[str]:
    """The threads of `thread apply all bt` whose stack aborts or handles a signal."""
    threads = re.split(r"\n(?=Thread \d+ )", "\n" + gdb_output)
    return [t.strip() for t in threads if t.startswith("Thread ") and ABORTING_FRAME.search(t)]


def replace_if_aborted(server, watch: LogWatch) -> str | None:
    """None while the log shows no new fatal signal; else what happened and the aborting threads' stacks,
    once the aborted server is stopped and a fresh one (same ports) is ready."""
    lines = watch.new_fatal_lines()
    if not lines or server.process is None:
        return None
    pid = server.process.pid
    dump = server.work_dir / f"stacks-{pid}.txt"
    stacks = aborting_stacks(pid, dump)
    failure = (f"tritonserver (pid {pid}) logged {lines}; a fresh server replaces it. Its last log lines:\n"
               f"{server.tail_log(40)}\n\nThe aborting threads (gdb; every thread's stack in {dump}):\n{stacks}")
    server.stop()
    watch.offset = server.log_path.stat().st_size  # the aborted server's last lines are skipped
    server.start()
    return failure


def run_test(item, nextitem, aborts: list[Abort]) -> None:
    """pytest's protocol for one test, run once more when a report of it carries `server_abort` (set by
    conftest's report hook once the aborted server is replaced): only the last run's reports count, and
    `aborts` keeps each abort for the summary. A test runs at most twice."""
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    reports = runtestprotocol(item, nextitem=nextitem, log=False)
    while (failure := next((r.server_abort for r in reports if getattr(r, "server_abort", None)), None)):
        rerun = sum(a.reran for a in aborts) < MAX_RERUNS and all(a.nodeid != item.nodeid for a in aborts)
        aborts.append(Abort(item.nodeid, failure, rerun))
        if not rerun:
            break
        reports = runtestprotocol(item, nextitem=nextitem, log=False)
    for report in reports:
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)


def hand_to_controller(config, aborts: list[Abort]) -> None:
    """Under pytest-xdist, at a worker's session finish: its aborts, for the controller's summary."""
    config.workeroutput["server_aborts"] = [dataclasses.astuple(abort) for abort in aborts]


def take_from_worker(node, aborts: list[Abort]) -> None:
    """Under pytest-xdist, as a worker goes down (the controller's pytest_testnodedown): its aborts."""
    aborts.extend(Abort(*fields) for fields in getattr(node, "workeroutput", {}).get("server_aborts", ()))


def summarize_aborts(terminalreporter, aborts: list[Abort]) -> None:
    if not aborts:
        return
    terminalreporter.write_sep("=", f"the session server aborted {len(aborts)} time(s): docs/operations.md", red=True)
    for abort in aborts:
        then = "ran once more, on a fresh server" if abort.reran else "failed on it (no run left)"
        terminalreporter.write_line(f"during {abort.nodeid}; the test {then}. {abort.failure}", red=True)
