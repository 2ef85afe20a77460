"""Workflows: deterministic code only. I/O happens in activities/."""

from workflows.agent_run import AgentRunWorkflow
from workflows.compensation import CompensationWorkflow
from workflows.reconcile import ReconcileWorkflow

ALL_WORKFLOWS = [AgentRunWorkflow, CompensationWorkflow, ReconcileWorkflow]

__all__ = ["ALL_WORKFLOWS", "AgentRunWorkflow", "CompensationWorkflow", "ReconcileWorkflow"]
