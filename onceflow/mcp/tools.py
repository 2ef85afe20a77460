"""MCP tools as onceflow `Tool`s: the same object the activities run, so every write meets the ledger.

What a call's ending means (the activity turns these into ledger outcomes):
- no session could be had (the server did not start, answer or initialize): `ToolNotAttemptedError`;
- the server answered `isError: true` with `_meta["io.onceflow/refused"] = true`: a refusal on
  policy grounds, `ToolRefusedError` (final, never sent again);
- a server on onceflow's receiver kit refused with `_meta["io.onceflow/receiver-problem"]`: read as
  the kit's problems are (`kit_problem_error`): `key-fenced` is `ToolKeyNotFoundError`, the key in
  progress is unknown, a key reused for other arguments is `ToolRejectedError`;
- the server answered `isError: true`, or refused the request as malformed (JSON-RPC -32602,
  -32601, -32600): `ToolRejectedError`, a definite no;
- anything else once the request was handed to the transport (connection closed, the process died,
  a server-side internal error, no answer in time): raised as is, which the write protocol records
  as unknown, and the session is thrown away so the next call starts a fresh one.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, create_model

from onceflow.mcp.classify import Classification
from onceflow.mcp.connection import McpConnection, McpUnavailableError
from onceflow.mcp.meta import (
    IDEMPOTENCY_META_KEY,
    KIT_FENCE_TOOL,
    KIT_LOOKUP_TOOL,
    RECEIVER_PROBLEM_META_KEY,
    REFUSED_META_KEY,
    WRITE_KEY_META_KEY,
)
from onceflow.sdk.keys import lookup_key
from onceflow.sdk.tools import (
    REPLACES_ARGUMENT,
    Effect,
    Guards,
    InvalidToolArgumentsError,
    OutcomeStatus,
    ReceiverKit,
    ReconcileOutcome,
    Tool,
    ToolContext,
    ToolNotAttemptedError,
    ToolRefusedError,
    ToolRejectedError,
    kit_problem_error,
)

if TYPE_CHECKING:
    from mcp.types import CallToolResult

# JSON-RPC errors that mean the server refused the request before running anything.
_REFUSED_CODES = {-32600, -32601, -32602}
_CONNECTION_CLOSED = -32000  # the SDK's code when the transport closed under a request
LOOKUP_KEY_ARGUMENT = "idempotency_key"


class McpCallError(Exception):
    """The call may have reached the server and nobody knows how it ended."""


def result_text(result: CallToolResult) -> str:
    texts = [getattr(block, "text", None) for block in result.content]
    return "\n".join(t for t in texts if t) or "(no text)"


def kit_refusal(result: CallToolResult) -> Exception | None:
    """A receiver kit's refusal, as the write protocol reads it (None: not one)."""
    problem = (result.meta or {}).get(RECEIVER_PROBLEM_META_KEY) if result.is_error else None
    if not isinstance(problem, str):
        return None
    error = kit_problem_error({"type": problem}, result_text(result)[:2000])
    if isinstance(error, RuntimeError):  # in progress: nobody knows yet
        return McpCallError(str(error))
    return error


def is_policy_refusal(result: CallToolResult) -> bool:
    """An error result the server marked as a refusal on policy grounds (see onceflow.mcp.meta)."""
    return bool(result.is_error) and (result.meta or {}).get(REFUSED_META_KEY) is True


def result_value(result: CallToolResult) -> Any:
    """What onceflow records and hands the model: structured content if any, else the text."""
    if result.structured_content is not None:
        return result.structured_content
    if all(getattr(block, "type", None) == "text" for block in result.content):
        return result_text(result) if result.content else None
    return [block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in result.content]


def lookup_outcome(result: CallToolResult, source: str) -> ReconcileOutcome:
    """Read a lookup tool's answer: `{"status": completed|failed|unknown, "result"?, "reference"?,
    "evidence"?}` as structured content (or as JSON text). Anything else is unknown."""
    if result.is_error:
        return ReconcileOutcome.unknown(source=source, lookup_error=result_text(result)[:500])
    data = result.structured_content
    if data is None:
        try:
            data = json.loads(result_text(result))
        except ValueError:
            data = None
    status = data.get("status") if isinstance(data, dict) else None
    if not isinstance(data, dict) or status not in {s.value for s in OutcomeStatus}:
        return ReconcileOutcome.unknown(source=source, malformed_answer=str(data)[:500])
    given = data.get("evidence")
    evidence: dict[str, Any] = {**(given if isinstance(given, dict) else {}), "source": source}
    if status == OutcomeStatus.COMPLETED:
        reference = data.get("reference")
        return ReconcileOutcome.completed(
            data.get("result"), result_reference=str(reference) if reference is not None else None, **evidence
        )
    if status == OutcomeStatus.FAILED:
        return ReconcileOutcome.failed(**evidence)
    return ReconcileOutcome.unknown(**evidence)


def _arguments_model(name: str, schema: dict[str, Any]) -> type[BaseModel]:
    """A stand-in listing the schema's argument names, for the contract's key-like-argument check.
    Validation itself uses the server's JSON Schema."""
    properties = schema.get("properties") or {}
    fields: dict[str, Any] = {str(p): (Any, None) for p in properties}
    model_name = "".join(part.title() for part in name.replace("-", "_").split("_")) + "McpArguments"
    return create_model(model_name, __config__=ConfigDict(extra="allow"), **fields)


@dataclass(frozen=True)
class McpTool(Tool):
    """A tool of an MCP server. `fn` and `reconcile` take `(arguments, context)`."""

    server: str = ""
    input_schema: dict[str, Any] = field(default_factory=dict)
    classification: Classification | None = None
    lookup: str | None = None

    def json_schema(self) -> dict[str, Any]:
        parameters = self.input_schema
        if self.guards.replaceable:
            # The `replaces` argument as every replaceable tool describes it (see onceflow.sdk.tools).
            described = super().json_schema()["parameters"]["properties"][REPLACES_ARGUMENT]
            properties = {**(parameters.get("properties") or {}), REPLACES_ARGUMENT: described}
            parameters = {**parameters, "properties": properties}
        return {"name": self.name, "description": self.description, "parameters": parameters}

    def validate_arguments(self, arguments: Any) -> dict[str, Any]:
        from jsonschema import Draft202012Validator

        if not isinstance(arguments, dict):
            raise InvalidToolArgumentsError(self.name, ["arguments must be a JSON object"])
        errors = sorted(Draft202012Validator(self.input_schema).iter_errors(arguments), key=str)
        if errors:
            problems = [
                f"{'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}" for e in errors
            ]
            raise InvalidToolArgumentsError(self.name, problems)
        return dict(arguments)

    def _call_kwargs(self, arguments: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        return {"arguments": arguments, "context": context}


class McpKitReceiver(ReceiverKit):
    """An MCP server on onceflow's receiver kit: its protocol tools, through the tool's connection."""

    def __init__(self, connection: McpConnection) -> None:
        self.connection = connection
        self.describe = f"receiver kit of MCP server {connection.name}"

    async def _ask(self, tool: str, context: ToolContext) -> dict[str, Any]:
        # The protocol's own key in `_meta`; the write's key is its argument and its write-key.
        meta = request_meta(lookup_key(context.idempotency_key), context.idempotency_key)
        result = await send(
            self.connection, tool, {LOOKUP_KEY_ARGUMENT: context.idempotency_key}, meta, check=False
        )
        answer = result.structured_content
        if answer is None and not result.is_error:
            try:
                answer = json.loads(result_text(result))
            except ValueError:
                answer = None
        if result.is_error or not isinstance(answer, dict) or "state" not in answer:
            raise McpCallError(
                f"{self.connection.name}.{tool}: not a protocol answer: {result_text(result)[:300]}"
            )
        return answer

    async def lookup(self, context: ToolContext) -> dict[str, Any]:
        return await self._ask(KIT_LOOKUP_TOOL, context)

    async def fence(self, context: ToolContext) -> dict[str, Any]:
        return await self._ask(KIT_FENCE_TOOL, context)

    def result_of(self, answer: Mapping[str, Any]) -> Any:
        """The stored tool result's value, as a live call would have handed it on."""
        from mcp.types import CallToolResult

        body = (answer.get("response") or {}).get("body")
        try:
            return result_value(CallToolResult.model_validate(body))
        except ValueError:
            return body


async def _session(connection: McpConnection, *, check: bool) -> Any:
    try:
        return await connection.session(check=check)
    except McpUnavailableError as exc:
        raise ToolNotAttemptedError(f"MCP server {connection.name!r}: {exc}") from exc
    except asyncio.CancelledError:
        # The tool's deadline struck while connecting: the request never left.
        raise ToolNotAttemptedError(f"no session with MCP server {connection.name!r} in time") from None


def request_meta(key: str, for_key: str | None = None) -> dict[str, str]:
    """A request's `_meta`: its own key, and the write's when it is made for one (onceflow.mcp.meta)."""
    meta = {IDEMPOTENCY_META_KEY: key}
    if for_key is not None:
        meta[WRITE_KEY_META_KEY] = for_key
    return meta


async def send(
    connection: McpConnection, tool: str, arguments: dict[str, Any], meta: dict[str, str], *, check: bool
) -> Any:
    """One `tools/call` carrying `meta` (see `request_meta`); raises as the module docstring says."""
    from mcp import MCPError

    client = await _session(connection, check=check)
    try:
        result = await connection.call_tool(client, tool, arguments, meta)
    except MCPError as exc:
        if exc.code in _REFUSED_CODES:
            raise ToolRejectedError(f"{connection.name} refused {tool}: {exc.message}") from exc
        if exc.code == _CONNECTION_CLOSED:
            await connection.discard(client)
        # Another error code is an answer: the session is fine, the outcome is not known.
        raise McpCallError(f"{connection.name}.{tool}: {exc.message} (JSON-RPC {exc.code})") from exc
    except (asyncio.CancelledError, TimeoutError):
        raise
    except Exception as exc:
        # RuntimeError/ValueError: the SDK did not like the answer (an input request, a result that
        # does not match the tool's output schema); the session itself is fine.
        if not isinstance(exc, RuntimeError | ValueError):
            await connection.discard(client)
        raise McpCallError(f"{connection.name}.{tool}: {type(exc).__name__}: {exc}") from exc
    return result


def make_tool(
    connection: McpConnection,
    listed: Any,
    effect: Effect,
    classification: Classification,
    lookup: str | None,
    *,
    guards: Guards | None = None,
    receiver_kit: bool = False,
) -> McpTool:
    """An McpTool for the listed tool `listed` (the SDK's Tool) of the server behind `connection`."""
    remote = listed.name
    changes_the_world = effect.changes_the_world

    async def call(arguments: dict[str, Any], context: ToolContext) -> Any:
        # A write checks the session first, so "could not connect" is known to be "not sent".
        meta = request_meta(context.idempotency_key, context.for_key)
        result = await send(connection, remote, arguments, meta, check=changes_the_world)
        if result.is_error:
            refused = kit_refusal(result)
            if refused is not None:
                raise refused
            if is_policy_refusal(result):
                raise ToolRefusedError(result_text(result)[:2000])
            raise ToolRejectedError(result_text(result)[:2000])
        return result_value(result)

    async def reconcile(arguments: dict[str, Any], context: ToolContext) -> ReconcileOutcome:
        assert lookup is not None
        key_argument = {LOOKUP_KEY_ARGUMENT: context.idempotency_key}
        try:
            # The lookup's own key in `_meta`; the write's key is its argument and its write-key.
            meta = request_meta(lookup_key(context.idempotency_key), context.idempotency_key)
            result = await send(connection, lookup, key_argument, meta, check=False)
        except (ToolNotAttemptedError, ToolRejectedError, McpCallError) as exc:
            return ReconcileOutcome.unknown(source=f"mcp {connection.name}.{lookup}", lookup_error=str(exc))
        return lookup_outcome(result, f"mcp {connection.name}.{lookup}")

    schema = dict(listed.input_schema or {"type": "object"})
    kit = McpKitReceiver(connection) if receiver_kit else None
    return McpTool(
        name=remote,
        toolset=connection.name,
        fn=call,
        effect=effect,
        description=listed.description or listed.title or remote,
        arguments_model=_arguments_model(remote, schema),
        context_parameter="context",
        reconcile=kit.reconcile_hook() if kit is not None else (reconcile if lookup else None),
        receiver=kit,
        server=connection.name,
        input_schema=schema,
        classification=classification,
        lookup=lookup,
        guards=guards or Guards(),
    )
