"""End to end: `onceflow demo` brings up the embedded stack as separate processes and runs the scenarios."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_demo_scenarios_end_as_they_should_with_the_right_effect_counts(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    onceflow = Path(sys.executable).parent / "onceflow"
    completed = subprocess.run(
        [
            str(onceflow),
            "demo",
            "--data-dir",
            str(tmp_path / "stack"),
            "--temporal-port",
            str(free_port()),
            "--ui-port",
            str(free_port()),
            "--billing-port",
            str(free_port()),
            "--api-port",
            str(free_port()),
            "--report",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env={k: v for k, v in os.environ.items() if k not in ("TEMPORAL_ADDRESS", "ONCEFLOW_DATABASE_URL")},
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    results = {r["name"]: r for r in json.loads(report.read_text())}
    assert list(results) == [
        "lost-response",
        "never-landed",
        "compensated",
        "refused-before-sending",
        "approval",
        "asked-again",
    ]
    assert all(r["ok"] and not r["problems"] for r in results.values()), results

    (lost,) = results["lost-response"]["runs"]
    assert (lost["effects"], lost["record"]["status"], lost["record"]["settled_by"]) == (
        1,
        "completed",
        "reconciler",
    )
    assert "started -> indeterminate" in " ".join(lost["record"]["history"])

    (never,) = results["never-landed"]["runs"]
    assert (never["effects"], never["record"]["status"]) == (0, "failed")
    assert never["record"]["settled_by"] == "operator:demo-operator"

    (undone,) = results["compensated"]["runs"]
    assert (undone["effects"], undone["voided"], undone["record"]["status"]) == (1, True, "compensated")

    (refused,) = results["refused-before-sending"]["runs"]
    assert (refused["effects"], refused["record"]["status"]) == (0, "failed")

    approved, denied = results["approval"]["runs"]
    assert (approved["effects"], approved["record"]["status"]) == (1, "completed")
    assert (denied["effects"], denied["record"]["status"]) == (0, "denied")
    first, repeat = results["asked-again"]["runs"]
    assert (first["effects"], first["record"]["settled_by"]) == (1, "reconciler")
    assert (repeat["effects"], repeat["record"]["status"]) == (0, "completed")
    assert repeat["record"]["reused_from"] == first["record"]["key"]
    assert "6 passed, 0 failed" in completed.stdout
    # Ctrl-C semantics aside, the demo's own stack must be gone: the lock is free again.
    assert not (tmp_path / "stack" / "stack.json").exists()
