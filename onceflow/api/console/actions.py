"""The console's decisions: each form is posted twice, once to see what will happen, once to do it.

The first POST changes nothing: it shows the call, the decision and its consequence, with a button
that posts the same fields again, confirmed. The second asks the JSON API, as the operator, and
shows its answer; on a 409 that is who decided first, and when.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from onceflow.api.console import forms
from onceflow.api.console.calls import Answer, OperatorCalls
from onceflow.api.console.rendering import render
from onceflow.api.console.routes import signed_in
from onceflow.ledger import ConsoleSession

router = APIRouter(prefix="/console", include_in_schema=False)

MAX_BULK = 200
RESOLVABLE = ("indeterminate", "started")


@dataclass(frozen=True)
class Action:
    title: str  # the button
    done: str  # the headline once it worked
    consequence: str  # what will happen, on the confirmation page
    fields: tuple[str, ...]  # reason, evidence, result, status


ACTIONS = {
    "resolve": Action(
        "Resolve",
        "Resolved",
        "The ledger records the call as {status}, decided by you. The run waiting on it is told and goes "
        "on as though the call had {status}; nothing is sent to the receiver. If someone decided first, "
        "theirs stands and you are told who.",
        ("status", "reason", "evidence", "result"),
    ),
    "approve": Action(
        "Approve",
        "Approved",
        "The call is sent to the receiver, once, with exactly the payload shown on its page.",
        ("reason",),
    ),
    "deny": Action(
        "Deny",
        "Denied",
        "The call is never sent. The run is told, and the model hears that it was denied.",
        ("reason",),
    ),
    "compensate": Action(
        "Compensate",
        "Compensation started",
        "The tool's compensation runs (once, however often it is asked for) to undo the effect, and "
        "the call is then marked compensated.",
        ("reason",),
    ),
    "acknowledge-conflict": Action(
        "Acknowledge conflict",
        "Conflict acknowledged",
        "The ledger records the call as {status}, on your evidence, for good: it is never sent again, "
        "and budgets count it as {status}. The conflict is closed with your note of what you did.",
        ("status", "reason", "evidence"),
    ),
    "release": Action(
        "Release",
        "Released",
        "The call was never sent, and now never will be: it is recorded as failed (released), gives up "
        "its entity slot and budget amount, and the run is told it did not take effect.",
        ("reason",),
    ),
    "nudge": Action(
        "Nudge the run",
        "Nudged",
        "The run waiting on this call is asked to read the ledger now. This decides nothing.",
        (),
    ),
}


class BadField(ValueError):
    pass


def _json_field(fields: dict[str, str], name: str) -> Any:
    text = fields.get(name, "").strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadField(f"{name} is not JSON ({exc.msg}, line {exc.lineno} column {exc.colno})") from None


def request_body(action: Action, fields: dict[str, str]) -> dict[str, Any] | None:
    """The JSON body the API takes for this action, from the form's fields (None: no body)."""
    if not action.fields:
        return None
    body: dict[str, Any] = {}
    for name in action.fields:
        if name in ("evidence", "result"):
            value = _json_field(fields, name)
            if value is not None:
                body[name] = value
        elif name == "reason":
            reason = fields.get("reason", "")
            if reason.strip() or action is not ACTIONS["approve"]:
                body["reason"] = reason
        else:
            body[name] = fields.get(name, "")
    return body


def _context(session: ConsoleSession, **more: Any) -> dict[str, Any]:
    return {"session": session, **more}


@router.post("/calls/{key}/actions/{name}")
async def act(request: Request, key: str, name: str) -> Response:
    session = signed_in(await forms.current_session(request))
    fields = await forms.form_of(request)
    forms.check_post(request, session, fields)
    action = ACTIONS.get(name)
    if action is None:
        problem = {"title": "No such action", "detail": f"there is no action {name!r}", "status": 404}
        return render(request, "problem.html", _context(session, problem=problem), 404)
    calls = OperatorCalls(request.app, session.operator)
    try:
        body = request_body(action, fields)
    except BadField as exc:
        problem = {"title": "Not sent", "detail": f"Nothing was changed: {exc}.", "status": 400}
        return render(request, "problem.html", _context(session, problem=problem, key=key), 400)
    if fields.get("confirmed") != "yes":
        shown = await calls.execution(key)
        if not shown.ok:
            return render(request, "problem.html", _context(session, problem=shown.problem), shown.status)
        context = _context(session, call=shown.body, name=name, action=action, body=body, fields=fields)
        return render(request, "confirm.html", context)
    answer = await calls.decide(key, name, body)
    context = _context(session, key=key, name=name, action=action, answer=answer)
    return render(request, "outcome.html", context, answer.status)


@dataclass
class BulkOutcome:
    key: str
    answer: Answer

    @property
    def verdict(self) -> str:
        if self.answer.ok:
            # A second tab, or the form sent twice: the ledger had this very decision of yours.
            return "already yours" if self.answer.body.get("repeated") else "won"
        if self.answer.status == 409:
            return "lost"
        return "refused"


@router.post("/bulk-resolve")
async def bulk_resolve(request: Request) -> Response:
    """Resolve many calls of one tool with one reason; each is still its own compare-and-set."""
    session = signed_in(await forms.current_session(request))
    fields = await forms.form_of(request)
    forms.check_post(request, session, fields)
    keys = list(dict.fromkeys(await forms.keys_of(request)))
    tool = fields.get("tool", "")
    calls = OperatorCalls(request.app, session.operator)

    def refuse(detail: str) -> Response:
        problem = {"title": "Not sent", "detail": f"Nothing was changed: {detail}.", "status": 400}
        return render(request, "problem.html", _context(session, problem=problem), 400)

    if not keys:
        return refuse("no call was selected")
    if len(keys) > MAX_BULK:
        return refuse(f"select at most {MAX_BULK} calls at once")
    try:
        body = request_body(ACTIONS["resolve"], fields)
    except BadField as exc:
        return refuse(str(exc))
    if fields.get("confirmed") != "yes":
        shown = [await calls.execution(key) for key in keys]
        missing = [k for k, a in zip(keys, shown, strict=True) if not a.ok]
        if missing:
            return refuse(f"these calls cannot be read: {', '.join(missing)}")
        records = [a.body for a in shown]
        others = sorted({r["tool"] for r in records} - {tool})
        if others:
            return refuse(f"every call must be of the tool {tool!r}; some are of {', '.join(others)}")
        context = _context(session, records=records, body=body, fields=fields, tool=tool)
        return render(request, "bulk_confirm.html", context)
    outcomes = []
    for key in keys:
        current = await calls.execution(key)
        if current.ok and current.body["tool"] != tool:
            detail = f"{key} is a call of {current.body['tool']}, not {tool}; left alone"
            outcomes.append(BulkOutcome(key, Answer(400, {"detail": detail})))
            continue
        outcomes.append(BulkOutcome(key, await calls.decide(key, "resolve", body)))
    context = _context(
        session,
        outcomes=outcomes,
        tool=tool,
        body=body,
        won=sum(o.verdict == "won" for o in outcomes),
        yours=sum(o.verdict == "already yours" for o in outcomes),
        lost=sum(o.verdict == "lost" for o in outcomes),
        refused=sum(o.verdict == "refused" for o in outcomes),
    )
    return render(request, "bulk_outcome.html", context)
