"""onceflow: AI-agent tool calls on Temporal that take effect once."""

from ledger import ToolExecutionRecord
from onceflow.tools import (
    Effect,
    InvalidToolArgumentsError,
    OutcomeStatus,
    ReconcileOutcome,
    Tool,
    ToolContext,
    ToolNotAttemptedError,
    ToolRejectedError,
    Toolset,
    destructive,
    external,
    read,
    write,
)

__all__ = [
    "Effect",
    "InvalidToolArgumentsError",
    "OutcomeStatus",
    "ReconcileOutcome",
    "Tool",
    "ToolContext",
    "ToolExecutionRecord",
    "ToolNotAttemptedError",
    "ToolRejectedError",
    "Toolset",
    "destructive",
    "external",
    "read",
    "write",
]
