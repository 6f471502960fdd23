"""The gateway's limits: what each guards, its default, and its flag. `ragstack serve` and
`python -m ragstack.gateway` take the same flags (add_arguments); the launcher passes them on (to_args)."""
from __future__ import annotations

import argparse
import resource
from dataclasses import dataclass, field, fields

# Descriptors the gateway needs besides client and upstream connections: the listening socket,
# stdio, the event loop, the livez probe's connections.
SPARE_DESCRIPTORS = 64
# Refused connections that linger to be read (ragstack.gateway.admission) at most; more close at once.
LINGERING_MAX = 256


def _knob(default, help_text: str):
    return field(default=default, metadata={"help": help_text})


@dataclass(frozen=True)
class GatewayLimits:
    # The largest legitimate body: a prompt at the llm's max_prompt_bytes (1 MiB) escaped in JSON at
    # up to 3 bytes a byte (\uXXXX surrogate pairs) plus sampling_parameters (64 KiB); 32 texts of
    # 16 KiB to embed are half a MiB. Refused bodies never reach Triton, which keeps what it reads.
    max_body_bytes: int = _knob(4 << 20, "largest request body in bytes, after decompression (413 beyond)")
    # Bodies are held whole until Triton has them: without a bound, 4096 connections of 4 MiB bodies
    # would hold 16 GiB. 64 bodies at max_body_bytes.
    max_buffered_bytes: int = _knob(256 << 20, "request body bytes held at once, all requests together (503 beyond)")
    # Triton's JSON parser recurses: 130k levels crash the server. A tensor of rank r nests r + 3 deep.
    max_json_depth: int = _knob(64, "deepest JSON nesting of a body or binary request's JSON header (400 beyond)")
    max_connections: int = _knob(4096, "open client connections in all; past it new ones get 503 and are closed")
    max_connections_per_client: int = _knob(256, "open connections per client address; past it 429 and closed")
    # aiohttp's keep-alive timer runs from a connection's opening and from each response until the
    # next request's head is complete, so the one timeout ends idle and slow-header connections alike. Above
    # the 60 s nginx and AWS load balancers keep idle upstream connections: a shorter one closes some as a
    # proxy sends a POST on them, which it does not retry (a 502).
    idle_timeout_s: float = _knob(75.0, "seconds a connection may go without a complete request head")
    body_timeout_s: float = _knob(30.0, "longest pause in a request body (408), or in a client taking a response")
    upstream_connections: int = _knob(256, "connections to Triton's HTTP port at most; requests beyond wait")
    upstream_wait_s: float = _knob(10.0, "seconds a request may wait for a connection to Triton (503 after)")
    livez_timeout_s: float = _knob(3.0, "deadline for Triton to answer /livez's probe (the repository index)")

    def __post_init__(self):
        for knob in fields(self):
            value = getattr(self, knob.name)
            if not value > 0:
                raise ValueError(f"gateway limit {knob.name} must be > 0, got {value!r}")

    def to_args(self) -> list[str]:
        return [arg for knob in fields(self) for arg in (_flag(knob.name), str(getattr(self, knob.name)))]

    def descriptors_needed(self) -> int:
        return self.max_connections + self.upstream_connections + LINGERING_MAX + SPARE_DESCRIPTORS


def _flag(name: str) -> str:
    return "--" + name.removesuffix("_s").replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("HTTP gateway limits (docs/operations.md)")
    for knob in fields(GatewayLimits):
        group.add_argument(_flag(knob.name), dest=knob.name, type=type(knob.default), default=knob.default,
                           help=f"{knob.metadata['help']} (default {knob.default})")


def from_args(args: argparse.Namespace) -> GatewayLimits:
    return GatewayLimits(**{knob.name: getattr(args, knob.name) for knob in fields(GatewayLimits)})


def reserve_descriptors(limits: GatewayLimits) -> None:
    """Raises this process's open-file limit to what the connection limits need (refused above the hard
    limit), so that the gateway refuses connections before the kernel does (EMFILE)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = limits.descriptors_needed()
    if needed <= soft:
        return
    if hard != resource.RLIM_INFINITY and needed > hard:
        raise ValueError(f"max_connections={limits.max_connections} plus upstream_connections="
                         f"{limits.upstream_connections} need {needed} open files; the limit (ulimit -n) is {hard}: "
                         "lower --max-connections or raise the limit")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
