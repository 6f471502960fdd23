"""Scale-down never drops a stream: SIGTERM to `ragstack serve` (the signal Kubernetes sends a pod's containers
after their preStop hook) while llm streams are open through each door, a gRPC stream to Triton, an HTTP
generate_stream through the gateway and a streamed OpenAI completion through the frontend, and every one of them
runs to its last token and ends once (finish reason "length"), while the gateway and the frontend take no new
connection (Triton's gRPC still serves a new request), and serve exits 0 within the exit timeout. deploy/k8s
sizes preStop, the exit timeouts and the grace period on this path (docs/scaling.md)."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx2 as httpx
import pytest

from llm_streams import StreamSession, llm_inputs
from ragstack.launcher import DEFAULT_REPOSITORIES, free_port
from server_helpers import free_server_options, wait_until

pytestmark = pytest.mark.server
TOKENS = 1200          # long enough to be streaming when the signal comes, short of shutdown_timeout_s (30 s)
EXIT_TIMEOUT_S = 40    # deploy/k8s's
SAMPLING = {"temperature": 0, "ignore_eos": True}


@pytest.fixture
def serve(tmp_path):
    opts, openai_port = free_server_options(), free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "ragstack.cli", "serve", "--model-repository", str(DEFAULT_REPOSITORIES[0]),
         "--models", "llm", "--http-port", str(opts.http_port), "--grpc-port", str(opts.grpc_port),
         "--metrics-port", str(opts.metrics_port), "--openai-port", str(openai_port),
         "--exit-timeout", str(EXIT_TIMEOUT_S)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in process.stdout:
        lines.append(line)
        if "[serve] OpenAI API" in line or process.poll() is not None:
            break
    assert "[serve] OpenAI API" in "".join(lines), "".join(lines)
    try:
        yield process, opts, openai_port
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


class Stream:
    """One stream in a thread: its text pieces, how it ended, and when."""

    def __init__(self, name, run):
        self.name, self.pieces, self.finish, self.finals, self.error = name, [], None, 0, None
        self.ended_at = None
        self.first = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(run,), daemon=True)
        self.thread.start()

    def _run(self, run):
        try:
            run(self)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.error = repr(exc)
        self.ended_at = time.monotonic()
        self.first.set()

    def piece(self, text):
        self.pieces.append(text)
        self.first.set()


def grpc_stream(url):
    def run(stream):
        session = StreamSession(url)
        collected = session.send("drain", llm_inputs("Kubernetes drains pods", sampling=SAMPLING, max_tokens=TOKENS))
        while not collected.done.wait(0.05):
            if collected.texts and not stream.first.is_set():
                stream.piece("")
        stream.pieces[:] = collected.texts
        stream.finish = collected.finish_reasons[-1] if collected.finish_reasons else None
        stream.finals = collected.finals
        stream.error = "; ".join(collected.errors) or None
        session.close()
    return run


def generate_stream(url):
    def run(stream):
        body = {"text_input": "Kubernetes drains pods", "max_tokens": TOKENS, "stream": True,
                "return_finish_reason": True, "sampling_parameters": json.dumps(SAMPLING)}
        with httpx.stream("POST", f"http://{url}/v2/models/llm/generate_stream", json=body, timeout=120) as response:
            assert response.status_code == 200, response.read()
            for line in response.iter_lines():
                if line.startswith("data: "):
                    event = json.loads(line[6:])
                    stream.piece(event.get("text_output", ""))
                    if event.get("finish_reason") not in (None, "", "None"):
                        stream.finish = event["finish_reason"]
                        stream.finals += 1
    return run


def openai_stream(url):
    def run(stream):
        body = {"model": "llm", "prompt": "Kubernetes drains pods", "max_tokens": TOKENS, "stream": True,
                "temperature": 0, "ignore_eos": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
            assert response.status_code == 200, response.read()
            for line in response.iter_lines():
                if line == "data: [DONE]":
                    stream.finals += 1
                elif line.startswith("data: "):
                    choice = json.loads(line[6:])["choices"][0]
                    stream.piece(choice["text"])
                    stream.finish = choice.get("finish_reason") or stream.finish
    return run


def refuses_connections(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", port)) != 0


def test_sigterm_lets_every_open_stream_finish(serve):
    process, opts, openai_port = serve
    streams = [Stream("grpc", grpc_stream(f"127.0.0.1:{opts.grpc_port}")),
               Stream("http generate_stream", generate_stream(f"127.0.0.1:{opts.http_port}")),
               Stream("openai", openai_stream(f"http://127.0.0.1:{openai_port}"))]
    for stream in streams:
        assert stream.first.wait(60), stream.name
    assert [s.name for s in streams if s.ended_at is not None] == [], [s.error for s in streams]

    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    # The HTTP gateway and the OpenAI frontend stop accepting at once; the streams go on.
    wait_until(lambda: refuses_connections(opts.http_port) and refuses_connections(openai_port),
               "the gateway and the OpenAI frontend to stop listening", 10)
    # Triton itself goes on serving gRPC while it drains: a client whose connection still reaches this pod (the
    # balancer has not seen it leave) is served, not refused.
    late = StreamSession(f"127.0.0.1:{opts.grpc_port}")
    collected = late.send("late", llm_inputs("a request after the signal", sampling=SAMPLING, max_tokens=5))
    assert collected.done.wait(30) and collected.finish_reasons == ["length"] and not collected.errors, collected
    late.close()
    for stream in streams:
        stream.thread.join(EXIT_TIMEOUT_S + 20)
    rest = process.communicate(timeout=EXIT_TIMEOUT_S + 30)[0]
    exited = time.monotonic() - signalled

    for stream in streams:
        assert stream.error is None, (stream.name, stream.error, rest[-2000:])
        assert stream.finish == "length" and stream.finals == 1, (stream.name, stream.finish, stream.finals)
        assert stream.ended_at > signalled, stream.name               # it was still streaming at the signal
    # Greedy and the same prompt: each door got the whole answer, the same one.
    texts = {stream.name: "".join(stream.pieces) for stream in streams}
    assert len(set(texts.values())) == 1, texts
    assert process.returncode == 0 and "[serve] stopped" in rest, rest[-2000:]
    assert exited < EXIT_TIMEOUT_S, exited
    print(f"streams ended {[round(s.ended_at - signalled, 1) for s in streams]} s after SIGTERM; "
          f"serve exited after {exited:.1f} s")
