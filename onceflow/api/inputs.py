"""What the operator API accepts as input, for every route, in one place.

- A body is read whole, up to a size, and when it is JSON (declared so, or not declared at all, which
  FastAPI would read as JSON) it must be JSON the ledger can store: UTF-8, well formed, no NaN or
  Infinity, no number that overflows to infinity (`1e999`), at most 64 levels deep. Whatever
  is wrong with it, the answer is one problem type, `unreadable-body`: 413 when the body is too long
  (announced by Content-Length or found while streaming), 400 otherwise. Nothing reaches a route, so
  nothing is stored.
- On the JSON API (`/v1/...`), a query parameter the route does not declare is refused (400
  `invalid-request`), as are repeated ones: `?stauts=held` must not quietly list everything, nor
  `?tenant=other` look as if it did something. The console's pages apply the same check
  (`check_query`) to the parameters they take.

`install_input_checks` applies both to the app and to every route added to it later, including
routes of included routers: the query check is an app-level dependency.
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.datastructures import QueryParams
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from onceflow.api.problems import Problem
from onceflow.ledger.canonical import strict_loads

UNREADABLE = "unreadable-body"
# The JSON API, whose routes declare every query parameter they take.
JSON_API_PREFIX = "/v1/"


def unreadable(detail: str, *, status: int = 400) -> Problem:
    return Problem(status, UNREADABLE, "Unreadable body", detail)


def _is_json(content_type: bytes | None) -> bool:
    """True when the body is JSON for FastAPI: declared `application/json` (or `+json`), or not
    declared at all."""
    if content_type is None:
        return True
    media = content_type.split(b";")[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


class JsonInput:
    """ASGI middleware: read the body whole (at most `limit` bytes) and refuse JSON the ledger
    cannot store before any route sees it; then hand the route the same bytes."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        too_long = unreadable(f"bodies are limited to {self.limit} bytes", status=413)
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await too_long.response()(scope, receive, send)
            return
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the caller went away; there is nobody to answer
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.limit:
                await too_long.response()(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if body and _is_json(headers.get(b"content-type")):
            try:
                strict_loads(body)
            except ValueError as exc:
                problem = unreadable(f"the body is not JSON this API can take: {_why(exc)}")
                await problem.response()(scope, receive, send)
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def _why(exc: ValueError) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return "it is not UTF-8"
    return str(exc)[:300]


_DECLARED: dict[int, frozenset[str]] = {}


def _declared_query(route: APIRoute) -> frozenset[str]:
    known = _DECLARED.get(id(route))
    if known is None:
        known = _DECLARED[id(route)] = frozenset(_query_names(route.dependant))
    return known


def _query_names(dependant: Dependant) -> set[str]:
    """The query parameter names a route and its dependencies declare (a model's fields too)."""
    names: set[str] = set()
    for param in dependant.query_params:
        names.add(param.alias)
        model = getattr(param, "type_", None) or getattr(
            getattr(param, "field_info", None), "annotation", None
        )
        fields = getattr(model, "model_fields", None)
        if isinstance(fields, dict):
            names.update(info.alias or name for name, info in fields.items())
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


def check_query(params: QueryParams, declared: frozenset[str]) -> None:
    """Refuse a repeated query parameter, or one that is not `declared`."""
    repeated = sorted({name for name in params if len(params.getlist(name)) > 1})
    if repeated:
        # FastAPI would silently keep the last value: `status=a&status=b` would filter by b alone.
        raise Problem(
            400,
            "invalid-request",
            "Invalid request",
            f"give each query parameter at most once (repeated: {', '.join(repeated)})",
        )
    unknown = sorted(set(params) - declared)
    if unknown:
        takes = ", ".join(sorted(declared)) or "none"
        raise Problem(
            400,
            "invalid-request",
            "Invalid request",
            f"unknown query parameter(s): {', '.join(unknown)}; this route takes: {takes}",
            unknown=unknown,
        )


async def _checked_query(request: Request) -> None:
    if not request.url.path.startswith(JSON_API_PREFIX):
        return  # pages (the console) check their own query with check_query
    route = request.scope.get("route")
    declared = _declared_query(route) if isinstance(route, APIRoute) else frozenset(request.query_params)
    check_query(request.query_params, declared)


def install_input_checks(app: FastAPI, *, body_limit: int) -> None:
    """Check every request's body and query as the module docstring says."""
    app.add_middleware(JsonInput, limit=body_limit)
    app.router.dependencies.append(Depends(_checked_query))


def checked_query_dependency() -> Any:
    """The query check as a dependency, for a router built apart from the app."""
    return Depends(_checked_query)
