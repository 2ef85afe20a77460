"""A TCP proxy in front of the billing service that can lose every answer to a write.

Workers talk to the billing service through it. While `dropping` is set, a POST still reaches the
service, which acts on it, but the answer is thrown away and the caller's connection is cut (RST):
the caller cannot know whether anything happened. GET requests always pass, so reads keep working
while writes go dark. It counts nothing: the billing service itself records every request it
receives (`BillingClient.received`, `received_counts`), which is the one count tests use.

Each connection is judged by its first request; the billing tools open a connection per call.
"""

from __future__ import annotations

import asyncio
import contextlib

_CHUNK = 65536


class DroppingProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self.dropping = False

    @property
    def url(self) -> str:
        assert self._server is not None, "start() first"
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def start(self) -> DroppingProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        dropped = False
        try:
            dropped = await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._handlers.discard(task)
            if dropped:
                writer.transport.abort()  # a reset, not a close: no answer, not even an empty one
            else:
                writer.close()  # flushes what is still buffered of the answer first
                with contextlib.suppress(ConnectionError):
                    await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one connection; True when its answer was dropped."""
        first = await reader.read(_CHUNK)
        if not first:
            return False
        drop = self.dropping and first.startswith(b"POST ")
        up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        try:
            up_writer.write(first)
            forward = asyncio.create_task(_pump(reader, up_writer, half_close=True))
            try:
                if drop:
                    # Wait for the service to answer, which means it has acted; then lose the answer.
                    await up_reader.read(_CHUNK)
                else:
                    await _pump(up_reader, writer)
            finally:
                forward.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                    await forward
        finally:
            up_writer.transport.abort()
        return drop


async def _pump(
    source: asyncio.StreamReader, sink: asyncio.StreamWriter, *, half_close: bool = False
) -> None:
    while chunk := await source.read(_CHUNK):
        sink.write(chunk)
        await sink.drain()
    if half_close and sink.can_write_eof():
        # The caller is done asking; tell the service, so it closes and the answer pump ends.
        sink.write_eof()
