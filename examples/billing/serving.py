"""Running the billing service under uvicorn: in the foreground, or in a background thread for tests.

The `drop` fault needs to close a connection without answering. ASGI has no way to say that (an app
that returns without answering gets a 500 from uvicorn), so we serve with uvicorn's h11 protocol,
subclassed to hand each request an `abort` callable in its scope extensions. Anything served another
way lacks the extension, and the service then falls back to hanging.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from onceflow.local.extras import needs_extra

with needs_extra("api"):
    import uvicorn
    from uvicorn.protocols.http.h11_impl import H11Protocol

ABORT_EXTENSION = "billing.abort_connection"

ASGIApp = Callable[..., Any]


class AbortableH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, plus `scope["extensions"][ABORT_EXTENSION]()` to drop the connection."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        inner = self.app

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                scope.setdefault("extensions", {})[ABORT_EXTENSION] = self._abort
            await inner(scope, receive, send)

        self.app = app

    def _abort(self) -> None:
        # abort(), not close(): close() would still flush what is buffered; we want nothing sent.
        self.transport.abort()


def uvicorn_config(
    app: ASGIApp, host: str = "127.0.0.1", port: int = 8081, log_level: str = "info", **kwargs: Any
) -> uvicorn.Config:
    """A uvicorn config that serves `app` with the connection-dropping protocol."""
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, http=AbortableH11Protocol, **kwargs)


class BackgroundServer:
    """Serve an ASGI app on 127.0.0.1 in a thread of its own, like a separate process would.

    `port=0` picks a free port. Use as a context manager, or call start() and stop().
    """

    def __init__(self, app: ASGIApp, port: int = 0, *, shutdown_grace: float = 2.0) -> None:
        # IPPROTO_TCP spelled out: asyncio only sets TCP_NODELAY on accepted sockets whose proto says
        # TCP, and without it every request pays a 40 ms Nagle/delayed-ACK stall.
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Bound here, not by uvicorn, so the port is known (and ours) before the thread starts.
        self._sock.bind(("127.0.0.1", port))
        self.port: int = self._sock.getsockname()[1]
        config = uvicorn_config(
            app,
            port=self.port,
            log_level="warning",
            log_config=None,  # leave the host's logging alone (pytest's capture included)
            access_log=False,
            timeout_graceful_shutdown=shutdown_grace,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name=f"billing-{self.port}", daemon=True)

    @property
    def base_url(self) -> str:
        """The service's root URL."""
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        self._server.run(sockets=[self._sock])

    def start(self, timeout: float = 10.0) -> BackgroundServer:
        """Start serving and wait until the service accepts requests."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the billing service did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop serving; requests still running get `shutdown_grace` seconds, then are cancelled."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join()
        self._sock.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
