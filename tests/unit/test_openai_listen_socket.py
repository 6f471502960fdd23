"""The listening sockets of the OpenAI frontend (and of the gateway on `::`): what their connections inherit,
which clients they take."""
import resource
import socket

import pytest

from ragstack.listen_socket import tcp_listener
from ragstack.openai_frontend.__main__ import listen, more_descriptors


def test_connections_send_each_chunk_at_once():
    """TCP_NODELAY on every accepted connection: with Nagle's algorithm a streamed chunk written after the
    headers waited for the client's delayed ACK (40 ms on Linux) on a kept-alive connection."""
    server = listen("127.0.0.1", 0, write_timeout_s=5.0)
    assert server is not None
    with server, socket.create_connection(server.getsockname()):
        accepted, _ = server.accept()
        with accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


@pytest.mark.skipif(not socket.has_dualstack_ipv6(), reason="no IPv6 on this host")
def test_the_ipv6_wildcard_takes_ipv4_clients_too():
    with tcp_listener("::", 0, backlog=8) as server:
        port = server.getsockname()[1]
        for address in ("127.0.0.1", "::1"):
            with socket.create_connection((address, port), timeout=5):
                accepted, _ = server.accept()
                accepted.close()


def test_the_open_file_limit_is_raised_towards_the_hard_one():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 512:
        pytest.skip(f"hard open-file limit {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        more_descriptors()
        raised, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        assert raised > 256
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
