"""The write protocol as a model (model/onceflow.pml), checked exhaustively by SPIN, and held to the
real ledger.

- With issue 34's rules, SPIN finds no violation within the default suite's small bounds (every
  state, not a sample: `make model-check` runs larger ones).
- Each rule set back as the code had it (a switch) gives a counterexample, and its trail is read
  back as the model's own lines.
- Model and code agree: random runs of the model (`spin -n SEED`) are replayed as operations on a
  real PostgreSQL ledger, which must answer as the model did at every step; the old rules' trails
  disagree with today's ledger exactly where the old rule decided (or, for a rule of the workflow,
  not at all: the ledger is the same).
- Every action of the model that the ledger takes has its rule in the stateful property test
  (the table in docs/reliability.md, "The protocol, model checked").

SPIN is a Debian package (`spin`); .ci/run installs it, so CI always runs these. Without it they skip
and pytest's summary says so, as the console's browser tests do without chromium.
"""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path

import pytest
from hypothesis.stateful import RULE_MARKER

from onceflow.ledger import Ledger
from tests.support.protocol_bounds import CHECKS, DEFAULT_SUITE, FENCED, OLD_RULES, WALKS, Check, OldRule
from tests.support.protocol_model import MODEL, Build, spin_path
from tests.support.protocol_trace import NOT_LEDGER, Disagreement, Replay

pytestmark = pytest.mark.skipif(
    spin_path() is None, reason="spin is not installed (apt-get install spin; .ci/run does)"
)

# The default suite's share of CHECKS: a few seconds each.
DEFAULT_CHECKS = [c for c in CHECKS if c.name in DEFAULT_SUITE]

# Where each old rule's counterexample, replayed on today's ledger, first meets a ledger that decides
# otherwise: the operation of the step, or None when every ledger step agrees (a rule of the
# workflow: the ledger's answers are the same, the workflow acted on them otherwise).
DIVERGES_AT: dict[str, str | None] = {
    "HEARD_BY_STATUS_NOW": "reserve",
    "REUSE_FROM_REUSED": "reserve",
    "REUSE_NEWEST": "reserve",
    "LOST_REPLY_UNKNOWN": None,
    "INSPECT_LIVE_LEASE": "inspect",
    "STALE_OWNER_RESERVES": "reserve",
    "COMP_NUDGE_ONLY": None,
    "UNKNOWN_LIVE_LEASE": "settle",
    "INSPECT_FORGETS_UNSENT": None,
    "INSPECT_REUSED_AS_IS": None,
    "STALE_ATTEMPT_RETRIES": "reserve",
}

# Random runs replayed per bound set (each in a database of its own); ONCEFLOW_MODEL_WALKS raises
# the count (make model-check replays 100 per bound set).
SEEDS = range(1, 1 + int(os.environ.get("ONCEFLOW_MODEL_WALKS", "6")))


@pytest.mark.parametrize("check", DEFAULT_CHECKS, ids=lambda c: c.name)
def test_the_fixed_rules_hold_in_every_state_within_small_bounds(check: Check, tmp_path: Path) -> None:
    build = Build(tmp_path, check.defines, memory_mb=check.memory_mb)
    verdict = build.verify()
    assert verdict.complete, f"the search stopped short ({check.name}):\n{verdict.output[-2000:]}"
    assert verdict.errors == 0, f"{check.name}: {verdict.violated}\n" + "\n".join(build.trail())
    assert verdict.states > 100_000, f"{check.name} explored only {verdict.states} states"


@pytest.mark.parametrize("old", OLD_RULES, ids=lambda o: o.switch)
async def test_each_old_rule_gives_a_counterexample_that_the_ledger_now_refuses(
    old: OldRule, tmp_path: Path, ledger: Ledger, database_url: str
) -> None:
    build = Build(tmp_path, {**old.bounds, old.switch: 1})
    verdict = build.verify()
    assert verdict.errors >= 1, f"{old.switch} ({old.rule}): SPIN found nothing in {verdict.states} states"
    assert old.breaks in verdict.violated, f"{old.switch} broke {verdict.violated!r}, not {old.breaks!r}"
    lines = build.trail()
    assert any(line.startswith("!!") for line in lines), f"no trail for {old.switch}:\n" + "\n".join(lines)
    replay = Replay(ledger, database_url, "trail", {**old.bounds, old.switch: 1})
    try:
        await replay.run(lines)
        diverged = None
    except Disagreement as disagreement:
        diverged = disagreement
    expected = DIVERGES_AT[old.switch]
    if expected is None:
        assert diverged is None, f"{old.switch}: the ledger disagreed with the model: {diverged}"
        assert replay.steps > 0
    else:
        assert diverged is not None, (
            f"{old.switch}: today's ledger answered as the old rule did at every step:\n" + "\n".join(lines)
        )
        assert diverged.step.op == expected, f"{old.switch}: diverged at {diverged}"


@pytest.mark.parametrize(("receiver", "safe"), [("R_KIT", True), ("R_NOKEY", False)])
def test_the_kits_fence_makes_a_settlement_inside_the_lease_safe(
    receiver: str, safe: bool, tmp_path: Path
) -> None:
    verdict = Build(tmp_path, {**FENCED, "RECEIVER": receiver}).verify()
    if safe:
        assert verdict.complete and verdict.errors == 0, verdict.violated
    else:
        assert verdict.errors >= 1 and "own[" in verdict.violated, verdict.violated


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("check", WALKS, ids=lambda c: c.name)
async def test_random_runs_of_the_model_are_answered_alike_by_the_ledger(
    check: Check, seed: int, tmp_path: Path, ledger: Ledger, database_url: str
) -> None:
    lines = Build(tmp_path, check.defines).simulate(seed)
    assert any(line.startswith("@@ end") for line in lines), "the run did not reach its end:\n" + "\n".join(
        lines
    )
    assert not any(line.startswith("!!") for line in lines), "\n".join(lines)
    steps = await Replay(ledger, database_url, f"walk{seed}", check.defines).run(lines)
    assert steps > 0


# -- the model's actions and the property test's rules -------------------------------------------

_TABLE_ROW = re.compile(r"^\| `([a-z_]+)` \| ([^|]+) \|", re.MULTILINE)


def _model_actions() -> set[str]:
    names: set[str] = set()
    for source in MODEL.glob("*.pml"):
        names.update(re.findall(r'printf\("@@ ([a-z_]+)', source.read_text()))
    return names


def _mapped() -> dict[str, list[str]]:
    text = (Path(__file__).resolve().parent.parent / "docs" / "reliability.md").read_text()
    section = text.split("### The model's actions and the property test's rules", 1)[1].split("\n### ", 1)[0]
    return {action: re.findall(r"`([a-z_]+)`", rules) for action, rules in _TABLE_ROW.findall(section)}


def test_every_action_of_the_model_has_its_rule_in_the_property_test() -> None:
    from tests.test_ledger_properties import LedgerMachine

    rules = {name for name, f in inspect.getmembers(LedgerMachine) if getattr(f, RULE_MARKER, None)}
    actions, mapped = _model_actions(), _mapped()
    assert actions, "no model actions found"
    assert set(mapped) == actions, (
        f"the table and the model differ: only in the model {sorted(actions - set(mapped))}, "
        f"only in the table {sorted(set(mapped) - actions)}"
    )
    for action, named in mapped.items():
        if action in NOT_LEDGER:
            continue  # no ledger transition: the table says which rule stands for its effect, if any
        assert named, f"`{action}` changes the ledger but the table names no property rule for it"
        missing = [name for name in named if name not in rules]
        assert not missing, f"`{action}`: {missing} are not rules of LedgerMachine"
