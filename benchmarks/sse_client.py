"""A lean client for streamed HTTP answers (server-sent events): HTTP/1.1 over asyncio streams on a kept-alive
connection, the events read off the socket and nothing more, as vLLM's serving benchmark reads the OpenAI API
with aiohttp. The official openai SDK spends ~1 ms of CPU on a request and ~0.1 ms on a chunk
(bench_openai_frontend.py --what client), so a client process with 16 streams delays their first tokens by
its own work: a benchmark of the server reads the events this way (bench_serving.py --api openai).
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator


class HTTPStatusError(Exception):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:500].decode(errors='replace')}")
        self.status = status


class SSEConnection:
    """One kept-alive connection; one request at a time."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def connect(self) -> None:
        """Open the connection now (else the first request opens it)."""
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)

    async def events(self, path: str, body: bytes) -> AsyncIterator[bytes]:
        """POST `body` (JSON) to `path`; each event's `data:` payload as it arrives, until the answer ends.
        HTTPStatusError for a status other than 200."""
        await self.connect()
        self._writer.write(b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                           b"Accept: text/event-stream\r\nContent-Length: %d\r\n\r\n%s"
                           % (path.encode(), self.host.encode(), self.port, len(body), body))
        reusable = False
        try:
            status, headers = await self._head()
            if status != 200:
                text = b"".join([part async for part in self._body(headers)])
                reusable = True
                raise HTTPStatusError(status, text)
            pending = b""
            async for part in self._body(headers):
                *whole, pending = (pending + part).split(b"\n\n")
                for event in whole:
                    for line in event.split(b"\n"):
                        if line.startswith(b"data: "):
                            yield line[6:]
            reusable = headers.get(b"connection", b"").lower() != b"close"
        finally:
            if not reusable:  # left mid-answer (or the server closes): the next request opens a new connection
                await self.close()

    async def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass

    async def _head(self) -> tuple[int, dict[bytes, bytes]]:
        head = await self._reader.readuntil(b"\r\n\r\n")
        status_line, *lines = head[:-4].split(b"\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        return int(status_line.split()[1]), headers

    async def _body(self, headers: dict[bytes, bytes]) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive: chunked, or of its Content-Length."""
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            while True:
                size = int((await self._reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await self._reader.readuntil(b"\r\n")  # no trailers
                    return
                data = await self._reader.readexactly(size + 2)
                yield data[:-2]
        else:
            yield await self._reader.readexactly(int(headers.get(b"content-length", b"0")))
