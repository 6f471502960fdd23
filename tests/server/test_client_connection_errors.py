"""The CLI's answer to a connection mistake is one line naming the likely cause and the fix, exit code 1,
no traceback: a protocol spoken to the other protocol's port (the gateway's HTTP port, Triton's own HTTP
port, the metrics port, the gRPC port), a closed port, a port that expects TLS, a host that does not
resolve. And `models list` shows a model whose load failed in one line (the exception), `models show`
its whole reason. A server of its own: a scratch repository with `echo` and two llm models that fail to
load (no checkpoint; an engine process that exits while starting, its traceback quoted in the reason).
"""
from __future__ import annotations

import json
import re
import shutil
import socket
import ssl
import subprocess
import sys
import threading

import pytest

from ragstack.cli import main
from ragstack.launcher import ROOT, TritonServer, free_port
from ragstack.reachability import explain
from server_helpers import FIXTURE_REPOSITORY, free_server_options

pytestmark = pytest.mark.server
LLM = ROOT / "model_repository" / "llm"


def broken_llm(repo, name: str, engine: dict | None = None) -> None:
    """repo/name: the llm's config renamed; version 1 without its checkpoint, or with `engine` as engine.json."""
    (repo / name / "1").mkdir(parents=True)
    config = re.sub(r'^name: ".*"', f'name: "{name}"', (LLM / "config.pbtxt").read_text(), flags=re.M)
    (repo / name / "config.pbtxt").write_text(config)
    if engine is not None:
        (repo / name / "1" / "engine.json").write_text(json.dumps(engine))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("broken-llm-repository")
    shutil.copytree(FIXTURE_REPOSITORY / "echo", repo / "echo")
    broken_llm(repo, "missing_checkpoint")
    broken_llm(repo, "engine_fails", {"model": str(LLM / "1" / "tiny-qwen2"), "device": "cpu", "num_kv_blocks": 10**9})
    options = free_server_options(model_repositories=[repo], models=["echo"])
    with TritonServer(options, work_dir=tmp_path_factory.mktemp("triton-client-errors")) as s:
        yield s


@pytest.fixture(scope="module")
def tls_port(tmp_path_factory):
    """A port that expects TLS (a self-signed certificate), as an HTTPS proxy in front of a server would."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    folder = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-keyout", str(folder / "key.pem"), "-out", str(folder / "cert.pem")], check=True,
                   capture_output=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "cert.pem", folder / "key.pem")
    listener = socket.create_server(("127.0.0.1", 0))

    def handshake(conn):
        try:
            with context.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1024)
        except (OSError, ssl.SSLError):
            conn.close()

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed: the module is done
                return
            threading.Thread(target=handshake, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1]
    listener.close()


def run(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


COMMANDS = [("models", "list"), ("query", "What is paged attention?"), ("embed", "paged attention")]


def one_line_error(capsys, command: tuple[str, str], url: str, protocol: str) -> str:
    """The message of a command that must fail with one line on stderr, UNAVAILABLE, exit code 1."""
    code, out, err = run(capsys, *command, "--url", url, "--protocol", protocol)
    prefix = f"ragstack {command[0]}: error: [UNAVAILABLE] "
    assert (code, out, err.count("\n")) == (1, "", 1) and err.startswith(prefix), err
    return err[len(prefix):].strip()


@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_http_to_the_grpc_port(capsys, server, command):
    assert one_line_error(capsys, command, server.grpc_url, "http") == (
        f"nothing answers HTTP at {server.grpc_url} — it speaks gRPC, so it is likely the server's gRPC port; "
        "use --protocol grpc, or the HTTP port (8000 by default)")


@pytest.mark.parametrize("port", ["gateway", "triton_http", "metrics"])
@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_grpc_to_an_http_port(capsys, server, command, port):
    url = {"gateway": server.http_url, "triton_http": server.triton_http_url,
           "metrics": server.metrics_url.split("/")[2]}[port]
    assert one_line_error(capsys, command, url, "grpc") == (
        f"nothing answers gRPC at {url} — it speaks HTTP, so it is likely the server's HTTP port (or its metrics "
        "port); use --protocol http, or the gRPC port (8001 by default)")


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_a_closed_port(capsys, command, protocol):
    url = f"127.0.0.1:{free_port()}"
    assert one_line_error(capsys, command, url, protocol).startswith(
        f"nothing listens at {url} (connection refused) — the server is not running there (start it with "
        "`ragstack serve`), or --url (or $RAGSTACK_URL) names the wrong host or port")


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_a_port_that_expects_tls(capsys, tls_port, command, protocol):
    where, scheme = f"127.0.0.1:{tls_port}", {"grpc": "grpcs", "http": "https"}[protocol]
    assert one_line_error(capsys, command, where, protocol).startswith(
        f"{where} expects TLS, and the client connects without it — connect with TLS: {scheme}://{where} in "
        "--url (or $RAGSTACK_URL) (or --ssl), with --ssl-ca FILE when a private CA signed its certificate")


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_host_that_does_not_resolve(capsys, protocol):
    message = one_line_error(capsys, ("models", "list"), "no-such-host.invalid:8001", protocol)
    assert message.startswith("cannot resolve the host 'no-such-host.invalid'") and "check the host name" in message


def test_a_self_signed_certificate_is_not_accepted(capsys, tls_port):
    """TLS asked for (tests/server/test_client_tls.py has the rest) to a certificate nobody signed."""
    where = f"127.0.0.1:{tls_port}"
    assert one_line_error(capsys, ("models", "list"), f"https://{where}", "http").startswith(
        f"the TLS certificate of {where} is not accepted (self-signed certificate) — give the CA that signed it")


def test_the_probe_leaves_a_servers_own_errors_alone(server):
    """Over gRPC, UNAVAILABLE is also an overloaded server's answer: where the port speaks the protocol,
    the server's message stands."""
    for protocol, url in (("grpc", server.grpc_url), ("http", server.http_url)):
        host, port = url.rsplit(":", 1)
        assert explain(protocol, host, int(port)) is None


def test_the_real_process_prints_one_line(server):
    """As a script sees it: exit code 1, one line on stderr, no traceback."""
    result = subprocess.run([sys.executable, "-m", "ragstack.cli", "query", "x", "--url", server.grpc_url,
                             "--protocol", "http"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout, result.stderr.count("\n")) == (1, "", 1), result.stderr
    assert "nothing answers HTTP" in result.stderr and "Traceback" not in result.stderr


ENGINE_FAILS = r"ValueError: num_kv_blocks 1000000000 x block_size 16 exceeds \d+ cache slots"


def test_a_failed_load_is_one_line_in_models_list(capsys, server):
    grpc = ["--url", server.grpc_url, "--protocol", "grpc"]
    code, _, err = run(capsys, "models", "load", "engine_fails", *grpc)
    assert code == 1 and err.count("\n") == 1, err
    assert re.search(f"load failed for model 'engine_fails': {ENGINE_FAILS} "
                     r"\(`ragstack models show engine_fails` prints the whole reason\)", err), err
    assert run(capsys, "models", "load", "missing_checkpoint", *grpc)[0] == 1
    for connection in (grpc, ["--url", server.http_url, "--protocol", "http"]):
        code, out, err = run(capsys, "models", "list", *connection)
        lines = {line.split()[0]: line for line in out.splitlines()}
        assert code == 0 and sorted(lines) == ["echo", "engine_fails", "missing_checkpoint"], out
        assert lines["echo"].split() == ["echo", "1", "READY"]
        assert lines["engine_fails"].split()[1:3] == ["1", "UNAVAILABLE"]
        assert re.search(rf"  \({ENGINE_FAILS}\)$", lines["engine_fails"]), lines["engine_fails"]
        assert "  (ValueError: model 'tiny-qwen2': no folder " in lines["missing_checkpoint"]
        assert "Traceback" not in out and "At:" not in out
        assert "`ragstack models show NAME` prints it whole" in err
    code, out, _ = run(capsys, "models", "show", "engine_fails", *grpc)
    assert code == 0 and out.startswith("engine_fails  version 1  UNAVAILABLE\n")
    assert "EngineStartError: the engine process exited" in out and "Traceback (most recent call last):" in out
    code, _, err = run(capsys, "models", "show", "no_such_model", *grpc)
    assert code == 1 and "[NOT_FOUND] no model 'no_such_model'" in err
