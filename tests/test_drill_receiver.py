"""The receiver drill, a small one through the real `onceflow receiver-drill` command (marker
`drill`; `make drill-receiver` runs the full 200).

A receiver whose only dedup is onceflow's receiver kit (the example billing service, dedup on),
workers and the receiver process SIGKILLed at random, answers lost on purpose: every key applied at
most once, every unknown call settled by the kit with nobody's help. The report's verdicts are
checked again here from its per-call figures, and the effects per key once more straight from
billing's own credits table.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.test_drill import billing_rows

pytestmark = pytest.mark.drill

RUNS = 15


def test_a_small_receiver_drill_applies_no_key_twice_and_leaves_no_unknown(tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"
    command = [str(Path(sys.executable).parent / "onceflow"), "receiver-drill", "--runs", str(RUNS)]
    command += [
        "--seed",
        "5",
        "--timeout",
        "400",
        "--data-dir",
        str(tmp_path / "drills"),
        "--report",
        str(report_path),
    ]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=600)
    output = finished.stdout[-6000:] + finished.stderr[-3000:]
    assert report_path.exists(), output
    report: dict[str, Any] = json.loads(report_path.read_text())
    assert finished.returncode == 0 and report["ok"], output
    assert "unknowns made:" in output and "settled by the kit:" in output and "left: 0" in output

    totals = report["totals"]
    assert totals["runs"] == totals["runs_completed"] == RUNS
    assert totals["effects_twice"] == 0 and totals["unknowns_left"] == totals["settled_by_person"] == 0
    assert totals["unknowns_made"] >= 1 and totals["settled_by_kit"] >= 1
    assert totals["worker_kills"] + totals["receiver_kills"] >= 1
    for call in report["calls"]:
        assert call["effects"] <= 1, call
        assert call["status"] in ("completed", "failed"), call
        assert call["effects"] == (1 if call["status"] == "completed" else 0), call

    # Straight from billing's own credits: no key twice, and the report counted every credit.
    raw = Counter(key for (key,) in billing_rows(report, "SELECT idempotency_key FROM billing_credits"))
    assert raw and max(raw.values()) == 1
    assert sum(raw.values()) == totals["effects_total"]
