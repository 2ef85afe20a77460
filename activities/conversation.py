"""The conversation a model turn sees, when the run passes it by reference (ledger/conversations.py)."""

from __future__ import annotations

from temporalio.exceptions import ApplicationError

from onceflow.ledger import LedgerUnavailableError
from onceflow.ledger.conversations import ConversationMissingError, Conversations
from onceflow.runtime.constants import ERR_LEDGER_UNAVAILABLE
from onceflow.sdk.payloads import Message, ModelCallInput

ERR_CONVERSATION_MISSING = "ConversationMissing"


async def whole_conversation(
    conversations: Conversations, request: ModelCallInput
) -> tuple[ModelCallInput, str]:
    """Store the request's new messages onto its conversation; return the request with the whole
    conversation inline, and the conversation's new head."""
    try:
        head = await conversations.extend(
            tenant=request.tenant,
            run_id=request.run_id,
            head=request.head,
            length=request.length,
            messages=[m.model_dump(mode="json") for m in request.messages],
        )
        stored = await conversations.read(head, length=request.length + len(request.messages))
    except ConversationMissingError as exc:
        raise ApplicationError(str(exc), type=ERR_CONVERSATION_MISSING, non_retryable=True) from exc
    except LedgerUnavailableError as exc:
        # Retried like any outage; short, without the driver's chain (it outgrows Temporal's limit).
        raise ApplicationError(f"conversation not stored: {exc}", type=ERR_LEDGER_UNAVAILABLE) from None
    whole = [Message.model_validate(m) for m in stored]
    return request.model_copy(
        update={"messages": whole, "by_reference": False, "head": None, "length": 0}
    ), head
