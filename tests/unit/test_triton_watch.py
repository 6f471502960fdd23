"""ragstack.triton_watch: the server's output passed through and its exit code kept; after a crash line,
a server still running at the end of the grace period is killed with its process group and the watch
exits 128 + the signal; a stop's line is no crash; SIGTERM reaches the server."""
from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time

from ragstack.triton_watch import http_url, watch


def test_output_and_exit_code_pass_through():
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    out = io.BytesIO()
    assert watch(["sh", "-c", "echo 'I1206 ready'; echo 'Signal (15) received.'; exit 3"], 5, out) == 3
    assert out.getvalue() == b"I1206 ready\nSignal (15) received.\n"
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == handlers  # the caller's, back


def test_a_server_hung_after_a_crash_line_is_killed_with_its_group(tmp_path):
    pid_file = tmp_path / "child.pid"
    script = f"sleep 60 & echo $! > {pid_file}; echo 'Signal (11) received.'; echo ' 0# backtrace'; wait"
    out = io.BytesIO()
    began = time.monotonic()
    assert watch(["sh", "-c", script], 0.5, out) == 128 + 11
    assert time.monotonic() - began < 10
    text = out.getvalue().decode()
    assert text.startswith("Signal (11) received.\n") and "killed with its process group" in text, text
    child = int(pid_file.read_text())
    time.sleep(0.2)
    assert subprocess.run(["ps", "-o", "stat=", "-p", str(child)], capture_output=True, text=True).stdout.strip() \
        in ("", "Z"), "the server's own child outlived the kill"


def test_a_server_that_exits_after_its_crash_line_keeps_its_code():
    assert watch(["sh", "-c", "echo 'Signal (6) received.'; exit 134"], 5, io.BytesIO()) == 134


def test_sigterm_is_passed_on_to_the_server():
    script = "trap 'echo drained; exit 7' TERM; echo ready; while true; do sleep 0.05; done"
    proc = subprocess.Popen([sys.executable, "-m", "ragstack.triton_watch", "--", "sh", "-c", script],
                            stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"ready\n"
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=10) == 7 and proc.stdout.read() == b"drained\n"


def test_a_missing_command_is_refused():
    proc = subprocess.run([sys.executable, "-m", "ragstack.triton_watch", "--grace-s", "3"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "the server's command is missing" in proc.stderr


def test_the_stub_watch_finds_tritons_own_http_port_in_its_flags():
    assert http_url(["tritonserver", "--model-repository=/m"]) == "127.0.0.1:8000"
    assert http_url(["tritonserver", "--http-port=8080", "--http-address=0.0.0.0"]) == "127.0.0.1:8080"
    assert http_url(["tritonserver", "--http-port", "9999", "--http-address", "10.0.0.2"]) == "10.0.0.2:9999"
