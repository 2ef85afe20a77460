"""Kill points and the marker files through which the drill asks a worker to stop at one of them.

The runner *arms* a point for one run by creating `<run_id>.<point>.armed` in the markers folder,
optionally with a condition (JSON, e.g. `{"tool_call_id": "call_1_1"}` or `{"turn": 2}`). The first
worker code that reaches that point for that run with matching facts *claims* it by renaming the file
(a rename is atomic, so exactly one attempt wins), then announces where it is in `<run_id>.<point>.held` (JSON:
pid, key) and, for every point but `downstream`, sleeps until the runner kills its process. Once the
runner has acted on a `.held` file it renames it to `.done`.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

MARKERS_ENV = "ONCEFLOW_DRILL_MARKERS"
# Long enough that only a SIGKILL ends it; a tool's own timeout may cancel it first (that is a miss).
HOLD_SECONDS = 3600.0


class KillPoint(StrEnum):
    """Where a worker is killed on purpose."""

    MODEL = "model"  # inside a model call
    BEFORE_SEND = "before_send"  # the call is reserved in the ledger, the request has not left
    DOWNSTREAM = "downstream"  # the billing service holds the request (fault apply_then_hang or slow)
    AFTER_ANSWER = "after_answer"  # billing answered; the outcome is not yet in the ledger
    RECONCILE = "reconcile"  # inside the tool's reconcile hook, after it asked billing
    # Inside the guarded reservation of the first credit's twin: its transaction waits on the intent lock,
    # which the runner holds (reserve.py), so no worker code needs a place to stop.
    RESERVE = "reserve"


@dataclass(frozen=True)
class Held:
    """What a worker announces when it has reached an armed point."""

    run_id: str
    point: KillPoint
    pid: int
    key: str | None = None


def markers_dir() -> Path | None:
    value = os.environ.get(MARKERS_ENV)
    return Path(value) if value else None


def _path(folder: Path, run_id: str, point: KillPoint, state: str) -> Path:
    return folder / f"{run_id}.{point.value}.{state}"


def arm(folder: Path, run_id: str, point: KillPoint, **condition: Any) -> None:
    """Ask the first attempt that reaches `point` in run `run_id` to stop there (see `claim`)."""
    _path(folder, run_id, point, "armed").write_text(json.dumps(condition))


def _armed_condition(folder: Path, run_id: str, point: KillPoint) -> dict[str, Any] | None:
    try:
        condition: dict[str, Any] = json.loads(_path(folder, run_id, point, "armed").read_text() or "{}")
    except (FileNotFoundError, ValueError):
        return None
    return condition


def claim(run_id: str, point: KillPoint, key: str | None = None, **facts: Any) -> bool:
    """Take an armed point whose condition `facts` meet, and announce it. False if not for us."""
    folder = markers_dir()
    if folder is None:
        return False
    condition = _armed_condition(folder, run_id, point)
    if condition is None or any(facts.get(name) != value for name, value in condition.items()):
        return False
    try:
        os.rename(_path(folder, run_id, point, "armed"), _path(folder, run_id, point, "claimed"))
    except FileNotFoundError:
        return False  # another attempt took it first
    held = Held(run_id=run_id, point=point, pid=os.getpid(), key=key)
    scratch = _path(folder, run_id, point, f"{os.getpid()}.tmp")
    scratch.write_text(json.dumps(asdict(held)))
    os.replace(scratch, _path(folder, run_id, point, "held"))
    return True


async def hold(run_id: str, point: KillPoint, key: str | None = None, **facts: Any) -> None:
    """If `point` is armed for this run (and `facts` meet its condition), claim it and wait here."""
    if claim(run_id, point, key, **facts):
        await asyncio.sleep(HOLD_SECONDS)


def read_held(folder: Path) -> list[tuple[Path, Held]]:
    """Announcements not yet acted on, oldest first."""
    found: list[tuple[float, Path, Held]] = []
    for path in folder.glob("*.held"):
        try:
            data = json.loads(path.read_text())
            stamp = path.stat().st_mtime
        except (FileNotFoundError, ValueError):
            continue
        found.append((stamp, path, Held(**{**data, "point": KillPoint(data["point"])})))
    return [(path, held) for _, path, held in sorted(found, key=lambda item: item[0])]


def mark_done(path: Path) -> None:
    try:
        os.replace(path, path.with_suffix(".done"))
    except FileNotFoundError:
        pass


def still_armed(folder: Path) -> list[tuple[str, KillPoint]]:
    """Points armed but never reached: (run_id, point)."""
    left = []
    for path in folder.glob("*.armed"):
        run_id, point, _ = path.name.rsplit(".", 2)
        left.append((run_id, KillPoint(point)))
    return sorted(left)
