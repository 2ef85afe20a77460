"""Stop an embedded PostgreSQL once the process that started it is gone, however it went.

`python -m onceflow.local.watchdog DATA_DIR [--remove DIR]`, with stdin a pipe from that process.
pg_ctl detaches the server into a session of its own, so nothing else ends it when its owner is
SIGKILLed. The kernel closes the owner's end of the pipe when the owner exits, for any reason: end
of file on stdin is the news. An owner that stops the server itself writes `stopped` first, and the
watchdog then leaves quietly.

Standard library only: it starts in milliseconds and has nothing to import that could fail.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from pathlib import Path

STOPPED = b"stopped\n"
# Fast shutdown first (sessions cut, data flushed); then immediate; then no more asking.
_ESCALATION = ((signal.SIGINT, 10.0), (signal.SIGQUIT, 5.0), (signal.SIGKILL, 5.0))


def postmaster_pid(data_dir: Path) -> int | None:
    """The running server's pid, from postmaster.pid (which PostgreSQL removes when it stops)."""
    try:
        first = (data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
        return int(first)
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie nobody has reaped yet is gone for our purposes
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def stop_server(data_dir: Path) -> None:
    """Stop the server running on `data_dir`, if one is, escalating until it is gone."""
    for sig, patience in _ESCALATION:
        pid = postmaster_pid(data_dir)
        if pid is None or not _alive(pid):
            return
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--remove", type=Path, help="folder to delete after stopping an orphaned server")
    args = parser.parse_args()
    # Ignore the signals a terminal or a test runner sends to everyone: only end of file counts.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    told = sys.stdin.buffer.read()
    if told == STOPPED:
        return
    stop_server(args.data_dir)
    if args.remove is not None:
        shutil.rmtree(args.remove, ignore_errors=True)


if __name__ == "__main__":
    main()
