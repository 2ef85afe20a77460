"""The test session's embedded PostgreSQL never outlives pytest: not at the end of a session, and
not when pytest is SIGKILLed (pg_ctl detaches the server, so nothing else would stop it).

Each test runs a tiny pytest session of its own that uses tests/conftest.py's `postgres_dsn`,
writes down which server it got, and then ends or waits to be killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from onceflow.local.watchdog import postmaster_pid
from tests.support.processes import REPO

INNER_TEST = """\
import asyncio, json, os, time
from pathlib import Path

import asyncpg


def test_hold(postgres_dsn):
    async def data_directory():
        conn = await asyncpg.connect(postgres_dsn)
        try:
            return await conn.fetchval("SHOW data_directory")
        finally:
            await conn.close()

    data_dir = asyncio.run(data_directory())
    pid = int((Path(data_dir) / "postmaster.pid").read_text().split()[0])
    Path(os.environ["SERVER_REPORT"]).write_text(json.dumps({"pid": pid, "data_dir": data_dir}))
    if os.environ.get("HOLD"):
        time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


def _inner_session(tmp_path: Path, *, hold: bool) -> tuple[subprocess.Popen[bytes], Path]:
    (tmp_path / "conftest.py").write_text("from tests.conftest import postgres_dsn  # noqa: F401\n")
    (tmp_path / "test_hold.py").write_text(INNER_TEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    report = tmp_path / "server.json"
    env = {k: v for k, v in os.environ.items() if k != "ONCEFLOW_DATABASE_URL"}  # always embedded
    env |= {"SERVER_REPORT": str(report), "PYTHONPATH": str(REPO)}
    if hold:
        env["HOLD"] = "1"
    ini, test = tmp_path / "pytest.ini", tmp_path / "test_hold.py"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(ini)]
    command += ["--rootdir", str(tmp_path), str(test)]
    with (tmp_path / "inner.log").open("wb") as log:
        process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    return process, report


def _server(process: subprocess.Popen[bytes], report: Path, tmp_path: Path) -> tuple[int, Path]:
    deadline = time.monotonic() + 90
    while not report.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(
                f"the inner session never reported its server:\n{(tmp_path / 'inner.log').read_text()}"
            )
        time.sleep(0.1)
    time.sleep(0.1)  # written in one go, but let the writer finish
    found = json.loads(report.read_text())
    return found["pid"], Path(found["data_dir"])


def _gone_within(seconds: float, pid: int) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_the_session_postgres_stops_when_the_session_ends(tmp_path: Path) -> None:
    process, report = _inner_session(tmp_path, hold=False)
    assert process.wait(timeout=120) == 0, (tmp_path / "inner.log").read_text()
    pid, data_dir = _server(process, report, tmp_path)
    assert not _alive(pid)
    assert not data_dir.exists()


def test_the_session_postgres_stops_when_pytest_is_sigkilled(tmp_path: Path) -> None:
    process, report = _inner_session(tmp_path, hold=True)
    pid, data_dir = _server(process, report, tmp_path)
    assert _alive(pid) and postmaster_pid(data_dir) == pid
    os.kill(process.pid, signal.SIGKILL)  # pytest alone: no atexit, no fixture teardown
    process.wait(timeout=10)
    try:
        assert _gone_within(15, pid), f"PostgreSQL {pid} outlived the SIGKILLed pytest"
        deadline = time.monotonic() + 10
        while data_dir.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not data_dir.exists(), "the orphaned server's folder was left behind"
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
