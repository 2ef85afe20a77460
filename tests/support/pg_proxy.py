"""A proxy in front of PostgreSQL that lets one statement commit and then loses its answer.

It speaks just enough of the wire protocol to find message boundaries from the client. Once a
client message contains `marker`, the statement it belongs to is let through (a simple `Query`
at once, a prepared one up to the `Sync` after its `Execute`), and the server's next answer is
thrown away and both
connections are cut: the server has committed, the client cannot know. That is a lost commit.
With `times`, only that many answers are lost; later connections pass everything through.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

_CHUNK = 65536


def _upstream(dsn: str) -> tuple[str | None, str | None, int]:
    """(unix socket path, tcp host, port) of the server behind `dsn`."""
    parts = urlsplit(dsn)
    query = dict(parse_qsl(parts.query))
    port = int(query.get("port") or parts.port or 5432)
    host = query.get("host") or parts.hostname or "/tmp"
    if host.startswith("/"):
        return f"{host}/.s.PGSQL.{port}", None, port
    return None, host, port


class AnswerDroppingProxy:
    def __init__(self, dsn: str, *, marker: bytes, times: int | None = None) -> None:
        self._dsn = dsn
        self._marker = marker
        self._times = times
        self._socket_path, self._tcp_host, self._port = _upstream(dsn)
        self._dir = tempfile.TemporaryDirectory(prefix="pgproxy-")
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.dropped = 0

    @property
    def dsn(self) -> str:
        parts = urlsplit(self._dsn)
        query = dict(parse_qsl(parts.query))
        query.update(host=self._dir.name, port=str(self._port))
        netloc = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query)))

    async def __aenter__(self) -> Self:
        path = str(Path(self._dir.name) / f".s.PGSQL.{self._port}")
        self._server = await asyncio.start_unix_server(self._serve, path=path)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()
        self._dir.cleanup()

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._socket_path:
            return await asyncio.open_unix_connection(self._socket_path)
        assert self._tcp_host is not None
        return await asyncio.open_connection(self._tcp_host, self._port)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        server_r, server_w = await self._open_upstream()
        fired = asyncio.Event()

        async def client_to_server() -> None:
            marked: set[bytes] = set()  # prepared statements whose text holds the marker
            bound = executed = False  # a marked statement was bound, and executed
            # The startup packet has no type byte: a length, then the rest.
            (length,) = struct.unpack("!I", await client_r.readexactly(4))
            server_w.write(struct.pack("!I", length) + await client_r.readexactly(length - 4))
            while True:
                kind = await client_r.readexactly(1)
                (length,) = struct.unpack("!I", await client_r.readexactly(4))
                body = await client_r.readexactly(length - 4)
                live = self._times is None or self.dropped < self._times
                if kind == b"P":  # Parse: statement name, then its text
                    name = body.split(b"\0", 1)[0]
                    (marked.add if self._marker in body else marked.discard)(name)
                elif kind == b"B":  # Bind: portal name, then the statement's
                    bound = body.split(b"\0", 2)[1] in marked
                elif kind == b"E":
                    executed = bound
                # A simple Query commits as it runs; a prepared statement outside a transaction
                # commits at the Sync after its Execute. (Other statements come between: asyncpg
                # looks up types with statements of its own.)
                simple = kind == b"Q" and self._marker in body
                if live and (simple or (kind == b"S" and executed)) and not fired.is_set():
                    fired.set()
                server_w.write(kind + struct.pack("!I", length) + body)
                await server_w.drain()

        async def server_to_client() -> None:
            while True:
                chunk = await server_r.read(_CHUNK)
                if not chunk:
                    return
                if fired.is_set():
                    self.dropped += 1
                    return  # the answer to the marked statement: lost
                client_w.write(chunk)
                await client_w.drain()

        pumps = [asyncio.create_task(client_to_server()), asyncio.create_task(server_to_client())]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for writer in (client_w, server_w):
                with contextlib.suppress(Exception):
                    writer.transport.abort()
            self._tasks.discard(task)
