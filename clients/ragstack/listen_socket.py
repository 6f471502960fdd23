"""A listening TCP socket as the stack's HTTP servers (the OpenAI frontend, the gateway on `::`) bind it."""
from __future__ import annotations

import socket


def tcp_listener(host: str, port: int, backlog: int) -> socket.socket:
    """Bound and listening. `::` takes IPv4 clients too, as vLLM's server does (Python and asyncio make it IPv6
    only). Its connections inherit TCP_NODELAY, which asyncio sets only where proto is IPPROTO_TCP (here 0):
    without it a streamed chunk written after the headers waits for the client's delayed ACK (40 ms on Linux).
    OSError if it cannot be bound."""
    sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                backlog=backlog, dualstack_ipv6=host == "::" and socket.has_dualstack_ipv6())
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def shown(host: str) -> str:
    """The host as a URL writes it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host
