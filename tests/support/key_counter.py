"""A TCP proxy in front of the billing service that can hold credit requests in flight.

It notes each held request's Idempotency-Key, so a test knows which calls are on the wire; whether a
key was sent more than once is counted at the billing service itself (`BillingClient.received_counts`),
the one count the tests use. While `holding` is set, each `POST /credits` is kept at the
proxy (the caller waits, as for a slow downstream) until `release()`; then it goes on to the
service, even if the caller has gone meanwhile, as a request already on the wire would.

Each connection is judged by its first request; the billing tools open a connection per call.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

from onceflow.receiver import parse_key_header

_CHUNK = 65536
_CREDITS = "POST /credits"


class KeyCountingProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._released = asyncio.Event()
        self._released.set()
        self.sent: Counter[str] = Counter()  # credit requests received, per Idempotency-Key
        self.held: set[str] = set()  # keys whose request is being held right now

    @property
    def url(self) -> str:
        assert self._server is not None, "start() first"
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def hold(self) -> None:
        """Keep every credit request from now on until `release()`."""
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    async def start(self) -> KeyCountingProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def close(self) -> None:
        self.release()
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
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass  # close(): the connection ends here, quietly
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        request = " ".join(lines[0].split(" ")[:2])
        raw = _header(lines[1:], "idempotency-key")
        # The header is a Structured Field string (the key in quotes, onceflow.receiver.keys).
        key = parse_key_header(raw) if raw is not None else None
        if request == _CREDITS and key is not None:
            self.sent[key] += 1
            if not self._released.is_set():
                self.held.add(key)
                try:
                    await self._released.wait()
                finally:
                    self.held.discard(key)
        up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        try:
            up_writer.write(head)
            forward = asyncio.create_task(_pump(reader, up_writer, half_close=True))
            try:
                await _pump(up_reader, writer)
            finally:
                forward.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                    await forward
        finally:
            up_writer.transport.abort()


def _header(lines: list[str], name: str) -> str | None:
    for line in lines:
        field, _, value = line.partition(":")
        if field.strip().lower() == name:
            return value.strip()
    return None


async def _pump(
    source: asyncio.StreamReader, sink: asyncio.StreamWriter, *, half_close: bool = False
) -> None:
    while chunk := await source.read(_CHUNK):
        sink.write(chunk)
        await sink.drain()
    if half_close and sink.can_write_eof():
        sink.write_eof()
