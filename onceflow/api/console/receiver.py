"""Ask the receiver: for a call whose tool's receiver is on onceflow's receiver kit, the console asks
that receiver's own record of the key (the protocol's read-only lookup, never the fence) and shows
the answer, with a resolve form that carries it as evidence. A person decides from the receiver's
record, not from a guess; the lookup itself changes nothing anywhere.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from onceflow.api.console import forms
from onceflow.api.console.calls import OperatorCalls
from onceflow.api.console.rendering import render
from onceflow.sdk.tools import ReceiverKit, ToolContext

router = APIRouter(prefix="/console", include_in_schema=False)

# What each state of the answer means for the person deciding.
MEANING = {
    "completed": "The receiver recorded an answer under this key: the request reached it and was answered.",
    "in_progress": "A request with this key is being handled right now, or its handler died before "
    "recording an answer: nobody knows yet. Ask again later.",
    "fenced": "The receiver has no record of this key and has fenced it: it was not applied and never will be.",
    "absent": "The receiver has no record of this key. Only a fence makes that permanent (the reconciler "
    "fences before it settles); a request still on its way could yet arrive.",
}


def receiver_of(app: Any, call: dict[str, Any]) -> ReceiverKit | None:
    """The kit receiver the call's tool declares, if the API knows the tool and it declares one."""
    registry = getattr(app.state, "registry", None)
    if registry is None or not call.get("agent"):
        return None
    try:
        tool = registry.tool(call["agent"], call["tool"])
    except LookupError:
        return None
    receiver = getattr(tool, "receiver", None)
    return receiver if isinstance(receiver, ReceiverKit) else None


def _suggested_status(answer: dict[str, Any] | None) -> str | None:
    if answer is None:
        return None
    if answer.get("state") == "fenced":
        return "failed"
    status = int((answer.get("response") or {}).get("status", 0))
    if answer.get("state") == "completed":
        return "completed" if 200 <= status < 400 else "failed" if 400 <= status < 500 else None
    return None


@router.get("/calls/{key}/receiver")
async def ask_the_receiver(request: Request, key: str) -> Response:
    from onceflow.api.console.routes import signed_in

    session = signed_in(await forms.current_session(request))
    answer = await OperatorCalls(request.app, session.operator).execution(key)  # the API scopes the tenant
    if not answer.ok:
        return render(request, "problem.html", {"session": session, "problem": answer.problem}, answer.status)
    call = answer.body
    receiver = receiver_of(request.app, call)
    if receiver is None:
        problem = {
            "title": "No receiver to ask",
            "detail": f"{call['tool']}'s receiver does not serve onceflow's receiver kit (or this API does not "
            "load the tool): look in the receiver's own records yourself.",
        }
        return render(request, "problem.html", {"session": session, "problem": problem, "key": key}, 404)
    context = ToolContext(
        idempotency_key=call["key"],
        run_id=call["run_id"],
        tool_call_id=call["tool_call_id"],
        tenant=session.operator.tenant,
        attempt=call.get("attempt", 1),
    )
    asked_at = datetime.now(UTC).isoformat()
    found: dict[str, Any] | None = None
    error: str | None = None
    try:
        found = await receiver.lookup(context)
    except Exception as exc:  # the receiver could not be asked: say so, decide nothing
        error = f"{type(exc).__name__}: {exc}"[:500]
    evidence = {
        "receiver": receiver.describe,
        "asked_at": asked_at,
        "lookup": found if found else {"error": error},
    }
    result = receiver.result_of(found) if found and found.get("state") == "completed" else None
    page = {
        "session": session,
        "call": call,
        "receiver": receiver.describe,
        "asked_at": asked_at,
        "answer": found,
        "error": error,
        "meaning": MEANING.get(str((found or {}).get("state")), ""),
        "suggested": _suggested_status(found),
        "evidence_json": json.dumps(evidence, sort_keys=True),
        "result_json": json.dumps(result, sort_keys=True) if result is not None else "",
        "unresolved": call["status"] in ("indeterminate", "started"),
    }
    return render(request, "receiver.html", page)
