"""onceflow: AI-agent tool calls on Temporal that take effect once."""

from ledger import ToolExecutionRecord
from onceflow.tools import (
    Effect,
    Guards,
    InvalidToolArgumentsError,
    OutcomeStatus,
    ReconcileOutcome,
    Tool,
    ToolContext,
    ToolNotAttemptedError,
    ToolRefusedError,
    ToolRejectedError,
    Toolset,
    destructive,
    external,
    read,
    write,
)

__all__ = [
    "Effect",
    "Guards",
    "InvalidToolArgumentsError",
    "OutcomeStatus",
    "ReconcileOutcome",
    "Tool",
    "ToolContext",
    "ToolExecutionRecord",
    "ToolNotAttemptedError",
    "ToolRefusedError",
    "ToolRejectedError",
    "Toolset",
    "destructive",
    "external",
    "read",
    "write",
]
