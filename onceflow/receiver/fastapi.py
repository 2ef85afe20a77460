"""The kit for FastAPI services: the transactional form as a dependency, the reconcile protocol's
routes, and the kit's answers as problem documents.

    receiver = Receiver(scope=tenant_of)            # the service's own auth dependency -> a scope
    receiver.install(app)                           # and `await receiver.open(app, dsn)` in its lifespan
    app.include_router(receiver.router())           # GET /idempotency-keys/{key}, POST .../fence

    @app.post("/refunds", status_code=201)
    async def refund(body: RefundIn, keyed: Annotated[KeyedRequest, receiver.depends()]) -> Response:
        row = await keyed.connection.fetchrow("INSERT INTO refunds ... RETURNING *", ...)
        return await keyed.respond(dict(row), status_code=201)

The handler's writes on `keyed.connection` and the key's record commit together in `respond()`,
before any byte of the answer leaves: the effect exists if and only if the key is recorded. Raising
instead (a refusal, a bug) rolls both back, so the key stays free. A request whose key completed
before never reaches the handler: the dependency answers with the stored response.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Annotated, Any

from onceflow.local.extras import needs_extra

with needs_extra("receiver"):
    from fastapi import APIRouter, Depends, FastAPI, Header, Request
    from fastapi.dependencies.models import Dependant
    from fastapi.responses import JSONResponse, Response
    from fastapi.routing import APIRoute

import asyncpg

from onceflow.receiver.asgi import (
    DEFAULT_KEPT_HEADERS,
    DEFAULT_PROBLEM_BASE,
    STATE,
    expiry_headers,
    keep_headers,
    key_of,
    problem_response,
    replay_response,
    request_path,
)
from onceflow.receiver.keys import KEY_HEADER, BadKeyError, RequestShape, check_key, is_json_media_type
from onceflow.receiver.records import ExpiryPolicy, KeyRecord, Refusal, bad_key
from onceflow.receiver.store import Connection, KeyedTransaction, KeyNotRecordedError, KeyStore

OPENAPI_EXTENSION = "x-idempotency-key"


class ReplayAnswer(Exception):
    """Raised by the dependency when the key completed before: answered with the stored response."""

    def __init__(self, record: KeyRecord) -> None:
        super().__init__(f"replay of key {record.key!r}")
        self.record = record


class KeyedRequest:
    """What a keyed handler is given: the transaction's `connection`, its `key` and `scope`."""

    def __init__(self, transaction: KeyedTransaction, kept_headers: Sequence[str]) -> None:
        self.transaction = transaction
        self.connection: Connection = transaction.connection
        self.key = transaction.key
        self.scope = transaction.scope
        self._kept_headers = kept_headers

    async def respond(
        self,
        content: Any = None,
        status_code: int = 200,
        headers: dict[str, str] | None = None,
        *,
        response: Response | None = None,
    ) -> Response:
        """Record the answer (JSON `content`, or a whole `response`) with the key and commit the
        handler's writes with it; return the response to send."""
        if response is None:
            response = JSONResponse(content, status_code=status_code, headers=headers)
        record = await self.transaction.record(
            response.status_code, bytes(response.body), keep_headers(response.headers.raw, self._kept_headers)
        )
        response.headers.update(expiry_headers(record))
        return response


class Receiver:
    """The receiver kit's configuration for FastAPI apps: `scope` is a FastAPI dependency of the
    service's (its authentication) that returns the caller's scope, so that keys of one scope never
    meet another's. Define it once, at module level (handlers name it in their annotations); each app
    opens its own key store with `open(app, ...)`, kept in `app.state`."""

    STATE = STATE

    def __init__(
        self,
        *,
        scope: Callable[..., Any],
        policy: ExpiryPolicy | None = None,
        problem_base: str = DEFAULT_PROBLEM_BASE,
        kept_headers: Iterable[str] = DEFAULT_KEPT_HEADERS,
    ) -> None:
        self.scope_dependency = scope
        self.policy = policy or ExpiryPolicy()
        self.problem_base = problem_base
        self.kept_headers = tuple(kept_headers)
        self.keyed = self._keyed_dependency()

    # -- the store -------------------------------------------------------------------------------

    async def open(self, app: Any, dsn_or_pool: str | asyncpg.Pool, *, honour_keys: bool = True) -> KeyStore:
        """Open `app`'s key store (from its lifespan): on a DSN (migrated, with a pool of its own) or
        on the service's own pool (run `migrate_receiver` first). `honour_keys=False`: see KeyStore."""
        if isinstance(dsn_or_pool, str):
            store = await KeyStore.connect(dsn_or_pool, policy=self.policy, honour_keys=honour_keys)
        else:
            store = KeyStore(dsn_or_pool, policy=self.policy, honour_keys=honour_keys)
        setattr(app.state, self.STATE, store)
        return store

    async def close(self, app: Any) -> None:
        """Close `app`'s key store (a pool it opened itself)."""
        store = getattr(app.state, self.STATE, None)
        if store is not None:
            await store.close()
            setattr(app.state, self.STATE, None)

    @classmethod
    def store_of(cls, app: Any) -> KeyStore:
        """`app`'s key store; also what IdempotencyMiddleware uses when given none."""
        store = getattr(app.state, cls.STATE, None)
        if not isinstance(store, KeyStore):
            raise RuntimeError(
                "the app's key store is not open: await receiver.open(app, ...) in its lifespan"
            )
        return store

    # -- the transactional form ------------------------------------------------------------------

    def depends(self) -> Any:
        """`Depends(...)` for a keyed handler: `keyed: Annotated[KeyedRequest, receiver.depends()]`.
        Scoped to the handler, so that its ending (and a forgotten `respond()`) is settled before the
        answer is sent."""
        return Depends(self.keyed, scope="function")

    def _keyed_dependency(self) -> Callable[..., AsyncIterator[KeyedRequest]]:
        receiver = self

        async def keyed(
            request: Request, owner: str, idempotency_key: str | None
        ) -> AsyncIterator[KeyedRequest]:
            key = key_of(request.headers.raw)  # `idempotency_key` only documents the header
            body = await request.body()
            shape = RequestShape(
                request.method,
                request_path(request.scope),
                body,
                is_json_media_type(request.headers.get("content-type")),
            )
            async with receiver.store_of(request.app).transaction(owner, key, shape) as transaction:
                if transaction.replay_record is not None:
                    raise ReplayAnswer(transaction.replay_record)
                yield KeyedRequest(transaction, receiver.kept_headers)

        keyed.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [
                _parameter("request", Request),
                _parameter("owner", Annotated[str, Depends(self.scope_dependency)]),
                _parameter(
                    "idempotency_key",
                    Annotated[str | None, Header(alias=KEY_HEADER, description=self.policy.describe())],
                    default=None,
                ),
            ]
        )
        return keyed

    # -- the reconcile protocol ------------------------------------------------------------------

    def router(
        self, prefix: str = "/idempotency-keys", tags: Sequence[str] = ("idempotency keys",)
    ) -> APIRouter:
        """`GET {prefix}/{key}`: the key's record or `{"state": "absent"}` (read-only);
        `POST {prefix}/{key}/fence`: completed -> returned, absent -> fenced for good, in progress ->
        said so. Both in the caller's scope, through the same dependency as the service's routes."""
        router = APIRouter(prefix=prefix, tags=list(tags))
        receiver = self

        async def lookup(request: Request, key: str, owner: str) -> JSONResponse:
            record = await receiver.store_of(request.app).lookup(owner, _path_key(key))
            return JSONResponse(record.protocol())

        async def fence(request: Request, key: str, owner: str) -> JSONResponse:
            result = await receiver.store_of(request.app).fence(owner, _path_key(key))
            return JSONResponse(result.protocol())

        for endpoint in (lookup, fence):
            endpoint.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
                [
                    _parameter("request", Request),
                    _parameter("key", str),
                    _parameter("owner", Annotated[str, Depends(self.scope_dependency)]),
                ]
            )
        router.add_api_route(
            "/{key:path}/fence",
            fence,
            methods=["POST"],
            summary="Fence an idempotency key",
            description="Atomically: a completed key is returned; a key with no record is fenced, after "
            "which every request with it is refused (409 key-fenced) and never applied; a key in progress "
            "is reported so and left alone.",
        )
        router.add_api_route(
            "/{key:path}",
            lookup,
            methods=["GET"],
            summary="Look up an idempotency key",
            description="Read-only: the key's state (`completed` with the stored response, `in_progress`, "
            "`fenced`, or `absent`: no record).",
        )
        return router

    # -- the app ---------------------------------------------------------------------------------

    def install(self, app: FastAPI) -> None:
        """Answer the kit's refusals and replays, and publish the policy on every keyed operation."""

        async def on_refusal(_: Request, exc: Exception) -> Response:
            assert isinstance(exc, Refusal)
            return problem_response(exc, self.problem_base)

        async def on_replay(_: Request, exc: Exception) -> Response:
            assert isinstance(exc, ReplayAnswer)
            return replay_response(exc.record)

        async def on_not_recorded(_: Request, exc: Exception) -> Response:
            refusal = Refusal(500, "answer-not-recorded", "Answer not recorded", str(exc))
            return problem_response(refusal, self.problem_base)

        app.add_exception_handler(Refusal, on_refusal)
        app.add_exception_handler(ReplayAnswer, on_replay)
        app.add_exception_handler(KeyNotRecordedError, on_not_recorded)
        build_openapi = app.openapi

        def openapi() -> dict[str, Any]:
            if app.openapi_schema is None:
                for route in app.routes:
                    if isinstance(route, APIRoute) and _uses(route.dependant, self.keyed):
                        route.openapi_extra = {
                            **(route.openapi_extra or {}),
                            OPENAPI_EXTENSION: self.policy.openapi(),
                        }
            return build_openapi()

        app.openapi = openapi  # type: ignore[method-assign]


def _parameter(name: str, annotation: Any, **kwargs: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, **kwargs)


def _path_key(key: str) -> str:
    try:
        return check_key(key)
    except BadKeyError as exc:
        raise bad_key(exc.reason) from None


def _uses(dependant: Dependant, call: Callable[..., Any]) -> bool:
    return dependant.call is call or any(_uses(sub, call) for sub in dependant.dependencies)
