"""Activities: everything that touches the world (models, tools, the ledger) lives here."""

from collections.abc import Callable
from typing import Any

from onceflow.activities.compensation import CompensationActivities
from onceflow.activities.ledger_steps import LedgerActivities
from onceflow.activities.model import ModelActivities
from onceflow.activities.outcomes import default_identity
from onceflow.activities.reconcile import ReconcileActivities
from onceflow.activities.signal_door import SignalDoor
from onceflow.activities.tools import ToolActivities
from onceflow.ledger import Ledger
from onceflow.ledger.conversations import Conversations
from onceflow.runtime.agents import AgentRegistry

__all__ = [
    "CompensationActivities",
    "LedgerActivities",
    "ModelActivities",
    "ReconcileActivities",
    "SignalDoor",
    "ToolActivities",
    "all_activities",
    "default_identity",
]


def all_activities(
    ledger: Ledger, registry: AgentRegistry, worker_identity: str, door: SignalDoor | None = None
) -> list[Callable[..., Any]]:
    """Every activity a onceflow worker hosts, bound to its ledger and agents; `door`: what a
    resolve signal from outside the API may settle (default open)."""
    model = ModelActivities(registry, Conversations(ledger))
    tools = ToolActivities(ledger, registry, worker_identity)
    steps = LedgerActivities(ledger, door)
    reconcile = ReconcileActivities(ledger, registry)
    compensation = CompensationActivities(ledger, registry, worker_identity)
    return [
        model.describe_agent,
        model.call_model,
        tools.run_read_tool,
        tools.run_write_tool,
        steps.inspect_call,
        steps.record_outcome,
        steps.settle_call,
        steps.expire_approval,
        steps.escalate_call,
        reconcile.reconcile_call,
        compensation.plan_compensation,
        compensation.run_compensation,
        compensation.finish_compensation,
    ]
