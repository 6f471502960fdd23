"""The embedded server listens on 127.0.0.1 only unless told otherwise: the kernel's socket table
for the session server's ports (the gateway's and, behind it, Triton's own HTTP port, which is on
loopback whatever the address; the OpenAI frontend's), and the defaults of the launcher and of `ragstack serve`."""
from __future__ import annotations

import argparse
import ipaddress
import socket
from pathlib import Path

import pytest

from ragstack import serve
from ragstack.launcher import ServerOptions

LISTEN = "0A"


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    # IPv6: four 32-bit words, each in host (little-endian) order; gRPC binds v4 as ::ffff:a.b.c.d
    address = ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
    return str(address.ipv4_mapped or address)


def listening_addresses(port: int) -> set[str]:
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            hex_address, hex_port = local.split(":")
            if state == LISTEN and int(hex_port, 16) == port:
                found.add(_address(hex_address))
    return found


@pytest.mark.server
def test_the_session_server_listens_on_loopback_only(triton_server):
    options = triton_server.options
    for port in (options.http_port, triton_server.triton_http_port, options.grpc_port, options.metrics_port,
                 options.openai_port):
        assert listening_addresses(port) == {"127.0.0.1"}, port


def test_loopback_is_the_default():
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert serve.options_from_args(parser.parse_args([])).address == "127.0.0.1"
    assert ServerOptions().address == "127.0.0.1"
