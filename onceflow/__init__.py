"""onceflow: AI-agent tool calls on Temporal that take effect once.

The public names below are imported on first use, not when `onceflow` is imported: Temporal's
workflow sandbox re-imports a workflow module's parent packages, and a package that imported the
ledger and the tool SDK eagerly would hand the sandbox second copies of their classes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from onceflow.ledger import ToolExecutionRecord
    from onceflow.runtime.client import connect, start_run
    from onceflow.runtime.plugin import OnceflowPlugin, OnceflowStartupError
    from onceflow.sdk.payloads import AgentRunInput, AgentRunResult
    from onceflow.sdk.testing import assert_tool_contract
    from onceflow.sdk.tools import (
        Effect,
        Guards,
        InvalidToolArgumentsError,
        OutcomeStatus,
        ReconcileOutcome,
        Tool,
        ToolContext,
        ToolKeyNotFoundError,
        ToolNotAttemptedError,
        ToolRefusedError,
        ToolRejectedError,
        Toolset,
        destructive,
        external,
        kit_receiver,
        read,
        write,
    )

_HOMES = {
    "onceflow.sdk.tools": [
        "Effect",
        "Guards",
        "InvalidToolArgumentsError",
        "OutcomeStatus",
        "ReconcileOutcome",
        "Tool",
        "ToolContext",
        "ToolKeyNotFoundError",
        "ToolNotAttemptedError",
        "ToolRefusedError",
        "ToolRejectedError",
        "Toolset",
        "destructive",
        "external",
        "kit_receiver",
        "read",
        "write",
    ],
    "onceflow.sdk.testing": ["assert_tool_contract"],
    "onceflow.sdk.payloads": ["AgentRunInput", "AgentRunResult"],
    "onceflow.runtime.client": ["connect", "start_run"],
    "onceflow.runtime.plugin": ["OnceflowPlugin", "OnceflowStartupError"],
    "onceflow.ledger": ["ToolExecutionRecord"],
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "AgentRunInput",
    "AgentRunResult",
    "Effect",
    "Guards",
    "InvalidToolArgumentsError",
    "OnceflowPlugin",
    "OnceflowStartupError",
    "OutcomeStatus",
    "ReconcileOutcome",
    "Tool",
    "ToolContext",
    "ToolExecutionRecord",
    "ToolKeyNotFoundError",
    "ToolNotAttemptedError",
    "ToolRefusedError",
    "ToolRejectedError",
    "Toolset",
    "assert_tool_contract",
    "connect",
    "destructive",
    "external",
    "kit_receiver",
    "read",
    "start_run",
    "write",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'onceflow' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
