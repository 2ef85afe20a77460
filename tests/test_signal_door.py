"""The signal door on a verified deployment (ONCEFLOW_SIGNALS=verified): a `resolve` signal or update
from outside the API settles a call only with an operator assertion the API signed for this tenant
and key, not yet expired. Unsigned, forged, expired and another tenant's change nothing and are
logged and shown on the run; a valid one settles once, recorded as the operator the API named.
The console and `onceflow executions resolve` work as ever. Real Temporal, ledger, worker and API.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import pytest
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError
from temporalio.testing import WorkflowEnvironment

from onceflow.activities.signal_door import Assertion, SignalDoor, SignalRefused, SignalsMode, sign
from onceflow.api.options import ApiOptions
from onceflow.ledger import Ledger, Status
from onceflow.sdk.payloads import Phase, ResolveSignal
from onceflow.workflows.agent_run import AgentRunWorkflow
from tests.support.agents import support_registry
from tests.support.downstream import DOWNSTREAM
from tests.support.operator_api import OperatorApi, serving_api
from tests.test_agent_run import wait_for_phase
from tests.test_executions_cli import cli, put_call

KEY = "k" * 40  # the secret the API and the workers share in this test
OTHER_KEY = "z" * 40


@pytest.fixture
async def verified(temporal_env: WorkflowEnvironment, ledger: Ledger) -> AsyncIterator[OperatorApi]:
    DOWNSTREAM.reset()
    door = SignalDoor(SignalsMode.VERIFIED, KEY)
    async with serving_api(
        temporal_env.client,
        ledger,
        support_registry(),
        options=ApiOptions(signal_key=KEY),
        worker={"signal_door": door},
    ) as api:
        yield api


async def _paused_run(api: OperatorApi) -> tuple[WorkflowHandle[Any, Any], str]:
    order_id = f"o{uuid.uuid4().hex[:8]}"
    DOWNSTREAM.modes[f"acct_{order_id}"] = "hang_after_apply"
    handle = await api.runs.start("credit-pause", json.dumps({"order_id": order_id}))
    await wait_for_phase(handle, Phase.AWAITING_RECONCILIATION)
    return handle, f"{handle.id}:call_1_0"


async def _refused(
    handle: WorkflowHandle[Any, Any], caplog: pytest.LogCaptureFixture, before: int, words: str
) -> str:
    """Wait for the worker to log one more refusal at the door, saying `words`; the run shows it."""
    async with asyncio.timeout(20):
        while (
            len(refusals := [r.getMessage() for r in caplog.records if "signal door" in r.getMessage()])
            <= before
        ):
            await asyncio.sleep(0.05)
        assert len(refusals) == before + 1 and words in refusals[-1], refusals
        while words not in (shown := (await handle.query(AgentRunWorkflow.status)).last_resolve_error or ""):
            await asyncio.sleep(0.05)
    return shown


async def test_only_a_valid_assertion_lets_a_signal_settle_and_it_settles_once(
    verified: OperatorApi, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    handle, key = await _paused_run(verified)
    soon = datetime.now(UTC) + timedelta(minutes=5)

    def resolve(
        assertion: str | None, actor: str = "mallory", status: Literal["completed", "failed"] = "failed"
    ) -> ResolveSignal:
        return ResolveSignal(
            key=key,
            status=status,
            reason="says so",
            actor=actor,
            assertion=assertion,
        )

    genuine = sign(KEY, Assertion(tenant="acme", key=key, operator="alice", expires_at=soon))
    payload = genuine.split(".")[1]
    tampered = sign(KEY, Assertion(tenant="acme", key=key, operator="mallory", expires_at=soon))
    # Another tenant's operator asks the API for an assertion for a call of theirs.
    theirs = await put_call(verified.ledger, tenant="globex")
    async with await verified.as_operator(tenant="globex", operator="gus") as gus:
        answer = await gus.post(f"/v1/tool-executions/{theirs}/assertion", json={"expires_in": 60})
        assert answer.status_code == 200, answer.text
        globex = answer.json()["assertion"]
        # ...and cannot get one for acme's call: another tenant's key is not found.
        refused = await gus.post(f"/v1/tool-executions/{key}/assertion", json={})
        assert refused.status_code == 404
    attempts = {
        "unsigned": (resolve(None), "only with an operator assertion"),
        "forged with another key": (
            resolve(sign(OTHER_KEY, Assertion("acme", key, "mallory", soon))),
            "signature does not match",
        ),
        "a genuine payload, signed by hand": (
            resolve(f"ofa1.{payload}.{tampered.split('.')[2]}"),
            "signature does not match",
        ),
        "garbage": (resolve("ofa1.???.!!!"), "malformed"),
        "expired": (
            resolve(sign(KEY, Assertion("acme", key, "alice", datetime.now(UTC) - timedelta(seconds=1)))),
            "expired at",
        ),
        "another tenant's, from the API": (resolve(globex), "for another call"),
        "another tenant's, for this key": (
            resolve(sign(KEY, Assertion("globex", key, "gus", soon))),
            "for another call",
        ),
    }
    for count, (name, (signal, words)) in enumerate(attempts.items()):
        await handle.signal(AgentRunWorkflow.resolve, signal)
        shown = await _refused(handle, caplog, count, words)
        assert "resolve by signal:mallory refused" in shown, (name, shown)
    # An update is answered with the refusal, before anything is decided.
    with pytest.raises(WorkflowUpdateFailedError) as failed:
        answered = await handle.execute_update(AgentRunWorkflow.resolve_update, resolve(None))
        pytest.fail(f"an unsigned update was answered {answered!r}")
    assert "only with an operator assertion" in str(failed.value.cause)

    record = await verified.ledger.get(key)
    assert (record.status, record.settled_by) == (Status.INDETERMINATE, None)
    assert [e.kind for e in record.events] == ["reserved", "indeterminate"]
    assert (await handle.query(AgentRunWorkflow.status)).phase == Phase.AWAITING_RECONCILIATION

    # Alice asks for one with the CLI, and sends it twice at once, saying two different things:
    # the ledger's compare-and-set lets one settle the call.
    alice = await verified.token(operator="alice")
    made = await cli(verified, "assertion", key, "--expires-in", "120", token=alice)
    assert made.code == 0, made.err
    assertion = made.out.strip()
    assert "as alice in acme" in made.err and assertion.startswith("ofa1.")
    await asyncio.gather(
        handle.signal(AgentRunWorkflow.resolve, resolve(assertion, actor="whoever", status="completed")),
        handle.signal(AgentRunWorkflow.resolve, resolve(assertion, actor="whoever", status="failed")),
    )
    result = await asyncio.wait_for(handle.result(), 20)
    record = await verified.ledger.get(key)
    settles = [e for e in record.events if e.kind == "settled"]
    assert len(settles) == 1 and settles[0].actor == record.settled_by == "signal:alice"
    assert settles[0].detail == {"claimed_actor": "whoever", "asserted_operator": "alice"}
    # What the model was told is what the one settlement said; the receiver got the call once.
    told = [c for c in result.calls if c.key == key]
    assert [c.status for c in told] == [record.status.value]
    assert DOWNSTREAM.received == {key: 1}


async def test_the_console_and_the_cli_settle_as_before_on_a_verified_deployment(
    verified: OperatorApi,
) -> None:
    handle, key = await _paused_run(verified)
    alice = await verified.token(operator="alice")
    settled = await cli(
        verified, "resolve", key, "--status", "completed", "--reason", "in billing", token=alice
    )
    assert settled.code == 0, settled.err
    await asyncio.wait_for(handle.result(), 20)
    record = await verified.ledger.get(key)
    assert (record.status, record.settled_by) == (Status.COMPLETED, "operator:alice")
    assert (await handle.query(AgentRunWorkflow.status)).last_resolve_error is None


async def test_an_api_without_a_signal_key_signs_nothing(operator_api: OperatorApi) -> None:
    key = await put_call(operator_api.ledger)
    async with await operator_api.as_operator() as alice:
        answer = await alice.post(f"/v1/tool-executions/{key}/assertion", json={})
    assert answer.status_code == 409 and answer.json()["type"].endswith("assertions-unavailable")


def test_the_door_setting_is_checked() -> None:
    assert SignalDoor.from_settings("Verified", "") == SignalDoor(SignalsMode.VERIFIED, "")
    with pytest.raises(ValueError, match="ONCEFLOW_SIGNALS must be `open` or `verified`"):
        SignalDoor.from_settings("closed", "")
    with pytest.raises(ValueError, match="at least 32 characters"):
        SignalDoor.from_settings("open", "short")
    # Verified without a key: nothing from outside settles (a clear refusal), an open door lets
    # an unsigned resolve through and still checks an assertion that comes with it.
    now = datetime.now(UTC)
    with pytest.raises(SignalRefused, match="no ONCEFLOW_SIGNAL_KEY"):
        SignalDoor(SignalsMode.VERIFIED).admit(tenant="t", key="r:c", assertion="ofa1.a.b", now=now)
    assert SignalDoor(SignalsMode.OPEN, KEY).admit(tenant="t", key="r:c", assertion=None, now=now) is None
    good = sign(KEY, Assertion("t", "r:c", "ann", now + timedelta(seconds=30)))
    assert SignalDoor(SignalsMode.OPEN, KEY).admit(tenant="t", key="r:c", assertion=good, now=now) == "ann"
    with pytest.raises(SignalRefused, match="expired"):
        SignalDoor(SignalsMode.OPEN, KEY).admit(
            tenant="t", key="r:c", assertion=good, now=now + timedelta(minutes=1)
        )
