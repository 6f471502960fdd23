"""A listening TCP socket as the stack's HTTP servers (the OpenAI frontend, the gateway on `::`) bind it."""
from __future__ import annotations

import socket


def tcp_listener(host: str, port: int, backlog: int) -> socket.socket:
    """Bound and listening. `::` takes IPv4 clients too, as vLLM's server does (Python and asyncio make it IPv6
    only). Its connections inherit TCP_NODELAY: asyncio sets it only on sockets whose proto is IPPROTO_TCP, and
    this one's is 0, so a streamed chunk written after the headers waited for the client's delayed ACK (40 ms
    on Linux) on a kept-alive connection. OSError if it cannot be bound."""
    sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                backlog=backlog, dualstack_ipv6=host == "::" and socket.has_dualstack_ipv6())
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock
