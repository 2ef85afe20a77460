"""Everything that crosses the Temporal boundary: workflow, activity and signal inputs and outputs.

The payloads live in four modules by what they carry; every name stays importable from here:
model_payloads.py (a model turn's request and answer, the agent and tool specs, and `Frozen`, the
base of every payload), run_payloads.py (a run's input and result, the `status` query's answer),
signal_payloads.py (the signals a run is sent) and call_payloads.py (one tool call: the write
activity's input and outcome, the ledger steps about it, reconciling and compensating it, what a
result may hold).
"""

from __future__ import annotations

from onceflow.sdk.call_payloads import (
    RESULT_MAX_DEPTH,
    CallRef,
    CompensationInput,
    CompensationPlan,
    CompensationResult,
    EscalateInput,
    ExpireApprovalInput,
    OwnerOutcome,
    ReconcileInput,
    ReconcileResult,
    SettleInput,
    SettleResult,
    ToolCallInput,
    ToolOutcome,
    result_problem,
)
from onceflow.sdk.model_payloads import (
    AgentSpec,
    Frozen,
    Message,
    ModelCallInput,
    ModelSpec,
    ModelTurn,
    TokenUsage,
    ToolCall,
    ToolPolicySpec,
    ToolSpec,
)
from onceflow.sdk.run_payloads import (
    AgentRunInput,
    AgentRunResult,
    CallSummary,
    Phase,
    RunStatus,
)
from onceflow.sdk.signal_payloads import (
    ConflictSignal,
    EscalatedSignal,
    ResolveSignal,
)

__all__ = [
    "RESULT_MAX_DEPTH",
    "AgentRunInput",
    "AgentRunResult",
    "AgentSpec",
    "CallRef",
    "CallSummary",
    "CompensationInput",
    "CompensationPlan",
    "CompensationResult",
    "ConflictSignal",
    "EscalateInput",
    "EscalatedSignal",
    "ExpireApprovalInput",
    "Frozen",
    "Message",
    "ModelCallInput",
    "ModelSpec",
    "ModelTurn",
    "OwnerOutcome",
    "Phase",
    "ReconcileInput",
    "ReconcileResult",
    "ResolveSignal",
    "RunStatus",
    "SettleInput",
    "SettleResult",
    "TokenUsage",
    "ToolCall",
    "ToolCallInput",
    "ToolOutcome",
    "ToolPolicySpec",
    "ToolSpec",
    "result_problem",
]
