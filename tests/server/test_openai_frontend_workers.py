"""`python -m ragstack.openai_frontend --openai-workers 2` on the session server's gRPC port: concurrent
requests (the openai client and raw HTTP) answered by both workers, /metrics adding up every worker's
counts, SIGTERM to the supervisor ending the workers and freeing the port, a killed worker replaced while
the other serves on, and max_inflight holding for the workers together."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from openai import OpenAI
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from ragstack import process_tree
from ragstack.launcher import free_port
from raw_http import exchange, request_bytes
from server_helpers import settled, wait_until

pytestmark = pytest.mark.server
WORKERS = 2
PARALLEL = 8
TIGHT = 2   # max_inflight a worker
REQUESTS = "ragstack_openai_requests_total"
HELLO = [{"role": "user", "content": "Hello"}]


@dataclass
class Frontend:
    process: subprocess.Popen
    port: int
    workers: list[int]
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text()


@pytest.fixture()
def frontend(triton_server, tmp_path):
    yield from _frontend(triton_server, tmp_path)


@pytest.fixture()
def tight_frontend(triton_server, tmp_path):
    yield from _frontend(triton_server, tmp_path, "--openai-max-inflight", str(TIGHT))


def _frontend(triton_server, tmp_path, *extra: str):
    port, log = free_port(), tmp_path / "openai.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "ragstack.openai_frontend", "--listen", f"127.0.0.1:{port}",
             "--triton", triton_server.grpc_url, "--openai-workers", str(WORKERS), "--exit-timeout", "5", *extra],
            stdout=out, stderr=subprocess.STDOUT)
    started = Frontend(process, port, [], log)
    try:
        deadline = time.monotonic() + 60
        # Every worker serving before any is asked for anything: one answering /health says nothing of the
        # other, which may still be importing (and a SIGTERM then ends it before uvicorn's handler).
        while started.output().count("[openai] serving the OpenAI API") < WORKERS or not _healthy(started.url):
            assert process.poll() is None and time.monotonic() < deadline, \
                f"the frontend did not start:\n{started.output()}"
            time.sleep(0.1)
        match = re.search(rf"\[openai\] {WORKERS} workers \(pids ([\d, ]+)\)", started.output())
        assert match, started.output()
        started.workers = [int(p) for p in match.group(1).split(", ")]
        assert sorted(started.workers) == sorted(process_tree.module_pids(process.pid, "ragstack.openai_frontend"))
        yield started
    finally:
        for pid in [process.pid, *started.workers]:
            if process_tree.is_alive(pid):
                os.kill(pid, signal.SIGKILL)
        process.wait(timeout=30)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def requests_counted(text: str) -> dict[str, float]:
    """ragstack_openai_requests_total by endpoint, summed over models, from an exposition's text."""
    counted: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(REQUESTS + "{"):
            endpoint = re.search(r'endpoint="([^"]*)"', line).group(1)
            counted[endpoint] = counted.get(endpoint, 0) + float(line.rsplit(" ", 1)[1])
    return counted


def scraped(frontend: Frontend) -> dict[str, float]:
    return requests_counted(urllib.request.urlopen(f"{frontend.url}/metrics", timeout=10).read().decode())


def per_worker(frontend: Frontend) -> dict[int, float]:
    """Each worker's own count of the API's requests (/health aside): read from the counter file it writes
    to the supervisor's metrics folder (prometheus_client's multiprocess mode names it by the pid)."""
    environ = Path(f"/proc/{frontend.workers[0]}/environ").read_bytes().split(b"\0")
    [folder] = [Path(v.split(b"=", 1)[1].decode()) for v in environ if v.startswith(b"PROMETHEUS_MULTIPROC_DIR=")]
    counts = {}
    for pid in frontend.workers:
        with tempfile.TemporaryDirectory() as one:
            if (folder / f"counter_{pid}.db").exists():
                os.symlink(folder / f"counter_{pid}.db", Path(one) / f"counter_{pid}.db")
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=one)
            counts[pid] = sum(s.value for m in registry.collect() for s in m.samples
                              if s.name == REQUESTS and s.labels["endpoint"] != "/health")
    return counts


def test_both_workers_answer_concurrent_requests_and_metrics_add_up(frontend):
    sent = {"/v1/chat/completions": 0, "/v1/models": 0, "/v1/embeddings": 0}

    def chat(i: int) -> str:   # a client (a connection) of its own each: accepted by whichever worker
        with OpenAI(base_url=f"{frontend.url}/v1", api_key="unused", max_retries=0, timeout=60) as client:
            completion = client.chat.completions.create(model="llm", messages=HELLO, max_tokens=2, seed=i)
            assert [m.id for m in client.models.list().data]
            return completion.choices[0].finish_reason

    def embed(i: int) -> int:   # raw HTTP, one connection per request
        status, _, body = exchange(f"127.0.0.1:{frontend.port}", "POST", "/v1/embeddings",
                                   json.dumps({"model": "embed", "input": [f"text {i}"]}).encode(),
                                   {"Content-Type": "application/json"})
        assert status == 200, body
        return len(json.loads(body)["data"][0]["embedding"])

    started = time.monotonic()
    with ThreadPoolExecutor(PARALLEL) as pool:
        assert set(pool.map(chat, range(PARALLEL))) <= {"length", "stop"}
        sent["/v1/chat/completions"] += PARALLEL
        sent["/v1/models"] += PARALLEL
        # Which worker accepts a connection is the kernel's choice: more rounds of cheap requests until
        # both have answered some (one round almost always does).
        for _ in range(20):
            if all(settled(lambda: per_worker(frontend), quiet_s=0.1).values()):
                break
            assert set(pool.map(embed, range(PARALLEL))) == {384}
            sent["/v1/embeddings"] += PARALLEL
    print(f"{sum(sent.values())} requests in {time.monotonic() - started:.1f} s; per worker {per_worker(frontend)}")

    counts = settled(lambda: per_worker(frontend), quiet_s=0.2)
    assert all(counts.values()), f"a worker answered nothing: {counts}"
    expected = {endpoint: n for endpoint, n in sent.items() if n}
    totals = settled(lambda: scraped(frontend), quiet_s=0.2)
    totals.pop("/health", None)   # the fixture's /health polls
    assert totals == expected, "/metrics must count every request once, whichever worker answered it"
    assert sum(counts.values()) == sum(expected.values())
    for _ in range(4):   # the sums whichever worker answers the scrape
        assert {k: v for k, v in scraped(frontend).items() if k != "/health"} == expected
    # and each worker's own count, by its pid: how the connections were spread
    text = urllib.request.urlopen(f"{frontend.url}/metrics", timeout=10).read().decode()
    own = {int(m.group(1)): float(m.group(2)) for m in re.finditer(
        r'^ragstack_openai_worker_requests\{pid="(\d+)"\} (\S+)$', text, re.MULTILINE)}
    assert own == {pid: n for pid, n in counts.items()}, text
    assert all(process_tree.is_alive(pid) for pid in frontend.workers)


def test_sigterm_to_the_supervisor_ends_the_workers_and_frees_the_port(frontend):
    with OpenAI(base_url=f"{frontend.url}/v1", api_key="unused", max_retries=0, timeout=60) as client:
        assert client.models.list().data
    environ = Path(f"/proc/{frontend.workers[0]}/environ").read_bytes().split(b"\0")
    [folder] = [Path(v.split(b"=", 1)[1].decode()) for v in environ if v.startswith(b"PROMETHEUS_MULTIPROC_DIR=")]
    assert folder.is_dir()
    started = time.monotonic()
    frontend.process.send_signal(signal.SIGTERM)
    assert frontend.process.wait(timeout=15) == 0, frontend.output()
    took = time.monotonic() - started
    assert not any(process_tree.is_alive(pid) for pid in frontend.workers), frontend.output()
    assert took < 10, f"SIGTERM took {took:.1f} s"
    assert not folder.exists(), "the metrics folder outlived the supervisor"
    with socket.create_server(("127.0.0.1", frontend.port)):   # as the supervisor binds it
        pass
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", frontend.port), timeout=2).close()


def test_a_killed_worker_is_replaced_and_the_frontend_serves_on(frontend):
    victim, other = frontend.workers
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: re.search(rf"\[openai\] worker {victim} exited with code -9; started (\d+) in its place",
                                 frontend.output()), "a worker in the victim's place", timeout_s=15)
    replacement = int(re.search(rf"worker {victim} exited with code -9; started (\d+)", frontend.output()).group(1))
    wait_until(lambda: frontend.output().count("[openai] serving the OpenAI API") > WORKERS,
               "the replacement to serve", timeout_s=60)
    assert frontend.process.poll() is None and process_tree.is_alive(other)
    assert sorted(process_tree.module_pids(frontend.process.pid, "ragstack.openai_frontend")) == \
        sorted([other, replacement])
    # The replacement accepts on the shared socket: every connection is answered.
    with ThreadPoolExecutor(PARALLEL) as pool:
        statuses = list(pool.map(lambda _: exchange(f"127.0.0.1:{frontend.port}", "GET", "/v1/models")[0], range(32)))
    assert statuses == [200] * 32


def test_max_inflight_holds_for_the_workers_together_wherever_the_connections_land(tight_frontend):
    """The kernel gives a burst of new connections to whichever worker is awake (often one takes them all):
    the workers admit WORKERS x max_inflight requests together, and refuse the next whichever worker has it."""
    body = json.dumps({"model": "llm", "messages": HELLO, "max_tokens": 1500, "ignore_eos": True,
                       "stream": True}).encode()
    streams = []
    try:
        for _ in range(WORKERS * TIGHT):
            sock = socket.create_connection(("127.0.0.1", tight_frontend.port), timeout=30)
            sock.sendall(request_bytes("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"}))
            assert sock.recv(64).startswith(b"HTTP/1.1 200"), "admitted while the others run"
            streams.append(sock)
        status, headers, answer = exchange(f"127.0.0.1:{tight_frontend.port}", "POST", "/v1/chat/completions",
                                           body, {"Content-Type": "application/json"})
        assert status == 503 and headers["retry-after"] == "1", answer
        assert f"{WORKERS * TIGHT} requests in flight, the limit (max_inflight)" in json.loads(answer)["error"][
            "message"]
    finally:
        for sock in streams:
            sock.close()
    wait_until(lambda: exchange(f"127.0.0.1:{tight_frontend.port}", "POST", "/v1/chat/completions",
                                json.dumps({"model": "llm", "messages": HELLO, "max_tokens": 2}).encode(),
                                {"Content-Type": "application/json"})[0] == 200,
               "the places to be free again", timeout_s=30)
