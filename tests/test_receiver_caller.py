"""The caller's side of the receiver kit, without a network: what each protocol answer proves about
a call (onceflow.sdk.tools.receivers), how a tool declares its receiver, and how the kit's refusals
read to the write protocol. Over real HTTP and real processes: tests/test_receiver_http.py,
tests/test_receiver_mcp.py, tests/test_console_receiver.py and the receiver drill."""

from __future__ import annotations

from typing import Any

import pytest

from onceflow import ToolContext, Toolset, external, kit_receiver, read
from onceflow.sdk.tools import (
    OutcomeStatus,
    ToolKeyNotFoundError,
    ToolNotAttemptedError,
    ToolRejectedError,
    kit_problem_error,
)
from onceflow.sdk.tools.receivers import ReceiverKit

CONTEXT = ToolContext(
    idempotency_key="run-1:call_1_0", run_id="run-1", tool_call_id="call_1_0", tenant="t", attempt=1
)


class Answering(ReceiverKit):
    """A receiver whose lookup and fence answer what the test says, and which counts the fences."""

    describe = "a test receiver"

    def __init__(self, lookup: dict[str, Any], fence: dict[str, Any] | None = None) -> None:
        self._lookup, self._fence, self.fences = lookup, fence, 0

    async def lookup(self, context: ToolContext) -> dict[str, Any]:
        return self._lookup

    async def fence(self, context: ToolContext) -> dict[str, Any]:
        self.fences += 1
        assert self._fence is not None, "fenced a key the lookup had a record of"
        return self._fence


def completed(status: int, body: Any) -> dict[str, Any]:
    return {
        "key": CONTEXT.idempotency_key,
        "state": "completed",
        "response": {"status": status, "headers": [], "body": body},
    }


async def test_a_completed_key_is_the_calls_result_and_nothing_is_fenced() -> None:
    receiver = Answering(completed(201, {"credit_id": "cr_1"}))
    outcome = await receiver.reconcile(CONTEXT)
    assert outcome.status is OutcomeStatus.COMPLETED and outcome.value == {"credit_id": "cr_1"}
    assert outcome.evidence["via"] == "lookup" and outcome.evidence["source"] == "onceflow.receiver"
    assert receiver.fences == 0


@pytest.mark.parametrize(
    ("answer", "status"),
    [
        (completed(422, {"detail": "account closed"}), OutcomeStatus.FAILED),
        (completed(503, {"detail": "try later"}), OutcomeStatus.UNKNOWN),
        ({"state": "in_progress"}, OutcomeStatus.UNKNOWN),
        ({"state": "fenced"}, OutcomeStatus.FAILED),
    ],
)
async def test_what_each_lookup_answer_proves(answer: dict[str, Any], status: OutcomeStatus) -> None:
    outcome = await Answering(answer).reconcile(CONTEXT)
    assert outcome.status is status
    if answer["state"] == "fenced":
        assert outcome.evidence["no_record_of_key"] is True


@pytest.mark.parametrize(
    ("fence", "status"),
    [
        ({"state": "fenced", "fenced_now": True}, OutcomeStatus.FAILED),
        ({**completed(201, {"credit_id": "cr_2"}), "fenced_now": False}, OutcomeStatus.COMPLETED),
        ({"state": "in_progress", "fenced_now": False}, OutcomeStatus.UNKNOWN),
    ],
)
async def test_no_record_is_fenced_and_the_fence_decides(
    fence: dict[str, Any], status: OutcomeStatus
) -> None:
    receiver = Answering({"state": "absent"}, fence)
    outcome = await receiver.reconcile(CONTEXT)
    assert receiver.fences == 1 and outcome.status is status and outcome.evidence["via"] == "fence"


async def test_a_receiver_that_cannot_be_asked_leaves_the_call_unknown() -> None:
    class Down(ReceiverKit):
        async def lookup(self, context: ToolContext) -> dict[str, Any]:
            raise ConnectionError("refused")

    outcome = await Down().reconcile(CONTEXT)
    assert outcome.status is OutcomeStatus.UNKNOWN and "refused" in outcome.evidence["lookup_error"]


def test_one_line_declares_the_receiver_and_gives_the_tool_its_reconcile() -> None:
    tools = Toolset("t")

    @tools.tool(external(), receiver=kit_receiver("http://billing.internal"))
    async def pay(cents: int, context: ToolContext) -> None: ...

    assert pay.receiver is not None and pay.reconcile is not None
    assert "cents" in pay.json_schema()["parameters"]["properties"]
    with pytest.raises(TypeError, match="change the world"):
        tools.tool(read(), name="look", receiver=kit_receiver("http://x"))(pay.fn)
    with pytest.raises(ValueError, match="exactly one"):
        kit_receiver()


@pytest.mark.parametrize(
    ("slug", "error"),
    [
        ("key-fenced", ToolKeyNotFoundError),
        ("key-reused", ToolRejectedError),
        ("missing-key", ToolNotAttemptedError),
        ("bad-key", ToolNotAttemptedError),
        ("key-in-progress", RuntimeError),
    ],
)
def test_the_kits_refusals_read_as_the_write_protocol_needs(slug: str, error: type[Exception]) -> None:
    found = kit_problem_error({"type": f"https://billing.example/problems/{slug}", "detail": "d"})
    assert type(found) is error
    assert kit_problem_error({"type": "urn:onceflow:receiver:" + slug}) is not None
    assert kit_problem_error({"type": "https://billing.example/problems/rejected"}) is None
