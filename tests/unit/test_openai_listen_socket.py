"""The frontend's listening socket: what its connections inherit."""
import socket

from ragstack.openai_frontend.__main__ import listen


def test_connections_send_each_chunk_at_once():
    """TCP_NODELAY on every accepted connection: with Nagle's algorithm a streamed chunk written after the
    headers waited for the client's delayed ACK (40 ms on Linux) on a kept-alive connection."""
    server = listen("127.0.0.1", 0, write_timeout_s=5.0)
    assert server is not None
    with server, socket.create_connection(server.getsockname()) as client:
        accepted, _ = server.accept()
        with accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
