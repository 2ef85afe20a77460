from ledger import CallIdentity, Ledger, Reservation, SideEffect, Status


async def test_reserve_then_complete_returns_recorded_result(ledger: Ledger) -> None:
    call = CallIdentity(tenant="t1", run_id="run-1", tool_call_id="c1")
    first = await ledger.reserve(
        call,
        tool_name="issue_credit",
        side_effect=SideEffect.EXTERNAL,
        arguments={"amount_cents": 500},
        owner="w1",
    )
    assert first.outcome is Reservation.NEW
    done = await ledger.complete(call.key, owner="w1", result={"credit_id": "cr_1"})
    assert done.status is Status.COMPLETED
    again = await ledger.reserve(
        call,
        tool_name="issue_credit",
        side_effect=SideEffect.EXTERNAL,
        arguments={"amount_cents": 500},
        owner="w2",
    )
    assert again.outcome is Reservation.COMPLETED
    assert again.record.result == {"credit_id": "cr_1"}
    record = await ledger.get(call.key)
    assert [e.kind for e in record.events] == ["reserved", "completed"]
