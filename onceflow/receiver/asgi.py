"""The middleware form, for any ASGI app (Starlette, FastAPI): claim the key, run the handler,
record its answer.

    app.add_middleware(IdempotencyMiddleware, scope=tenant_of, paths=["/refunds"])

(the key store is the one `Receiver.open(app, ...)` put in `app.state`, or pass `store=`).

Its window: the claim commits before the handler runs and the answer after it, so a process that
dies after the handler's effect and before the record leaves the key `in_progress`, which lookup
reports as unknown (never as absent) until someone releases it (`KeyStore.release_stuck`). An
exception out of the handler leaves it the same way: the kit cannot know what the handler did.
Answers are recorded whatever their status, except `release_statuses` (the service's promise that
such an answer means nothing was done: the claim is dropped and the key is free again). Where the
service's state is in PostgreSQL, the transactional form (fastapi.py) has no such window.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from typing import Any

from onceflow.local.extras import needs_extra

with needs_extra("receiver"):
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

from onceflow.receiver.keys import BadKeyError, RequestShape, is_json_media_type, parse_key_header
from onceflow.receiver.records import (
    EXPIRES_HEADER,
    REPLAYED_HEADER,
    KeyRecord,
    KeyState,
    Refusal,
    StoredResponse,
    bad_key,
    http_date,
    missing_key,
)
from onceflow.receiver.store import KeyStore

log = logging.getLogger("onceflow.receiver")

PROBLEM_MEDIA_TYPE = "application/problem+json"
DEFAULT_PROBLEM_BASE = "urn:onceflow:receiver:"
# Kept with an answer and replayed with it; the rest (dates, lengths, cookies) are the moment's.
DEFAULT_KEPT_HEADERS = ("content-type", "location")
# Where an app keeps its key store (onceflow.receiver.fastapi.Receiver.open puts it there).
STATE = "onceflow_key_store"

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
ScopeOf = Callable[[Request], Awaitable[str] | str]


def problem_response(refusal: Refusal, base: str = DEFAULT_PROBLEM_BASE) -> Response:
    """A refusal as an RFC 9457 problem document."""
    return JSONResponse(
        refusal.problem(base),
        status_code=refusal.status,
        headers=refusal.headers,
        media_type=PROBLEM_MEDIA_TYPE,
    )


def expiry_headers(record: KeyRecord) -> dict[str, str]:
    """`Idempotency-Key-Expires` for an answer kept under a key with an expiry."""
    return {EXPIRES_HEADER: http_date(record.expires_at)} if record.expires_at is not None else {}


def replay_response(record: KeyRecord) -> Response:
    """The stored answer again, marked as a replay."""
    stored = record.response
    assert stored is not None, "only a completed key is replayed"
    response = Response(content=stored.body, status_code=stored.status)
    for name, value in stored.headers:
        response.headers.append(name, value)
    response.headers[REPLAYED_HEADER] = "true"
    response.headers.update(expiry_headers(record))
    return response


def key_of(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The request's key; raises `missing_key()` or `bad_key()` as a `Refusal`."""
    values = [value.decode("latin-1") for name, value in headers if name.lower() == b"idempotency-key"]
    if not values:
        raise missing_key()
    try:
        # Two header lines are one field value joined by a comma, which no single key can be.
        return parse_key_header(", ".join(values))
    except BadKeyError as exc:
        raise bad_key(exc.reason) from None


def request_path(scope: Scope) -> str:
    query = scope.get("query_string", b"").decode("latin-1")
    return scope.get("path", "") + (f"?{query}" if query else "")


def keep_headers(headers: Sequence[tuple[bytes, bytes]], kept: Iterable[str]) -> tuple[tuple[str, str], ...]:
    wanted = {name.lower() for name in kept}
    return tuple(
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, value in headers
        if name.decode("latin-1").lower() in wanted
    )


async def scope_of_request(scope_of: ScopeOf, request: Request) -> str:
    """The service's scope for this request; its HTTPException (e.g. 401) becomes a refusal."""
    try:
        found = scope_of(request)
        value = await found if inspect.isawaitable(found) else found
    except HTTPException as exc:
        raise Refusal(exc.status_code, f"http-{exc.status_code}", str(exc.detail), str(exc.detail)) from None
    if not isinstance(value, str) or not value:
        raise TypeError(f"the receiver's scope function returned {value!r}, not a non-empty string")
    return value


class IdempotencyMiddleware:
    """Honour the Idempotency-Key on `methods` to paths starting with one of `paths` (all: None)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        scope: ScopeOf,
        store: KeyStore | Callable[[], KeyStore] | None = None,
        methods: Iterable[str] = ("POST", "PATCH"),
        paths: Sequence[str] | None = None,
        kept_headers: Iterable[str] = DEFAULT_KEPT_HEADERS,
        release_statuses: Iterable[int] = (),
        problem_base: str = DEFAULT_PROBLEM_BASE,
    ) -> None:
        self.app = app
        self._store = store
        self._scope_of = scope
        self.methods = {method.upper() for method in methods}
        self.paths = tuple(paths) if paths is not None else None
        self.kept_headers = tuple(kept_headers)
        self.release_statuses = frozenset(release_statuses)
        self.problem_base = problem_base

    def store(self, scope: Scope) -> KeyStore:
        if isinstance(self._store, KeyStore):
            return self._store
        if self._store is not None:
            return self._store()
        found = getattr(scope["app"].state, STATE, None)
        if not isinstance(found, KeyStore):
            raise RuntimeError("no key store: open one with Receiver.open(app, ...) or pass store=")
        return found

    def applies(self, scope: Scope) -> bool:
        if scope["type"] != "http" or scope["method"] not in self.methods:
            return False
        return self.paths is None or str(scope.get("path", "")).startswith(self.paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.applies(scope):
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        try:
            key = key_of(scope.get("headers", []))
            owner = await scope_of_request(self._scope_of, Request(scope))
            shape = _shape(scope, body)
            record = await self.store(scope).claim(owner, key, shape)
        except Refusal as refusal:
            await problem_response(refusal, self.problem_base)(scope, receive, send)
            return
        if record.state is KeyState.COMPLETED:
            await replay_response(record)(scope, receive, send)
            return
        await self._handle(scope, receive, send, body, owner, key, shape, record)

    async def _handle(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        body: bytes,
        owner: str,
        key: str,
        shape: RequestShape,
        claim: KeyRecord,
    ) -> None:
        status = 0
        headers: list[tuple[bytes, bytes]] = []
        chunks: list[bytes] = []
        last: MutableMapping[str, Any] | None = None
        extra = [(name.lower().encode(), value.encode()) for name, value in expiry_headers(claim).items()]

        async def recording_send(message: MutableMapping[str, Any]) -> None:
            nonlocal status, last
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers.extend(message.get("headers", []))
                if status not in self.release_statuses:
                    message = {**message, "headers": [*message.get("headers", []), *extra]}
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    # The answer's end waits for its record: whoever has the whole answer can count
                    # on a repeat being answered from the record, not told "in progress".
                    last = message
                    return
            await send(message)

        await self.app(scope, _replaying(body, receive), recording_send)
        # Past here the handler has answered; an exception above left the claim in progress.
        if not status or last is None:
            log.warning("the handler for key %r did not finish its answer; the key stays in progress", key)
            return
        if status in self.release_statuses:
            await self.store(scope).release(owner, key, shape)
        else:
            stored = StoredResponse(status, keep_headers(headers, self.kept_headers), b"".join(chunks))
            await self.store(scope).complete(owner, key, shape, stored)
        await send(last)


def _shape(scope: Scope, body: bytes) -> RequestShape:
    content_type = next(
        (v.decode("latin-1") for n, v in scope.get("headers", []) if n.lower() == b"content-type"), None
    )
    return RequestShape(scope["method"], request_path(scope), body, is_json_media_type(content_type))


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """The body, read once already, handed to the app as if it came from the client; after it,
    whatever the client does next (a disconnect)."""
    sent = False

    async def replaying_receive() -> MutableMapping[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replaying_receive
