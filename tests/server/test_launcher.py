"""The launcher fails clearly on bad input, stops cleanly, and leaves no process behind."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from server_helpers import FIXTURE_REPOSITORY, free_server_options, wait_until
from ragstack.launcher import SHM_DIR, LauncherError, TritonServer, find_server_install, port_is_free


def processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line contains `text` (the server's work dir is in its arguments)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return [p for p in pids if p != os.getpid()]


def assert_no_process_left(work_dir: Path) -> None:
    deadline = time.monotonic() + 10
    while processes_mentioning(str(work_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_mentioning(str(work_dir)) == []


def start_expecting_failure(tmp_path: Path, **overrides) -> str:
    server = TritonServer(free_server_options(**overrides), work_dir=tmp_path / "work")
    with pytest.raises(LauncherError) as info:
        server.start()
    assert_no_process_left(tmp_path / "work")
    return str(info.value)


def test_missing_repository(tmp_path):
    message = start_expecting_failure(tmp_path, model_repositories=[tmp_path / "nope"])
    assert "model repository" in message and "does not exist" in message


def test_port_in_use(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        message = start_expecting_failure(tmp_path, model_repositories=[FIXTURE_REPOSITORY], grpc_port=port)
    assert f"gRPC port {port} is already in use" in message


def test_two_servers_on_one_port_are_refused_before_anything_starts(tmp_path):
    port = free_server_options().http_port
    message = start_expecting_failure(tmp_path, model_repositories=[FIXTURE_REPOSITORY], http_port=port,
                                      openai_port=port)
    assert message == f"--http-port and --openai-port are both {port}; give each its own port"


def test_an_ipv6_address_is_refused_and_an_address_not_here_is_not_a_port_in_use(tmp_path):
    message = start_expecting_failure(tmp_path, model_repositories=[FIXTURE_REPOSITORY], address="::")
    assert message.startswith("--address ::: an IPv6 address is not supported")
    with pytest.raises(LauncherError, match="cannot bind 192.0.2.1 port"):   # TEST-NET-1: no address of this host
        port_is_free("192.0.2.1", free_server_options().http_port)


def test_no_stub_for_this_python(tmp_path, monkeypatch):
    real = find_server_install()
    fake = tmp_path / "triton"
    (fake / "bin").mkdir(parents=True)
    (fake / "bin" / "tritonserver").symlink_to(real.server_bin)
    shutil.copytree(real.python_backend, fake / "backends" / "python")
    (fake / "python_backend_stubs" / "3.0").mkdir(parents=True)
    monkeypatch.setenv("TRITONSERVER_DIR", str(fake))
    monkeypatch.setenv("TRITONSERVER_LIBS", str(real.lib_dir))
    message = start_expecting_failure(tmp_path, model_repositories=[FIXTURE_REPOSITORY])
    py = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert f"no Python backend stub for Python {py}" in message and "3.0" in message


def test_broken_config_fails_with_server_log(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(FIXTURE_REPOSITORY / "echo", repo / "broken")
    (repo / "broken" / "config.pbtxt").write_text('name: "broken"\nbackend: "python"\ninput [ { name: ')
    message = start_expecting_failure(tmp_path, model_repositories=[repo])
    assert "exited with code" in message
    assert "broken" in message  # the server's own log lines name the model that failed


def test_load_of_an_unchanged_python_model_does_not_reload_it(tmp_path):
    """A model never served before has no bytecode: the launcher compiles it, so the stub writes no
    __pycache__ into the model's directory and Triton sees the model unchanged."""
    repo = tmp_path / "repo"
    shutil.copytree(FIXTURE_REPOSITORY / "echo", repo / "echo", ignore=shutil.ignore_patterns("__pycache__"))
    with TritonServer(free_server_options(model_repositories=[repo], models=["echo"]), work_dir=tmp_path / "work") as s:
        client = httpclient.InferenceServerClient(s.http_url)
        client.load_model("echo")
        client.close()
        assert s.log_path.read_text().count("successfully loaded 'echo'") == 1


def test_a_killed_server_leaves_no_shared_memory_and_starts_again_in_its_work_dir(tmp_path):
    server = TritonServer(free_server_options(model_repositories=[FIXTURE_REPOSITORY], models=["echo"]),
                          work_dir=tmp_path / "work")
    server.start()
    try:
        assert list(SHM_DIR.glob(f"{server.shm_prefix}*"))  # the echo stub's regions
        os.killpg(server.process.pid, signal.SIGKILL)  # nothing of the server can clean up
        server.process.wait()
        server.stop()
        assert not list(SHM_DIR.glob(f"{server.shm_prefix}*"))
        server.start()  # the same work dir: its backend directory is assembled again
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.is_model_ready("echo")
        client.close()
    finally:
        server.stop()


def start_serve(opts, *flags: str) -> tuple[subprocess.Popen, Path]:
    """`ragstack serve` on the fixtures' repository and `opts`' ports, once it says it is ready; and its
    server's log."""
    cmd = [sys.executable, "-m", "ragstack.cli", "serve", "--model-repository", str(FIXTURE_REPOSITORY),
           "--http-port", str(opts.http_port), "--grpc-port", str(opts.grpc_port),
           "--metrics-port", str(opts.metrics_port), *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "[serve] ready" in line:
            break
    assert "[serve] ready" in "".join(lines), "".join(lines)
    log = Path(next(line.split("log: ")[1].strip() for line in lines if "log: " in line))
    return proc, log


def test_serve_stops_on_sigterm_after_in_flight_request(tmp_path):
    """`ragstack serve` under SIGTERM: a request already running still gets its answer."""
    opts = free_server_options()
    proc, log = start_serve(opts, "--exit-timeout", "20")

    client = httpclient.InferenceServerClient(f"127.0.0.1:{opts.http_port}", network_timeout=30)
    data = np.ones((1, 2), dtype=np.float32)
    inp = httpclient.InferInput("INPUT", [1, 2], "FP32")
    inp.set_data_from_numpy(data)
    result = {}
    worker = threading.Thread(target=lambda: result.update(
        out=client.infer("echo", [inp], parameters={"delay_s": 2}).as_numpy("OUTPUT")))
    worker.start()
    wait_until(lambda: "echo: holding a request" in log.read_text(), "the request to reach the model")
    proc.send_signal(signal.SIGTERM)
    worker.join(30)
    rest = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, rest
    np.testing.assert_array_equal(result["out"], data)
    assert "[serve] stopped" in rest
    assert_no_process_left(log.parent)


def test_serve_kills_a_server_that_logged_a_crash_and_exits_1(tmp_path):
    """Triton 2.51's crash handler can hang after its line (ragstack.fatal_signal): `ragstack serve` kills
    the server at once, without a drain that the hung server would not hear, and exits 1 for its supervisor."""
    proc, log = start_serve(free_server_options(), "--models", "echo", "--openai-port", "0")
    crashed_at = log.stat().st_size
    with open(log, "ab") as f:  # as Triton's handler logs it before it hangs
        f.write(b"malloc_consolidate(): unaligned fastbin chunk detected\nSignal (6) received.\n")
    rest = proc.communicate(timeout=60)[0]
    assert proc.returncode == 1, rest
    assert "[serve] unexpectedly, tritonserver logged ['Signal (6) received.']" in rest, rest
    assert b"Signal (2) received." not in log.read_bytes()[crashed_at:], "it was asked to drain, not killed"
    assert_no_process_left(log.parent)
