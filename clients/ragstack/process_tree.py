"""A server's process tree: tritonserver, its Python backend stubs (one per model instance) and
their children (the llm's engine process, its tensor-parallel workers).

Read with psutil where it is installed, else from /proc (Linux). The memory of the tree is the
sum of each process's resident set: the stubs' shared-memory regions are counted in the server
and in the stub alike, so the figure is an upper bound, fit for before/after comparisons.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

try:
    import psutil
except ImportError:  # optional: /proc is enough on Linux
    psutil = None

STUB_BINARY = "triton_python_backend_stub"


def descendants(pid: int) -> list[int]:
    """The children of `pid`, their children, and so on."""
    if psutil is not None:
        try:
            return [p.pid for p in psutil.Process(pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                # the command name may hold spaces and parentheses: the fields follow the last ")"
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def cmdline(pid: int) -> list[str]:
    """Empty for a process that is gone or a zombie."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def rss_bytes(pid: int) -> int:
    """Resident memory of one process; 0 if it is gone."""
    if psutil is not None:
        try:
            return psutil.Process(pid).memory_info().rss
        except psutil.NoSuchProcess:
            return 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_rss_bytes(pid: int) -> int:
    return sum(rss_bytes(p) for p in [pid, *descendants(pid)])


@dataclass(frozen=True)
class Stub:
    model: str
    version: str
    instance: str  # Triton's instance name: <model>_<group index>_<index in group>


def server_stubs(server_pid: int) -> dict[int, Stub]:
    """The server's live Python backend stubs by pid. A stub's command line is `triton_python_backend_stub
    <model dir>/<version>/<file> <shm region> <size> <growth> <server pid> <backend dir> <ipc handle>
    <instance name> ...`."""
    found = {}
    for pid in descendants(server_pid):
        args = cmdline(pid)  # empty for a zombie: a dead stub that Triton has not reaped
        if len(args) > 8 and args[0].endswith(STUB_BINARY):
            path = Path(args[1])
            found[pid] = Stub(path.parent.parent.name, path.parent.name, args[8])
    return found


def stub_pids(server_pid: int, instance: str) -> list[int]:
    """The live stubs of one model instance (e.g. `llm_0_0`)."""
    return [pid for pid, stub in server_stubs(server_pid).items() if stub.instance == instance]


def module_pids(root_pid: int, module: str) -> list[int]:
    """The live descendants of `root_pid` that run `python -m <module>`."""
    return [p for p in descendants(root_pid) if _runs_module(cmdline(p), module) and is_alive(p)]


def engine_pids(server_pid: int, instance: str) -> list[int]:
    """The engine process (`llm_engine.engine.engine_process`) that one llm model instance (e.g. `llm_0_0`)
    started: its child."""
    return [p for stub in stub_pids(server_pid, instance) for p in module_pids(stub, "llm_engine.engine.engine_process")]


def model_engine_pids(server_pid: int, model: str) -> list[int]:
    """The live engine processes of one llm model of the server (any version and device), wherever they are
    in the process tree: an engine that several instances share outlives the instance that started it. Its
    command line names them (`... engine_process --model llm/1 --device cpu --server <pid>`)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        args = cmdline(int(entry.name))
        if (_runs_module(args, "llm_engine.engine.engine_process") and _option(args, "--server") == str(server_pid)
                and (_option(args, "--model") or "").rsplit("/", 1)[0] == model and is_alive(int(entry.name))):
            found.append(int(entry.name))
    return found


def _option(args: list[str], name: str) -> str | None:
    return next((b for a, b in zip(args, args[1:]) if a == name), None)


def _runs_module(args: list[str], module: str) -> bool:
    return any(a == "-m" and b == module for a, b in zip(args, args[1:]))


def is_alive(pid: int) -> bool:
    """True unless gone or a zombie (a killed stub stays a zombie until the server reaps it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


class PeakSampler:
    """`with PeakSampler(pid) as peak:` samples the tree's memory every `interval_s` in a thread;
    `peak.bytes` is the largest sample."""

    def __init__(self, pid: int, interval_s: float = 0.25):
        self.pid, self.interval_s, self.bytes = pid, interval_s, tree_rss_bytes(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="rss-sampler")

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.bytes = max(self.bytes, tree_rss_bytes(self.pid))

    def __enter__(self) -> "PeakSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
