"""Child processes for tests: workers and the billing service, each in a session of its own so a test
can SIGKILL exactly what it started, and whatever is left is killed and reaped when the test ends."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from onceflow.local.postgres import create_database, drop_database

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ChildProcesses:
    """Processes started by one test or module. `close()` SIGKILLs and reaps those still alive."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self._started: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Run `python <args>` from the repository root, output to `<logs>/<name>.log`."""
        assert name not in self._started, f"a process named {name!r} was already started"
        self.logs.mkdir(parents=True, exist_ok=True)
        with (self.logs / f"{name}.log").open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, *args],
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: killpg reaches it and nothing else
            )
        self._started[name] = process
        return process

    def kill(self, process: subprocess.Popen[bytes]) -> None:
        """SIGKILL the process (and anything it started), then reap it."""
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=10)

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs_text(self) -> str:
        return "\n".join(f"--- {name} ---\n{self.log(name)[-4000:]}" for name in self._started)

    def close(self) -> None:
        for process in self._started.values():
            if process.poll() is None:
                self.kill(process)


@asynccontextmanager
async def billing_database(admin_dsn: str) -> AsyncIterator[str]:
    """A fresh, empty database for one billing service (it migrates its own tables and the kit's)."""
    name = f"billing_{uuid.uuid4().hex[:12]}"
    dsn = await create_database(admin_dsn, name)
    try:
        yield dsn
    finally:
        await drop_database(admin_dsn, name)


async def start_billing_service(processes: ChildProcesses, database_url: str, *, dedup: bool = True) -> str:
    """The example billing service in its own process, its records in the PostgreSQL database
    `database_url`; returns its URL. `dedup=False` starts it with `--no-dedup`: it honours no key.
    """
    port = free_port()
    args = [
        "-m",
        "onceflow.examples.billing.service",
        "--port",
        str(port),
        "--database-url",
        database_url,
        "--log-level",
        "warning",
    ]
    process = processes.start("billing", [*args] + ([] if dedup else ["--no-dedup"]), dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=url, timeout=1) as http:
        for _ in range(300):
            if process.poll() is not None:
                raise RuntimeError(f"the billing service exited:\n{processes.log('billing')}")
            try:
                if (await http.get("/health")).is_success:
                    return url
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError(f"the billing service did not answer:\n{processes.log('billing')}")


def kill_together(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGKILL every process (and what each started) before reaping any: they die at the same moment."""
    for process in processes:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for process in processes:
        process.wait(timeout=10)
