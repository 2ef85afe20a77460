"""bench/peers.py's onceflow way: a workflow hosting onceflow's write protocol makes one write call."""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from peers_common import from_prompt

    from onceflow.adapters.host import OnceflowHost, WriteTools
    from onceflow.examples.billing.tools import billing

# -- onceflow -------------------------------------------------------------------------------------------

ONCEFLOW_WRITES = WriteTools(billing, agent="peers-onceflow")


@workflow.defn(name="PeersOnceflowCredit")
class OnceflowCreditWorkflow(OnceflowHost):
    @workflow.run
    async def run(self, text: str) -> dict[str, Any]:
        async with self.onceflow(tenant="bench", agent=ONCEFLOW_WRITES.agent_name):
            outcome = await ONCEFLOW_WRITES.call("issue_credit", "call_credit", from_prompt(text))
        if outcome.status != "completed":
            raise ApplicationError(f"the credit did not go through: {outcome}", non_retryable=True)
        return {"status": str(outcome.status)}
