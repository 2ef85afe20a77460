"""The console's pages: sign-in, the queue, one call. GETs only read; every change is a POST."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from onceflow.activities.compensation import COMPENSATION_SUFFIX
from onceflow.api.console import forms
from onceflow.api.console.calls import OperatorCalls, count_queue
from onceflow.api.console.receiver import receiver_of
from onceflow.api.console.rendering import redirect, render
from onceflow.ledger import OperatorTokens
from onceflow.workflows.compensation import compensation_workflow_id

router = APIRouter(prefix="/console", include_in_schema=False)

UNRESOLVED = "indeterminate,started,awaiting_approval,held"
# What each "show" choice asks the JSON API for.
SHOW = {
    "all": {"status": UNRESOLVED},
    "unknown": {"status": "indeterminate,started", "conflict": "false"},
    "awaiting_approval": {"status": "awaiting_approval", "conflict": "false"},
    "held": {"status": "held", "conflict": "false"},
    "conflict": {"conflict": "true"},
    "escalated": {"status": UNRESOLVED, "escalated": "true"},
}
SHOW_LABELS = {
    "all": "Everything unresolved",
    "unknown": "Unknown",
    "awaiting_approval": "Awaiting approval",
    "held": "Held",
    "conflict": "Conflicts",
    "escalated": "Escalated",
}
PAGE_SIZES = (25, 50, 100, 200)


def run_url(request: Request, key: str, run_id: str) -> str:
    """The run (or the compensation workflow) of a call in the Temporal UI."""
    if key.endswith(COMPENSATION_SUFFIX):
        workflow_id = compensation_workflow_id(key.removesuffix(COMPENSATION_SUFFIX))
    else:
        workflow_id = run_id
    base = request.app.state.console_temporal_ui.rstrip("/")
    namespace = request.app.state.console_namespace
    return f"{base}/namespaces/{namespace}/workflows/{workflow_id}"


def signed_in(session: forms.Session | None) -> forms.Session:
    if session is None:
        raise _SignIn()
    return session


class _SignIn(Exception):
    """No session: pages send the browser to the sign-in form."""


@router.get("/sign-in")
async def sign_in_page(request: Request) -> Response:
    return _sign_in_form(request)


def _sign_in_form(request: Request, error: str | None = None, status_code: int = 200) -> Response:
    nonce = forms.new_sign_in_nonce()
    response = render(request, "sign_in.html", {"error": error, "csrf": nonce, "session": None}, status_code)
    forms.remember_sign_in_nonce(request, response, nonce)
    return response


@router.post("/sign-in")
async def sign_in(request: Request) -> Response:
    fields = await forms.form_of(request)
    try:
        forms.check_sign_in(request, fields)
    except forms.CrossSiteRequest as exc:
        return _sign_in_form(request, f"Please sign in again: {exc}.", 403)
    token = fields.get("token", "").strip()
    tokens: OperatorTokens = request.app.state.tokens
    if not token or await tokens.authenticate(token) is None:
        return _sign_in_form(request, "That token is unknown or revoked.", 401)
    response = redirect("/console")
    forms.start_session(request, response, token)
    return response


@router.post("/sign-out")
async def sign_out(request: Request) -> Response:
    session = signed_in(await forms.current_session(request))
    forms.check_post(request, session, await forms.form_of(request))
    response = redirect("/console/sign-in")
    forms.end_session(response)
    return response


def _filters(request: Request) -> dict[str, Any]:
    query = request.query_params
    show = query.get("show", "all")
    if show not in SHOW:
        show = "all"
    try:
        limit = int(query.get("limit", "50"))
    except ValueError:
        limit = 50
    return {
        "show": show,
        "tool": query.get("tool", "").strip(),
        "agent": query.get("agent", "").strip(),
        "limit": limit if limit in PAGE_SIZES else 50,
        "cursor": query.get("cursor", ""),
    }


@router.get("")
async def queue(request: Request) -> Response:
    session = signed_in(await forms.current_session(request))
    chosen = _filters(request)
    params: dict[str, str] = {**SHOW[chosen["show"]], "limit": str(chosen["limit"])}
    for name in ("tool", "agent", "cursor"):
        if chosen[name]:
            params[name] = chosen[name]
    answer = await OperatorCalls(request.app, session.token).request(
        "GET", "/v1/tool-executions", params=params
    )
    counts = await count_queue(
        request.app.state.ledger,
        session.operator.tenant,
        tool=chosen["tool"] or None,
        agent=chosen["agent"] or None,
    )
    items = answer.body.get("items", []) if answer.ok else []
    context = {
        "session": session,
        "filters": chosen,
        "show_labels": SHOW_LABELS,
        "page_sizes": PAGE_SIZES,
        "counts": counts,
        "items": items,
        "next_cursor": answer.body.get("next_cursor") if answer.ok else None,
        "problem": answer.problem,
        "bulk": bool(chosen["tool"]),
    }
    return render(request, "queue.html", context, 200 if answer.ok else answer.status)


@router.get("/calls/{key}")
async def call_page(request: Request, key: str) -> Response:
    session = signed_in(await forms.current_session(request))
    calls = OperatorCalls(request.app, session.token)
    answer = await calls.execution(key)
    if answer.status == 404 and await _compensation_asked_for(calls, key):
        # Asked for, and not yet recorded: its workflow reserves it when it starts, a moment after
        # the operator's "Compensation started". The page looks again rather than say "not found".
        original = key.removesuffix(COMPENSATION_SUFFIX)
        problem = {
            "title": "Not recorded yet",
            "detail": f"The compensation of {original} was asked for; its workflow records this call when "
            "it starts. This page looks again every 2 seconds.",
        }
        context = {"session": session, "problem": problem, "key": original, "refresh_seconds": 2}
        return render(request, "problem.html", context)
    if not answer.ok:
        return render(request, "problem.html", {"session": session, "problem": answer.problem}, answer.status)
    call = answer.body
    events = call.get("events") or []
    context = {
        "session": session,
        "call": call,
        "events": events,
        "reconcile_events": [e for e in events if e.get("source") == "reconciler"],
        "run_url": run_url(request, call["key"], call["run_id"]),
        "asks_receiver": receiver_of(request.app, call) is not None,
    }
    return render(request, "call.html", context)


async def _compensation_asked_for(calls: OperatorCalls, key: str) -> bool:
    """Is `key` the compensation of a call whose compensation an operator asked for?"""
    if not key.endswith(COMPENSATION_SUFFIX):
        return False
    original = await calls.execution(key.removesuffix(COMPENSATION_SUFFIX))
    if not original.ok:
        return False
    return any(event.get("kind") == "compensation_requested" for event in original.body.get("events") or [])


def install_handlers(app: Any) -> None:
    async def to_sign_in(request: Request, exc: Exception) -> Response:
        return redirect("/console/sign-in")

    async def cross_site(request: Request, exc: Exception) -> Response:
        session = await forms.current_session(request)
        problem = {"title": "Refused", "detail": f"Nothing was changed: {exc}.", "status": 403}
        return render(request, "problem.html", {"session": session, "problem": problem}, 403)

    app.add_exception_handler(_SignIn, to_sign_in)
    app.add_exception_handler(forms.CrossSiteRequest, cross_site)
