"""The frontend's HTTP/1.1 connections: uvicorn's h11 protocol with two changes.

- One deadline, idle_timeout_s, from a connection's opening and from each answer's end to the next complete
  request head, as the gateway's: uvicorn starts its keep-alive timer only after an answer and stops it on any
  byte, so a client that sent nothing, or a head a byte at a time, held its connection and a file descriptor
  for ever (a few hundred such clients left none for the others).
- No warning for an `Upgrade` it does not take (`curl --http2` asks for h2c): the request is served as
  HTTP/1.1, and uvicorn's two lines a request (one advising a WebSocket library) let any client fill the log.
"""
from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol


class Connection(H11Protocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def data_received(self, data: bytes) -> None:
        # not uvicorn's: its first step stops the timer on any byte; handle_events stops it on a whole head
        self.conn.receive_data(data)
        self.handle_events()

    def _unsupported_upgrade_warning(self) -> None:
        pass
