"""Children that get SIGTERM when their parent dies, even by SIGKILL (Linux's PR_SET_PDEATHSIG), set
without a preexec_fn. A preexec_fn makes subprocess fork() where it would vfork(), and fork() runs the
parent's at-fork handlers in the child: gRPC's handlers restart its poller there, which then aborts the
child (`epoll_wait error: Bad file descriptor`, exit -6) when subprocess closes the inherited
descriptors before exec. Instead the child runs this file, which sets the signal and execs the
command: same pid, no fork."""
from __future__ import annotations

import os
import sys


def dying_with_parent(command: list[str]) -> list[str]:
    """`command` run so that it gets SIGTERM when this process (the thread that starts it) dies."""
    # -S: this file needs no site-packages; it starts in some 10 ms.
    return [sys.executable, "-S", os.path.abspath(__file__), str(os.getpid()), *command]


def _exec(parent_pid: int, command: list[str]) -> None:
    import ctypes
    import signal

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # the parent died before the signal was set
        sys.exit(f"{command[0]}: not started, its parent {parent_pid} has exited")
    os.execvp(command[0], command)


if __name__ == "__main__":
    _exec(int(sys.argv[1]), sys.argv[2:])
