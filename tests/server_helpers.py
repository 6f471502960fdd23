"""Shared by the server tests: server options on free ports, the test-only repository, and POSTs to
the HTTP endpoints (the generate endpoint shows an error's status code, which a gRPC stream drops), and
statistics read once the server has counted what it answered, waiting for a condition, a process held
stopped, and the demo llm's checkpoint and token ids, the frontend's token count of a chat, the message of
its 400 naming a field, and a client library's embeddings against the openai SDK's."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from ragstack.launcher import ServerOptions, free_ports

T = TypeVar("T")
FIXTURE_REPOSITORY = Path(__file__).resolve().parent / "fixtures" / "model_repository"
TINY_LLM = Path(__file__).resolve().parents[1] / "model_repository" / "llm" / "1" / "tiny-qwen2"  # ragstack build's


def tiny_llm_ids(text: str) -> list[int]:
    """`text` in the demo llm's token ids, as its tokenizer encodes a prompt."""
    from tokenizers import Tokenizer  # noqa: PLC0415 - the tests that tokenize are few

    return Tokenizer.from_file(str(TINY_LLM / "tokenizer.json")).encode(text, add_special_tokens=False).ids


def chat_prompt_tokens(client, messages: list[dict]) -> int:
    """The frontend's /tokenize count of `messages` (the official `openai` client's), rendered as a chat
    completion renders them: its usage.prompt_tokens."""
    return client.post("/tokenize", body={"model": "llm", "messages": messages}, cast_to=object)["count"]


def invalid_request_message(response, param: str) -> str:
    """The message of the frontend's 400 (an httpx response), which must name `param`."""
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    return error["message"]


def assert_embeddings_as_direct(direct, batch, query, first_two) -> None:
    """A client library's vectors of the 40 texts, of text 3 alone and of the first two (async) equal
    `direct`, the openai SDK's vectors of the same texts."""
    import numpy as np
    assert np.asarray(batch).shape == (40, 384)
    np.testing.assert_allclose(batch, direct, atol=1e-6)
    np.testing.assert_allclose(query, direct[3], atol=1e-6)
    np.testing.assert_allclose(first_two, direct[:2], atol=1e-6)


def free_server_options(openai: bool = False, **overrides) -> ServerOptions:
    """`openai`: the OpenAI frontend too, on a free port of its own."""
    http, grpc, metrics, openai_port = free_ports(4)
    options = ServerOptions(http_port=http, grpc_port=grpc, metrics_port=metrics,
                            openai_port=openai_port if openai else 0, exit_timeout_s=10)
    for key, value in overrides.items():
        setattr(options, key, value)
    return options


def http_post(url: str, path: str, body: dict) -> tuple[int, str]:
    req = urllib.request.Request(f"http://{url}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def settled(read: Callable[[], T], quiet_s: float = 0.5, timeout_s: float = 30.0) -> T:
    """`read()` once two reads `quiet_s` apart agree. Backends report a batch's statistics after sending its
    responses, so a client can hold its answers before the server's counts include them."""
    deadline = time.monotonic() + timeout_s
    value = read()
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        value, previous = read(), value
        if value == previous:
            return value
    raise TimeoutError(f"statistics still changing after {timeout_s} s: last {value!r}")


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Polls `condition()` until it holds; fails naming `what` it waited for."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s} s for {what}")
        time.sleep(0.05)


def _all_threads_stopped(pid: int) -> bool:
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
    return all(state in "tT" for state in states)


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """`pid` held by SIGSTOP, as a wedged process, until the block ends. kill() wakes one thread, which stops
    the others only once it runs: on a loaded machine the rest serve on for a while, so this waits until
    /proc shows every thread stopped."""
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_until(lambda: _all_threads_stopped(pid), f"every thread of process {pid} to stop", 10)
        yield
    finally:
        os.kill(pid, signal.SIGCONT)
