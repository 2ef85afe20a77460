"""Crash drills: real worker processes SIGKILLed at chosen instructions and at random, then counted.

`onceflow drill --runs N` (or `make drill RUNS=N`) runs one; see docs/reliability.md. The receiver
drill (`onceflow receiver-drill`, `make drill-receiver`, kit.py) kills the receiver too, and checks
that a receiver on onceflow's receiver kit settles every unknown call; see docs/receivers.md.
"""

from onceflow.drill.points import KillPoint
from onceflow.drill.report import DrillReport
from onceflow.drill.runner import run_drill
from onceflow.drill.scenario import DrillConfig

__all__ = ["DrillConfig", "DrillReport", "KillPoint", "run_drill"]
