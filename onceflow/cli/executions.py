"""`onceflow executions`: find tool calls nobody can vouch for, and settle, approve, deny, release or
undo them.

Everything goes through the operator HTTP API, never to the database: the API checks the token,
scopes every key to the token's tenant and records the operator on each decision.

Configuration: `ONCEFLOW_API` (default http://127.0.0.1:8082) and `ONCEFLOW_TOKEN` (from
`onceflow tokens create`), or `--api` and `--token` on any command.

Exit codes, for scripts:

    0  success
    1  unexpected or server error (a 5xx answer, or the API could not be reached)
    2  bad usage or input refused by the API (400, 413, 415, 422)
    3  no such key for your tenant (404)
    4  conflict: someone else decided first, or the call is not in a state that allows it (409)
    5  unauthorized: no token, or an unknown or revoked one (401)

Problem documents' `detail` goes to stderr; results go to stdout.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from enum import IntEnum, StrEnum
from typing import Annotated, Any, NoReturn
from urllib.parse import quote

import httpx
import typer

from onceflow.cli.executions_format import decided, describe, list_lines

DEFAULT_API = "http://127.0.0.1:8082"


class ExitCode(IntEnum):
    OK = 0
    ERROR = 1
    USAGE = 2
    NOT_FOUND = 3
    CONFLICT = 4
    UNAUTHORIZED = 5


EXIT_CODES_HELP = """\b
Exit codes:
  0  success
  1  unexpected or server error (5xx, or the API could not be reached)
  2  bad usage, or input the API refused (400, 413, 415, 422)
  3  no such key for your tenant (404)
  4  conflict: already decided by someone else, or not allowed in its state (409)
  5  unauthorized: missing, unknown or revoked token (401)"""

executions_app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    help="Find unresolved tool calls and decide them, over the operator HTTP API "
    "(ONCEFLOW_API, ONCEFLOW_TOKEN).",
    epilog=EXIT_CODES_HELP,
)

Api = Annotated[str, typer.Option("--api", envvar="ONCEFLOW_API", help="Operator API base URL.")]
Token = Annotated[
    str | None,
    typer.Option("--token", envvar="ONCEFLOW_TOKEN", show_default=False, help="Operator bearer token."),
]
AsJson = Annotated[bool, typer.Option("--json", help="Print the API's JSON instead of text.")]
Reason = Annotated[str, typer.Option("--reason", help="Why; recorded with your operator id.")]

_USAGE_STATUSES = {400, 413, 415, 422}
_TOKEN_HINT = (
    "set ONCEFLOW_TOKEN (or pass --token) to a token from `onceflow tokens create --tenant T --operator NAME`"
)


class Settlement(StrEnum):
    completed = "completed"
    failed = "failed"


class Acknowledged(StrEnum):
    completed = "completed"
    failed = "failed"
    compensated = "compensated"


def _fail(code: ExitCode, message: str) -> NoReturn:
    typer.echo(message, err=True)
    raise typer.Exit(int(code))


def _problem(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {"detail": response.text.strip() or response.reason_phrase}
    return body if isinstance(body, dict) else {"detail": str(body)}


def _explain(response: httpx.Response) -> NoReturn:
    """Turn an error answer into a message on stderr and the exit code scripts can test."""
    status = response.status_code
    problem = _problem(response)
    detail = str(problem.get("detail") or problem.get("title") or response.reason_phrase)
    if status == 401:
        _fail(ExitCode.UNAUTHORIZED, f"unauthorized: {detail}\nhint: {_TOKEN_HINT}")
    if status == 404:
        _fail(ExitCode.NOT_FOUND, f"not found: {detail}")
    if status == 409:
        lines = [f"conflict: {detail}"]
        if problem.get("decided_by"):
            lines.append(f"decided by {problem['decided_by']} at {problem.get('decided_at') or '?'}")
        if problem.get("current_status"):
            lines.append(f"current status: {problem['current_status']}")
        if problem.get("held_by"):
            lines.append(f"held by: {problem['held_by']} (decide that call; this one follows it)")
        _fail(ExitCode.CONFLICT, "\n".join(lines))
    if status in _USAGE_STATUSES:
        _fail(ExitCode.USAGE, f"refused ({status}): {detail}")
    if status >= 500:
        _fail(ExitCode.ERROR, f"server error ({status}): {detail}")
    _fail(ExitCode.ERROR, f"unexpected answer ({status}): {detail}")


class _Api:
    """A thin client: one request per call, errors turned into exit codes."""

    def __init__(self, base_url: str, token: str | None) -> None:
        token = (token or "").strip()  # a token read from a file often ends with a newline
        if not token:
            _fail(ExitCode.UNAUTHORIZED, f"no operator token\nhint: {_TOKEN_HINT}")
        if not (token.isascii() and token.isprintable()) or " " in token:
            _fail(ExitCode.UNAUTHORIZED, f"that is not an operator token\nhint: {_TOKEN_HINT}")
        if not base_url.startswith(("http://", "https://")):
            _fail(
                ExitCode.USAGE, f"--api / ONCEFLOW_API must be an http:// or https:// URL, not {base_url!r}"
            )
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.base_url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        )

    def request(
        self, method: str, path: str, *, params: dict[str, Any] | None = None, body: Any = None
    ) -> Any:
        try:
            response = self._http.request(method, path, params=params, json=body)
        except httpx.HTTPError as exc:
            _fail(ExitCode.ERROR, f"cannot reach the operator API at {self.base_url}: {exc!r}")
        if response.is_success:
            return response.json()
        _explain(response)

    def decide(self, key: str, action: str, body: dict[str, Any]) -> Any:
        return self.request("POST", f"{_path(key)}/{action}", body=body)


def _path(key: str) -> str:
    return "/v1/tool-executions/" + quote(key, safe=":")


def _json_object(value: str | None, option: str) -> Any:
    if value is None:
        return None
    try:
        return json.loads(value)
    except ValueError as exc:
        raise typer.BadParameter(f"not valid JSON: {exc}", param_hint=option) from None


# -- commands ---------------------------------------------------------------------------------------


@executions_app.command("list", epilog=EXIT_CODES_HELP)
def list_executions(
    status: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated: indeterminate, started, awaiting_approval, held. "
            "Default: the first three (a held call waits for another call, which is listed)."
        ),
    ] = None,
    conflicts: Annotated[
        bool | None,
        typer.Option(
            "--conflicts/--no-conflicts",
            show_default=False,
            help="Only calls in conflict / none of them. Default: listed beside the unresolved.",
        ),
    ] = None,
    tool: Annotated[str | None, typer.Option(help="Only this tool.")] = None,
    agent: Annotated[str | None, typer.Option(help="Only this agent.")] = None,
    escalated: Annotated[
        bool | None,
        typer.Option("--escalated/--not-escalated", show_default=False, help="Only (not) escalated calls."),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="Rows per page.")] = 50,
    cursor: Annotated[str | None, typer.Option(help="Continue from a previous page.")] = None,
    all_pages: Annotated[bool, typer.Option("--all", help="Follow the cursor to the last page.")] = False,
    as_json: AsJson = False,
    api: Api = DEFAULT_API,
    token: Token = None,
) -> None:
    """Your tenant's unresolved calls and calls in conflict, longest waiting first.

    The next-page hint goes to stderr.
    """
    client = _Api(api, token)
    params: dict[str, Any] = {"limit": limit}
    for name, value in (("status", status), ("tool", tool), ("agent", agent)):
        if value is not None:
            params[name] = value
    if escalated is not None:
        params["escalated"] = "true" if escalated else "false"
    if conflicts is not None:
        params["conflict"] = "true" if conflicts else "false"
    items: list[dict[str, Any]] = []
    seen: set[str] = set()
    while True:
        query = params if cursor is None else {**params, "cursor": cursor}
        page = client.request("GET", "/v1/tool-executions", params=query)
        items.extend(page["items"])
        if as_json:
            for item in page["items"]:
                typer.echo(json.dumps(item))
        cursor = page.get("next_cursor")
        if not all_pages or cursor is None or cursor in seen:
            break
        seen.add(cursor)
    if not as_json:
        if items:
            for line in list_lines(items, datetime.now(UTC)):
                typer.echo(line)
        else:
            typer.echo("no unresolved calls")
    if cursor is not None and not all_pages:
        typer.echo(f"more: add --cursor {cursor} (or --all)", err=True)


@executions_app.command(epilog=EXIT_CODES_HELP)
def show(
    key: Annotated[str, typer.Argument(help="`<run_id>:<tool_call_id>`")],
    as_json: AsJson = False,
    api: Api = DEFAULT_API,
    token: Token = None,
) -> None:
    """One call and everything that happened to it."""
    record = _Api(api, token).request("GET", _path(key))
    if as_json:
        typer.echo(json.dumps(record, indent=2))
        return
    for line in describe(record):
        typer.echo(line)


@executions_app.command(epilog=EXIT_CODES_HELP)
def resolve(
    key: Annotated[str, typer.Argument(help="`<run_id>:<tool_call_id>`")],
    status: Annotated[Settlement, typer.Option(help="What happened on the other side.")],
    reason: Reason,
    evidence: Annotated[
        str | None, typer.Option(help="JSON object: what you looked at (ticket, query, reference).")
    ] = None,
    result: Annotated[str | None, typer.Option(help="JSON: the tool's result, for `completed`.")] = None,
    as_json: AsJson = False,
    api: Api = DEFAULT_API,
    token: Token = None,
) -> None:
    """Settle an unknown call as completed or failed. Of two operators, the first wins (exit 4)."""
    body: dict[str, Any] = {"status": status.value, "reason": reason}
    found = _json_object(evidence, "--evidence")
    if found is not None:
        if not isinstance(found, dict):
            raise typer.BadParameter("must be a JSON object", param_hint="--evidence")
        body["evidence"] = found
    if result is not None:
        body["result"] = _json_object(result, "--result")
    answer = _Api(api, token).decide(key, "resolve", body)
    typer.echo(json.dumps(answer) if as_json else decided(answer, f"settled {status.value}"))


@executions_app.command(epilog=EXIT_CODES_HELP)
def compensate(
    key: Annotated[str, typer.Argument(help="`<run_id>:<tool_call_id>` of a completed call.")],
    reason: Reason,
    as_json: AsJson = False,
    api: Api = DEFAULT_API,
    token: Token = None,
) -> None:
    """Undo a completed call with its tool's compensation. Asking twice starts it once."""
    answer = _Api(api, token).decide(key, "compensate", {"reason": reason})
    if as_json:
        typer.echo(json.dumps(answer))
        return
    typer.echo(f"compensation of {answer['key']} started (workflow {answer['workflow_id']})")
    typer.echo(f"follow it: onceflow executions show {answer['compensation_key']}")


@executions_app.command(epilog=EXIT_CODES_HELP)
def approve(
    key: Annotated[str, typer.Argument(help="`<run_id>:<tool_call_id>` awaiting approval.")],
    reason: Annotated[str | None, typer.Option(help="Why (optional).")] = None,
    as_json: AsJson = False,
    api: Api = DEFAULT_API,
    token: Token = None,
) -> None:
    """Approve a call that waits for approval; the run then sends it, once, as shown by `show`."""
    body = {} if reason is None else {"reason": reason}
    answer = _Api(api, token).decide(key, "approve", body)
    typer.echo(json.dumps(answer) if as_json else decided(answer, "approved"))


@executions_app.command(epilog=EXIT_CODES_HELP)
def deny(
    key: Annotated[str, typer.Argument(help="`<run_id>:<tool_call_id>` awaiting approval.")],
    reason: Reason,
    as_json: AsJson = False,
    api: Api = DEFAULT_API,
    token: Token = None,
) -> None:
    """Deny a call that waits for approval: it is never sent, and the model is told why."""
    answer = _Api(api, token).decide(key, "deny", {"reason": reason})
    typer.echo(json.dumps(answer) if as_json else decided(answer, "denied"))


@executions_app.command(epilog=EXIT_CODES_HELP)
def release(
    key: Annotated[str, typer.Argument(help="`<run_id>:<tool_call_id>`: held, or approved and not sent.")],
    reason: Reason,
    as_json: AsJson = False,
    api: Api = DEFAULT_API,
    token: Token = None,
) -> None:
    """Release a call that was never sent (held, or approved and not yet claimed by its run).

    It is settled failed (`released`, final): its entity slot and budget amount are freed and its
    run is told it did not take effect. Of two operators, the first wins (exit 4).
    """
    answer = _Api(api, token).decide(key, "release", {"reason": reason})
    typer.echo(json.dumps(answer) if as_json else decided(answer, "released"))


@executions_app.command("acknowledge-conflict", epilog=EXIT_CODES_HELP)
def acknowledge_conflict(
    key: Annotated[str, typer.Argument(help="`<run_id>:<tool_call_id>` of a call in conflict.")],
    status: Annotated[
        Acknowledged,
        typer.Option(help="What the world is: it took effect, it did not, or it was undone. Final."),
    ],
    reason: Annotated[str, typer.Option("--reason", help="What you did about it; recorded with your id.")],
    evidence: Annotated[str, typer.Option(help="JSON object: what you checked (ticket, refund, reference).")],
    as_json: AsJson = False,
    api: Api = DEFAULT_API,
    token: Token = None,
) -> None:
    """Close a conflict (a late outcome contradicted the decision) by setting the call's final status.

    The key is never sent again, and budgets count the call as the status says.
    """
    found = _json_object(evidence, "--evidence")
    if not isinstance(found, dict) or not found:
        raise typer.BadParameter("must be a non-empty JSON object", param_hint="--evidence")
    body: dict[str, Any] = {"status": status.value, "reason": reason, "evidence": found}
    answer = _Api(api, token).decide(key, "acknowledge-conflict", body)
    typer.echo(json.dumps(answer) if as_json else decided(answer, "conflict acknowledged"))


@executions_app.command(epilog=EXIT_CODES_HELP)
def assertion(
    key: Annotated[str, typer.Argument(help="`<run_id>:<tool_call_id>`")],
    expires_in: Annotated[int, typer.Option(min=1, max=3600, help="Seconds it is good for.")] = 600,
    as_json: AsJson = False,
    api: Api = DEFAULT_API,
    token: Token = None,
) -> None:
    """Print an operator assertion for KEY: the `assertion` a `resolve` signal or update needs to
    settle the call on a deployment that checks signals (ONCEFLOW_SIGNALS=verified)."""
    answer = _Api(api, token).request("POST", f"{_path(key)}/assertion", body={"expires_in": expires_in})
    if as_json:
        typer.echo(json.dumps(answer))
        return
    typer.echo(answer["assertion"])
    typer.echo(
        f"for {answer['key']} as {answer['operator']} in {answer['tenant']}, until {answer['expires_at']}; "
        'send it as "assertion" in the resolve\'s input',
        err=True,
    )
