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
    lost = results["lost-response"]
    assert lost["effects"] == 1
    assert lost["record"]["status"] == "completed"
    assert lost["record"]["settled_by"] == "reconciler"
    assert "started -> indeterminate" in " ".join(lost["record"]["history"])
    refused = results["refused-before-sending"]
    assert refused["effects"] == 0
    assert refused["record"]["status"] == "failed"
    assert "2 passed, 0 failed" in completed.stdout
    # Ctrl-C semantics aside, the demo's own stack must be gone: the lock is free again.
    assert not (tmp_path / "stack" / "stack.json").exists()
