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
    async def run(self, text: str, writes: int = 1) -> dict[str, Any]:
        """`writes` write calls one after another in the one run (bench/peers.py --writes)."""
        async with self.onceflow(tenant="bench", agent=ONCEFLOW_WRITES.agent_name):
            for n in range(writes):
                # Each its own credit: the same arguments again would be the same intent, and the
                # intent guard would answer it with the first one's result (reuse), sending nothing.
                arguments, call_id = from_prompt(text), "call_credit"
                if n:
                    arguments["account_id"], call_id = f"{arguments['account_id']}_{n}", f"{call_id}_{n}"
                outcome = await ONCEFLOW_WRITES.call("issue_credit", call_id, arguments)
                if outcome.status != "completed":
                    raise ApplicationError(f"the credit did not go through: {outcome}", non_retryable=True)
        return {"status": str(outcome.status)}
