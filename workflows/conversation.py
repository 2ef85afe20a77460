"""The messages of one agent run, as AgentRunWorkflow holds them and hands them to model turns.

Deterministic code only: it runs inside the workflow.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from onceflow.sdk.payloads import Message, ModelCallInput, ModelTurn


class Conversation:
    """The messages of a run as the workflow holds them.

    Inline, it keeps the whole conversation and sends it every turn (history grows with the square
    of the turns). By reference, it keeps only what was added since the last model turn, and sends
    that with the head of the stored conversation, which the model activity extends and reads.
    """

    def __init__(self, *, run_id: str, tenant: str, agent: str, by_reference: bool) -> None:
        self.run_id = run_id
        self.tenant = tenant
        self.agent = agent
        self.by_reference = by_reference
        self.messages: list[Message] = []  # by reference: only those not stored yet
        self._head: str | None = None
        self._stored = 0
        # By reference: the messages already stored, kept in memory (not in history: replay rebuilds
        # them), so that a conversation the ledger lost can be stored again whole (`store_again`).
        self._sent: list[Message] = []

    def request(self) -> ModelCallInput:
        if not self.by_reference:
            return ModelCallInput(agent=self.agent, run_id=self.run_id, messages=list(self.messages))
        return ModelCallInput(
            agent=self.agent,
            run_id=self.run_id,
            tenant=self.tenant,
            messages=list(self.messages),
            by_reference=True,
            head=self._head,
            length=self._stored,
        )

    def sent(self, answer: ModelTurn) -> None:
        """The model answered the last request: what it carried is stored now."""
        if self.by_reference:
            if answer.conversation_head is None:
                raise ApplicationError(
                    "the model activity did not store the conversation", type="ConversationMissing"
                )
            self._head = answer.conversation_head
            self._stored += len(self.messages)
            self._sent.extend(self.messages)
            self.messages.clear()

    def store_again(self) -> None:
        """The ledger no longer has the stored conversation (a failover to a standby that lacked its
        last messages): the next request carries every message from the first, and stores it again."""
        self.messages[:0] = self._sent
        self._sent = []
        self._head = None
        self._stored = 0
