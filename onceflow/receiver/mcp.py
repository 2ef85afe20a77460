"""The receiver kit for MCP servers written with the official SDK: a tool that takes its key from the
request's `_meta`, with the HTTP form's semantics, and the reconcile protocol as two tools.

    receiver = McpReceiver(dsn=DATABASE_URL)          # or store=KeyStore(...), and scope=...
    server = MCPServer("refunds")

    @receiver.tool(server, annotations=ToolAnnotations(read_only_hint=False, open_world_hint=True))
    async def issue_refund(order_id: str, cents: int, keyed: McpKeyed) -> dict:
        await keyed.connection.execute("INSERT INTO refunds ...", ...)
        return {"order_id": order_id, "cents": cents}

    receiver.add_protocol_tools(server)               # onceflow_key_lookup, onceflow_key_fence

The key is `_meta["io.onceflow/idempotency-key"]` (what onceflow sends, onceflow.mcp.meta). A call
runs in the transactional form: the tool's writes on `keyed.connection` and the key's record (its
result) commit together, after the tool returns and before the result is sent. The same key and
arguments again: the recorded result, `_meta["io.onceflow/replayed"] = true`, the tool not run. A
refusal is an error result whose `_meta["io.onceflow/receiver-problem"]` names it as the HTTP form's
problem types do: `missing-key`, `bad-key`, `key-reused` (other arguments), `key-in-progress`,
`key-fenced`. A tool that raises records nothing and changes nothing: the key stays free.

The fingerprint is SHA-256 of ("tools/call", the tool's name, the canonical JSON of its arguments).
A tool's result is recorded with status 200, an error result (`isError`) with 422, so that the
protocol's answer reads the same as an HTTP receiver's.
"""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import TypeAdapter

from onceflow.local.extras import needs_extra

with needs_extra("mcp"):
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.types import CallToolResult, TextContent, ToolAnnotations

from onceflow.mcp.meta import (
    IDEMPOTENCY_META_KEY,
    KIT_FENCE_TOOL,
    KIT_LOOKUP_TOOL,
    RECEIVER_PROBLEM_META_KEY,
    REPLAYED_META_KEY,
)
from onceflow.receiver.keys import BadKeyError, RequestShape, check_key
from onceflow.receiver.records import KeyRecord, Refusal, bad_key, missing_key
from onceflow.receiver.store import Connection, KeyedTransaction, KeyStore

ScopeOf = Callable[[Context], str | Awaitable[str]]
_JSON = TypeAdapter(Any)

LOOKUP_ANNOTATIONS = ToolAnnotations(
    title="Look up an idempotency key",
    read_only_hint=True,
    destructive_hint=False,
    idempotent_hint=True,
    open_world_hint=False,
)
FENCE_ANNOTATIONS = ToolAnnotations(
    title="Fence an idempotency key",
    read_only_hint=False,
    destructive_hint=False,
    idempotent_hint=True,
    open_world_hint=False,
)


class McpKeyed:
    """What a keyed MCP tool is given: the transaction's `connection`, its `key` and `scope`."""

    def __init__(self, transaction: KeyedTransaction, context: Context) -> None:
        self.transaction = transaction
        self.connection: Connection = transaction.connection
        self.key = transaction.key
        self.scope = transaction.scope
        self.context = context


def _refusal_result(refusal: Refusal) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=f"{refusal.title}: {refusal.detail}")],
        is_error=True,
        _meta={RECEIVER_PROBLEM_META_KEY: refusal.slug},
    )


def _as_result(value: Any) -> CallToolResult:
    """A tool's return value as the result MCPServer would have sent for a returned dict."""
    if isinstance(value, CallToolResult):
        return value
    data = _JSON.dump_python(value, mode="json")
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(data, indent=2))],
        structured_content=data if isinstance(data, dict) else None,
    )


def _replayed(record: KeyRecord) -> CallToolResult:
    assert record.response is not None
    kept = CallToolResult.model_validate_json(record.response.body)
    meta = {**(kept.meta or {}), REPLAYED_META_KEY: True}
    return kept.model_copy(update={"meta": meta})


class McpReceiver:
    """The kit for one MCP server: keyed tools and the protocol tools, over one key store.

    `store`: a KeyStore, or `dsn`: opened (and migrated) on first use, in the server's own event
    loop. `scope`: the caller's scope from the request's Context (e.g. from its HTTP headers);
    by default one scope for every caller.
    """

    def __init__(
        self,
        *,
        store: KeyStore | None = None,
        dsn: str | None = None,
        scope: ScopeOf | None = None,
        honour_keys: bool = True,
    ) -> None:
        if (store is None) == (dsn is None):
            raise ValueError("give the key store as exactly one of store= or dsn=")
        self._store = store
        self._dsn = dsn
        self._scope_of = scope
        self.honour_keys = honour_keys

    async def store(self) -> KeyStore:
        if self._store is None:
            assert self._dsn is not None
            self._store = await KeyStore.connect(self._dsn, honour_keys=self.honour_keys)
        return self._store

    async def close(self) -> None:
        if self._store is not None and self._dsn is not None:
            await self._store.close()
            self._store = None

    async def scope(self, context: Context) -> str:
        if self._scope_of is None:
            return "mcp"
        found = self._scope_of(context)
        value = await found if inspect.isawaitable(found) else found
        if not isinstance(value, str) or not value:
            raise TypeError(f"the receiver's scope function returned {value!r}, not a non-empty string")
        return value

    def tool(
        self, server: MCPServer, *, name: str | None = None, description: str | None = None, **options: Any
    ) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[CallToolResult]]]:
        """Register `fn` on `server` as a keyed tool (options as `server.tool()` takes them). `fn` has
        a parameter annotated `McpKeyed` (the transaction) and, if it likes, one annotated `Context`."""

        def register(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[CallToolResult]]:
            keyed_tool = self._keyed(fn, name or fn.__name__)
            server.add_tool(
                keyed_tool, name=name or fn.__name__, description=description or fn.__doc__, **options
            )
            return keyed_tool

        return register

    def _keyed(
        self, fn: Callable[..., Awaitable[Any]], tool_name: str
    ) -> Callable[..., Awaitable[CallToolResult]]:
        hints = typing.get_type_hints(fn)
        signature = inspect.signature(fn)
        keyed_name = next((n for n in signature.parameters if hints.get(n) is McpKeyed), None)
        if keyed_name is None:
            raise TypeError(f"keyed tool {tool_name!r} needs a parameter annotated McpKeyed")
        own_context = next((n for n in signature.parameters if hints.get(n) is Context), None)
        context_name = own_context or "onceflow_context"
        parameters = [
            p.replace(annotation=hints.get(p.name, Any), kind=inspect.Parameter.KEYWORD_ONLY)
            for p in signature.parameters.values()
            if p.name not in (keyed_name, own_context)
        ]
        parameters.append(inspect.Parameter(context_name, inspect.Parameter.KEYWORD_ONLY, annotation=Context))
        receiver = self

        async def keyed_tool(**kwargs: Any) -> CallToolResult:
            context: Context = kwargs.pop(context_name)
            try:
                key = _key_of(context)
                owner = await receiver.scope(context)
                arguments = _JSON.dump_python(kwargs, mode="json")
                shape = RequestShape("tools/call", tool_name, json.dumps(arguments).encode(), json_body=True)
                store = await receiver.store()
                async with store.transaction(owner, key, shape) as transaction:
                    if transaction.replay_record is not None:
                        return _replayed(transaction.replay_record)
                    own: dict[str, Any] = {keyed_name: McpKeyed(transaction, context)}
                    if own_context:
                        own[own_context] = context
                    result = _as_result(await fn(**kwargs, **own))
                    body = result.model_dump_json(by_alias=True, exclude_none=True).encode()
                    await transaction.record(
                        422 if result.is_error else 200, body, [("content-type", "application/json")]
                    )
                    return result
            except Refusal as refusal:
                return _refusal_result(refusal)

        keyed_tool.__signature__ = inspect.Signature(parameters, return_annotation=CallToolResult)  # type: ignore[attr-defined]
        keyed_tool.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": CallToolResult}
        keyed_tool.__name__ = tool_name
        keyed_tool.__doc__ = fn.__doc__
        return keyed_tool

    def add_protocol_tools(self, server: MCPServer) -> None:
        """`onceflow_key_lookup` (read-only) and `onceflow_key_fence`, each taking `idempotency_key`
        and answering the reconcile protocol's JSON, in the caller's scope."""
        receiver = self

        async def onceflow_key_lookup(idempotency_key: str, ctx: Context) -> dict[str, Any]:
            """What this server recorded for an idempotency key: its result, in progress, fenced, or
            absent. Changes nothing."""
            store = await receiver.store()
            return (await store.lookup(await receiver.scope(ctx), _argument_key(idempotency_key))).protocol()

        async def onceflow_key_fence(idempotency_key: str, ctx: Context) -> dict[str, Any]:
            """Settle an idempotency key for good: a completed call is returned; a key with no record
            is fenced, so that a call with it is refused from now on and never applied."""
            store = await receiver.store()
            return (await store.fence(await receiver.scope(ctx), _argument_key(idempotency_key))).protocol()

        server.add_tool(onceflow_key_lookup, name=KIT_LOOKUP_TOOL, annotations=LOOKUP_ANNOTATIONS)
        server.add_tool(onceflow_key_fence, name=KIT_FENCE_TOOL, annotations=FENCE_ANNOTATIONS)


def _key_of(context: Context) -> str:
    meta = context.request_context.meta or {}
    key = (
        meta.get(IDEMPOTENCY_META_KEY)
        if isinstance(meta, dict)
        else getattr(meta, IDEMPOTENCY_META_KEY, None)
    )
    if key is None:
        raise missing_key()
    if not isinstance(key, str):
        raise bad_key("the key in _meta must be a string")
    try:
        return check_key(key)
    except BadKeyError as exc:
        raise bad_key(exc.reason) from None


def _argument_key(key: str) -> str:
    try:
        return check_key(key)
    except BadKeyError as exc:
        from mcp.server.mcpserver.exceptions import ToolError

        raise ToolError(f"not an idempotency key: {exc.reason}") from None
