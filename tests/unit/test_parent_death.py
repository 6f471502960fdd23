"""parent_death.py: the command runs in the child's own pid (exec, not a further child) and gets
SIGTERM when the process that started it dies, even by SIGKILL."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from ragstack import process_tree

STARTER = ("import subprocess, time; from ragstack.parent_death import dying_with_parent; "
           "child = subprocess.Popen(dying_with_parent(['sleep', '60'])); print(child.pid, flush=True); time.sleep(60)")


def wait_for(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_the_command_gets_sigterm_when_its_starter_is_killed():
    starter = subprocess.Popen([sys.executable, "-c", STARTER], stdout=subprocess.PIPE, text=True)
    try:
        child = int(starter.stdout.readline())
        cmdline = Path(f"/proc/{child}/cmdline")
        assert wait_for(lambda: cmdline.read_bytes().split(b"\0")[0] == b"sleep"), cmdline.read_bytes()
        starter.kill()
        starter.wait(timeout=10)
        assert wait_for(lambda: not process_tree.is_alive(child)), f"sleep {child} outlived its starter"
    finally:
        starter.kill()
        starter.wait(timeout=10)
