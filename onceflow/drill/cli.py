"""`onceflow drill`: run a drill, print what it found, write the JSON report, say pass or fail."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

from onceflow.drill.runner import run_drill
from onceflow.drill.scenario import DrillConfig


def run_from_cli(config: DrillConfig) -> int:
    """Run the drill; returns the process exit code (0 only if every invariant held)."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    print(
        f"drill: {config.runs} runs, seed {config.seed}, {config.workers} workers, "
        f"{config.concurrency} in flight, random kills {'on' if config.random_kills else 'off'}, "
        f"planned kills {'on' if config.planned_kills else 'off'}"
        + (f", SABOTAGED credit intent {config.sabotage_intent}" if config.sabotage_intent else "")
        + (f", only {', '.join(config.only)}" if config.only else ""),
        flush=True,
    )
    report = asyncio.run(run_drill(config))
    path = config.report or Path(report.run_dir) / "report.json"
    report.write(path)
    print(report.text())
    print(f"JSON report: {path}", flush=True)
    return 0 if report.ok else 1
