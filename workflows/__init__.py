"""Workflows: deterministic code only. I/O happens in activities/."""

from onceflow.workflows.agent_run import AgentRunWorkflow
from onceflow.workflows.compensation import CompensationWorkflow
from onceflow.workflows.reconcile import ReconcileWorkflow

ALL_WORKFLOWS = [AgentRunWorkflow, CompensationWorkflow, ReconcileWorkflow]

__all__ = ["ALL_WORKFLOWS", "AgentRunWorkflow", "CompensationWorkflow", "ReconcileWorkflow"]
