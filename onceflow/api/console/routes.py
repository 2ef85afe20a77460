"""The console's pages: sign-in, the queue, one call. GETs only read; every change is a POST."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from starlette.responses import Response

from onceflow.activities.compensation import COMPENSATION_SUFFIX
from onceflow.api.console import forms
from onceflow.api.console.calls import OperatorCalls, count_queue
from onceflow.api.console.receiver import receiver_of
from onceflow.api.console.rendering import redirect, render
from onceflow.api.console.throttle import SignInThrottle, retry_after
from onceflow.api.inputs import check_query
from onceflow.api.problems import Problem
from onceflow.api.routes.params import CURSOR_MAX, STORABLE, TEXT_FILTER_MAX
from onceflow.ledger import ConsoleSession, OperatorTokens, looks_like_token
from onceflow.ledger.tokens import TOKEN_LENGTH
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


def temporal_ui_url(base: str, namespace: str, workflow_id: str) -> str:
    """A workflow's page in the Temporal UI. Namespace and id are each one encoded path segment: an
    id with `?`, `#` or `/` in it must not open another page."""
    return (
        f"{base.rstrip('/')}/namespaces/{quote(namespace, safe='')}/workflows/{quote(workflow_id, safe='')}"
    )


def run_url(request: Request, key: str, run_id: str) -> str:
    """The run (or the compensation workflow) of a call in the Temporal UI."""
    if key.endswith(COMPENSATION_SUFFIX):
        workflow_id = compensation_workflow_id(key.removesuffix(COMPENSATION_SUFFIX))
    else:
        workflow_id = run_id
    state = request.app.state
    return temporal_ui_url(state.console_temporal_ui, state.console_namespace, workflow_id)


def signed_in(session: ConsoleSession | None) -> ConsoleSession:
    if session is None:
        raise _SignIn()
    return session


class _SignIn(Exception):
    """No session: pages send the browser to the sign-in form."""


@router.get("/sign-in")
async def sign_in_page(request: Request) -> Response:
    return _sign_in_form(request)


def _sign_in_form(
    request: Request, error: str | None = None, status_code: int = 200, retry: float | None = None
) -> Response:
    nonce = forms.new_sign_in_nonce()
    response = render(request, "sign_in.html", {"error": error, "csrf": nonce, "session": None}, status_code)
    forms.remember_sign_in_nonce(request, response, nonce)
    if retry is not None:
        response.headers["Retry-After"] = retry_after(retry)
    return response


def _too_many(request: Request, wait: float, whose: str) -> Response:
    error = f"Too many sign-in attempts {whose}. Wait {retry_after(wait)} s, then try again."
    return _sign_in_form(request, error, 429, retry=wait)


@router.post("/sign-in")
async def sign_in(request: Request) -> Response:
    """Checked in this order, so that nothing is asked of the ledger for a guess of the wrong
    shape: the form is this site's, the proxy (if any) is trusted, the client has attempts left,
    the token has the shape of a token, its prefix has attempts left, and only then the ledger."""
    fields = await forms.form_of(request)
    try:
        forms.check_sign_in(request, fields)
        forms.check_proxy(request)
    except forms.CrossSiteRequest as exc:
        return _sign_in_form(request, f"Please sign in again: {exc}.", 403)
    except forms.UntrustedProxy as exc:
        return _sign_in_form(request, f"Not signed in: {exc}.", 400)
    throttle: SignInThrottle = request.app.state.sign_in_throttle
    client = "client:" + (request.client.host if request.client else "unknown")
    if wait := throttle.take(client):
        return _too_many(request, wait, "from your address")
    token = fields.get("token", "").strip()
    if not looks_like_token(token):
        error = (
            f"That is not an operator token: a token starts with oft_ and is {TOKEN_LENGTH} characters long."
        )
        return _sign_in_form(request, error, 401)
    prefix = "prefix:" + token[:12]
    if wait := throttle.take(prefix):
        return _too_many(request, wait, "with tokens that start like this one")
    tokens: OperatorTokens = request.app.state.tokens
    operator = await tokens.authenticate(token)
    started = None if operator is None else await request.app.state.console_sessions.start(operator)
    if started is None:
        return _sign_in_form(request, "That token is unknown or revoked.", 401)
    throttle.give_back(client)
    throttle.give_back(prefix)
    _, secret = started
    response = redirect("/console")
    forms.start_session(request, response, secret)
    return response


@router.post("/sign-out")
async def sign_out(request: Request) -> Response:
    session = signed_in(await forms.current_session(request))
    forms.check_post(request, session, await forms.form_of(request))
    response = redirect("/console/signed-out")
    await forms.end_session(request, response)
    return response


@router.get("/signed-out")
async def signed_out(request: Request) -> Response:
    return render(request, "signed_out.html", {"session": None})


class BadQuery(Exception):
    """A console query the API's own checks refuse: answered 400, nothing read."""


QUEUE_QUERY = frozenset({"show", "tool", "agent", "limit", "cursor"})


def _filters(request: Request) -> dict[str, Any]:
    """The queue's filters, checked as the JSON API checks its query (onceflow/api/inputs.py and
    routes/params.py): each parameter known and given once, text PostgreSQL can store and not too
    long, a choice among those offered."""
    query = request.query_params
    try:
        check_query(query, QUEUE_QUERY)
    except Problem as problem:
        raise BadQuery(problem.detail) from None
    show = query.get("show", "all")
    if show not in SHOW:
        raise BadQuery(f"show must be one of {', '.join(SHOW)}")
    limit = query.get("limit", "50")
    if limit not in {str(size) for size in PAGE_SIZES}:
        raise BadQuery(f"limit must be one of {', '.join(str(size) for size in PAGE_SIZES)}")
    chosen: dict[str, Any] = {"show": show, "limit": int(limit)}
    for name, longest in (("tool", TEXT_FILTER_MAX), ("agent", TEXT_FILTER_MAX), ("cursor", CURSOR_MAX)):
        value = query.get(name, "").strip()
        if len(value) > longest or not re.fullmatch(STORABLE, value):
            raise BadQuery(f"{name} must be at most {longest} characters, without NUL")
        chosen[name] = value
    return chosen


@router.get("")
async def queue(request: Request) -> Response:
    session = signed_in(await forms.current_session(request))
    try:
        chosen = _filters(request)
    except BadQuery as exc:
        problem = {"title": "Invalid request", "detail": f"Nothing was read: {exc}.", "status": 400}
        return render(request, "problem.html", {"session": session, "problem": problem}, 400)
    params: dict[str, str] = {**SHOW[chosen["show"]], "limit": str(chosen["limit"])}
    for name in ("tool", "agent", "cursor"):
        if chosen[name]:
            params[name] = chosen[name]
    answer = await OperatorCalls(request.app, session.operator).request(
        "GET", "/v1/tool-executions", params=params
    )
    if not answer.ok:
        return render(request, "problem.html", {"session": session, "problem": answer.problem}, answer.status)
    counts = await count_queue(
        request.app.state.ledger,
        session.operator.tenant,
        tool=chosen["tool"] or None,
        agent=chosen["agent"] or None,
    )
    context = {
        "session": session,
        "filters": chosen,
        "filtered": any(chosen[name] for name in ("tool", "agent", "cursor"))
        or chosen["show"] != "all"
        or chosen["limit"] != 50,
        "show_labels": SHOW_LABELS,
        "page_sizes": PAGE_SIZES,
        "counts": counts,
        "items": answer.body.get("items", []),
        "next_cursor": answer.body.get("next_cursor"),
        "bulk": bool(chosen["tool"]),
    }
    return render(request, "queue.html", context)


@router.get("/calls/{key}")
async def call_page(request: Request, key: str) -> Response:
    session = signed_in(await forms.current_session(request))
    calls = OperatorCalls(request.app, session.operator)
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
