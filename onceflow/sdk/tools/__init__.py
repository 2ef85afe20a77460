"""Declaring tools: what they do to the world, how they are called, and how they are checked.

billing = Toolset("billing")

@billing.tool(external(approval=True), reconcile=find_credit, compensation=void_credit)
async def issue_credit(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    ...

The rooms: effects (read, write, external, destructive), guards (the `Guards` declaration and the
ledger guard it becomes for a call), errors (what a tool raises to say how a call ended), the
toolset (Toolset, Tool, ToolContext, ReconcileOutcome), and receivers (a receiver on onceflow's
receiver kit, `kit_receiver`, whose lookup and fence reconcile the tool's unknown calls). This package imports no more than the one
module it replaces did (pydantic and the ledger's records), so workflows may pass it through.
"""

from onceflow.sdk.tools.effects import (
    DEFAULT_TOOL_TIMEOUT,
    READ_ATTEMPTS,
    Effect,
    destructive,
    external,
    read,
    write,
)
from onceflow.sdk.tools.errors import (
    InvalidToolArgumentsError,
    ToolKeyNotFoundError,
    ToolNotAttemptedError,
    ToolRefusedError,
    ToolRejectedError,
)
from onceflow.sdk.tools.guards import REPLACES_ARGUMENT, Guards, as_amount
from onceflow.sdk.tools.receivers import HttpKitReceiver, ReceiverKit, kit_problem_error, kit_receiver
from onceflow.sdk.tools.toolset import (
    CompensationHook,
    OutcomeStatus,
    ReconcileHook,
    ReconcileOutcome,
    Tool,
    ToolContext,
    ToolFunction,
    Toolset,
    to_jsonable,
)

__all__ = [
    "DEFAULT_TOOL_TIMEOUT",
    "READ_ATTEMPTS",
    "REPLACES_ARGUMENT",
    "CompensationHook",
    "Effect",
    "Guards",
    "HttpKitReceiver",
    "InvalidToolArgumentsError",
    "OutcomeStatus",
    "ReceiverKit",
    "ReconcileHook",
    "ReconcileOutcome",
    "Tool",
    "ToolContext",
    "ToolFunction",
    "ToolKeyNotFoundError",
    "ToolNotAttemptedError",
    "ToolRefusedError",
    "ToolRejectedError",
    "Toolset",
    "as_amount",
    "destructive",
    "external",
    "kit_problem_error",
    "kit_receiver",
    "read",
    "to_jsonable",
    "write",
]
