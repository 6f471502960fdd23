"""The client and CLI over TLS, as a server behind a TLS-terminating proxy is reached: a proxy in this
module (asyncio, a certificate signed by a CA made here with the openssl command) forwards to the
session server's gRPC port (ALPN h2) and its HTTP port. With the CA the CLI and both clients work over
TLS (repository calls, inference, streams); without it, or TLS to a port in the clear, or a proxy that
wants a client certificate and gets none, the CLI answers one line naming the cause and the fix.
"""
from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import threading
from pathlib import Path

import pytest

from ragstack.cli import main
from ragstack.client import AsyncRagClient, RagClient
from ragstack.reachability import explain
from ragstack.tls import TlsOptions

pytestmark = pytest.mark.server


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    """ca.pem (a private CA), server.pem/server.key (localhost, 127.0.0.1), client.pem/client.key."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make certificates")
    d = tmp_path_factory.mktemp("certs")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=ragstack test CA",
            "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"))
    for name, extension in (("server", "subjectAltName=DNS:localhost,IP:127.0.0.1"),
                            ("client", "extendedKeyUsage=clientAuth")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(d / f"{name}.key"),
                "-out", str(d / f"{name}.csr"))
        (d / f"{name}.ext").write_text(extension + "\n")
        openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"), "-CAkey", str(d / "ca.key"),
                "-CAcreateserial", "-days", "1", "-extfile", str(d / f"{name}.ext"), "-out", str(d / f"{name}.pem"))
    return d


class TlsProxy:
    """TLS on 127.0.0.1:<port>, the bytes inside forwarded to `upstream` (host:port) in the clear."""

    def __init__(self, upstream: str, context: ssl.SSLContext):
        self.upstream = upstream.rsplit(":", 1)
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        threading.Thread(target=self._run, args=(context, started), daemon=True).start()
        started.wait(10)

    def _run(self, context: ssl.SSLContext, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._connection, "127.0.0.1", 0, ssl=context))
        self.port = self.server.sockets[0].getsockname()[1]
        started.set()
        self.loop.run_forever()

    async def _connection(self, reader, writer) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return

        async def pump(source, sink):
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (OSError, ssl.SSLError):
                pass
            finally:
                sink.close()
        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)

    async def _shutdown(self) -> None:
        self.server.close()
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def server_context(certs: Path, alpn: list[str], client_certificate: bool = False) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs / "server.pem", certs / "server.key")
    context.set_alpn_protocols(alpn)
    if client_certificate:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(certs / "ca.pem")
    return context


@pytest.fixture(scope="module")
def proxies(certs, triton_server):
    """{(protocol, wants a client certificate): proxy} in front of the session server."""
    upstream = {"grpc": (triton_server.grpc_url, ["h2"]), "http": (triton_server.http_url, ["http/1.1"])}
    made = {(protocol, mutual): TlsProxy(url, server_context(certs, alpn, mutual))
            for protocol, (url, alpn) in upstream.items() for mutual in (False, True)}
    yield made
    for proxy in made.values():
        proxy.close()


def run(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


PROTOCOLS = ["grpc", "http"]
SCHEMES = {"grpc": "grpcs", "http": "https"}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_cli_over_tls_with_the_ca(capsys, certs, proxies, protocol):
    url = f"{SCHEMES[protocol]}://{proxies[protocol, False].url}"
    code, out, err = run(capsys, "models", "list", "--url", url, "--protocol", protocol,
                         "--ssl-ca", str(certs / "ca.pem"))
    assert code == 0 and "rag " in out, err
    # a stream (gRPC bidirectional; HTTP generate_stream's SSE), TLS asked for by an option, not the URL
    code, out, err = run(capsys, "query", "What is paged attention?", "--max-tokens", "4", "--url",
                         proxies[protocol, False].url, "--protocol", protocol, "--ssl-ca", str(certs / "ca.pem"))
    assert code == 0 and "\nSources:\n  [" in out, err


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_clients_over_tls(certs, proxies, protocol):
    tls = TlsOptions(ca_file=str(certs / "ca.pem"))
    with RagClient(proxies[protocol, False].url, protocol, tls=tls) as client:
        assert client.embed(["paged attention"]).vectors.shape == (1, 384)
        assert client.query("What is paged attention?", max_tokens=4).collect().sources

    async def asynchronous():
        async with AsyncRagClient(proxies[protocol, False].url, protocol, tls=tls) as client:
            assert (await client.embed(["paged attention"])).vectors.shape == (1, 384)
            assert (await client.query("What is paged attention?", max_tokens=4).collect()).sources
            assert any(m.name == "rag" for m in await client.models())
    asyncio.run(asynchronous())


def one_line_error(capsys, url: str, protocol: str, *options: str) -> str:
    code, out, err = run(capsys, "models", "list", "--url", url, "--protocol", protocol, *options)
    prefix = "ragstack models: error: [UNAVAILABLE] "
    assert (code, out, err.count("\n")) == (1, "", 1) and err.startswith(prefix), err
    return err[len(prefix):].strip()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_certificate_the_client_does_not_trust(capsys, proxies, protocol):
    url = proxies[protocol, False].url
    message = one_line_error(capsys, f"{SCHEMES[protocol]}://{url}", protocol)
    assert message.startswith(f"the TLS certificate of {url} is not accepted (unable to get local issuer "
                              "certificate) — give the CA that signed it with --ssl-ca FILE"), message
    assert ("--insecure" in message) == (protocol == "http")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_tls_to_a_port_in_the_clear(capsys, certs, triton_server, protocol):
    url = triton_server.grpc_url if protocol == "grpc" else triton_server.http_url
    name = {"grpc": "gRPC", "http": "HTTP"}[protocol]
    assert one_line_error(capsys, url, protocol, "--ssl-ca", str(certs / "ca.pem")).startswith(
        f"{url} does not speak TLS (it speaks {name} without TLS) — connect without TLS")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_proxy_that_wants_a_client_certificate(capsys, certs, proxies, protocol):
    url, ca = proxies[protocol, True].url, ("--ssl-ca", str(certs / "ca.pem"))
    message = one_line_error(capsys, url, protocol, *ca)
    assert message.startswith(f"the TLS handshake with {url} failed (") and "--ssl-cert" in message, message
    code, out, err = run(capsys, "models", "list", "--url", url, "--protocol", protocol, *ca,
                         "--ssl-cert", str(certs / "client.pem"), "--ssl-key", str(certs / "client.key"))
    assert code == 0 and "rag " in out, err


def test_insecure_over_http_only(capsys, proxies):
    code, out, err = run(capsys, "models", "list", "--url", proxies["http", False].url, "--protocol", "http",
                         "--insecure")
    assert code == 0 and "rag " in out, err
    code, _, err = run(capsys, "models", "list", "--url", proxies["grpc", False].url, "--insecure")
    assert code == 2 and "gRPC cannot skip the check of the server's certificate" in err, err


@pytest.mark.parametrize("argv, says", [
    (["--url", "http://localhost:8000", "--protocol", "http", "--ssl"], "a http:// URL connects without TLS"),
    (["--url", "localhost:8001", "--ssl-ca", "/no/such/ca.pem"], "TLS CA file /no/such/ca.pem: no such file"),
    (["--url", "localhost:8000", "--protocol", "http", "--ssl-key", "k.pem"], "needs its certificate"),
])
def test_tls_usage_errors(capsys, argv, says):
    code, _, err = run(capsys, "models", "list", *argv)
    assert code == 2 and says in err, err


def test_the_probe_over_tls(certs, proxies):
    """Through TLS the probe sees what the proxy forwards to: each port speaks its own protocol (the server's
    message stands), and the other protocol's port is named."""
    tls = TlsOptions(ca_file=str(certs / "ca.pem"))
    for protocol in PROTOCOLS:
        host, port = proxies[protocol, False].url.rsplit(":", 1)
        assert explain(protocol, host, int(port), tls=tls) is None
    host, port = proxies["grpc", False].url.rsplit(":", 1)
    assert explain("http", host, int(port), tls=tls).startswith(f"nothing answers HTTP at {host}:{port} — it speaks "
                                                                 "gRPC")
    host, port = proxies["http", False].url.rsplit(":", 1)
    assert explain("grpc", host, int(port), tls=tls).startswith(f"nothing answers gRPC at {host}:{port} — it speaks "
                                                                 "HTTP")
