"""Gates: places where a drill run's worker code waits for the drill to act, rather than to be killed.

The conflict runs (RunPath.CONFLICT) need their steps in one order: the model is told the first
credit "failed", and only then does the owner's late "completed" arrive, before the model's retry
is reserved. Two marker files in the markers folder (the kill points' folder, points.py) make it so:

- a turn gate, `<run_id>.turn<N>.gate`: the model call of the run's answer N, once it has been given
  its conversation (and told.py has written it down), announces `<run_id>.turn<N>.waiting` and waits
  until the drill creates `<run_id>.turn<N>.open`. A worker killed meanwhile leaves the gate as it
  was: the model call's next attempt waits at it again;
- a call left to the operator, `<run_id>.<tool_call_id>.operator`: the drill tool's reconcile hook
  answers "unknown" for that call, so only the drill, as an operator, settles it.

Unarmed (no gate file), nothing waits and the hook behaves as usual.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from onceflow.drill.points import markers_dir

_POLL_SECONDS = 0.05


def _turn(folder: Path, run_id: str, turn: int, state: str) -> Path:
    return folder / f"{run_id}.turn{turn}.{state}"


def close_turn(folder: Path, run_id: str, turn: int) -> None:
    """Make the model call of answer `turn` in run `run_id` wait for `open_turn`."""
    _turn(folder, run_id, turn, "gate").touch()


def open_turn(folder: Path, run_id: str, turn: int) -> None:
    _turn(folder, run_id, turn, "open").touch()


def turn_reached(folder: Path, run_id: str, turn: int) -> bool:
    """Has a model call of answer `turn` been given its conversation and stopped at the gate?"""
    return _turn(folder, run_id, turn, "waiting").exists()


async def wait_at_turn(run_id: str, turn: int) -> None:
    """In the worker: if answer `turn` of this run is gated, say so and wait until it opens."""
    folder = markers_dir()
    if folder is None or not _turn(folder, run_id, turn, "gate").exists():
        return
    opened = _turn(folder, run_id, turn, "open")
    if not opened.exists():
        waiting = _turn(folder, run_id, turn, "waiting")
        scratch = waiting.with_name(f"{waiting.name}.{os.getpid()}.tmp")
        scratch.write_text(str(os.getpid()))
        os.replace(scratch, waiting)
    while not opened.exists():
        await asyncio.sleep(_POLL_SECONDS)


def _operator(folder: Path, run_id: str, tool_call_id: str) -> Path:
    return folder / f"{run_id}.{tool_call_id}.operator"


def leave_to_operator(folder: Path, run_id: str, tool_call_id: str) -> None:
    """Make the reconcile hook answer "unknown" for this call: the drill's operator settles it."""
    _operator(folder, run_id, tool_call_id).touch()


def left_to_operator(run_id: str, tool_call_id: str) -> bool:
    """In the worker: is this call's outcome the drill operator's to decide?"""
    folder = markers_dir()
    return folder is not None and _operator(folder, run_id, tool_call_id).exists()
