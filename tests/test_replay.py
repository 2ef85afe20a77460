"""Today's workflow code replays every recorded history: runs already in flight survive a deploy.

tests/histories/<release>/ holds histories recorded from earlier code (`make histories`), some of
runs still open, paused for a decision. A change to a workflow that would make one of them take a
different path (a new activity, timer or child workflow without `workflow.patched`) fails here,
naming the history, before it can strand a real run. See docs/operations.md, "Changing workflow code".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from onceflow.runtime.telemetry import tracing_interceptor
from onceflow.workflows import ALL_WORKFLOWS

HISTORIES = Path(__file__).parent / "histories"
RECORDED = sorted(p for p in HISTORIES.glob("*/*.json") if p.name != "MANIFEST.json")


def _manifest_entry(path: Path) -> dict[str, str]:
    """What the recorder wrote down about this file: its workflow id and type, its scenario."""
    manifest = json.loads((path.parent / "MANIFEST.json").read_text())
    for entry in manifest["histories"]:
        if entry["file"] == path.name:
            found: dict[str, str] = entry
            return found
    raise AssertionError(f"{path.relative_to(HISTORIES)} is not listed in its folder's MANIFEST.json")


def _load(path: Path) -> WorkflowHistory:
    # The workflow id is not in the events, and child workflow ids are derived from it.
    return WorkflowHistory.from_json(_manifest_entry(path)["workflow_id"], path.read_text())


def replayer() -> Replayer:
    # What the worker runs with: the same workflows, data converter and interceptors.
    return Replayer(
        workflows=ALL_WORKFLOWS,
        data_converter=pydantic_data_converter,
        interceptors=[tracing_interceptor()],
    )


def test_every_workflow_type_has_recorded_histories() -> None:
    recorded = {_manifest_entry(path)["workflow_type"] for path in RECORDED}
    assert {w.__temporal_workflow_definition.name for w in ALL_WORKFLOWS} <= recorded  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: f"{p.parent.name}/{p.stem}")
async def test_recorded_history_replays_without_nondeterminism(path: Path) -> None:
    result = await replayer().replay_workflow(_load(path), raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{path.relative_to(HISTORIES)}: {result.replay_failure!r}"
