"""What onceflow puts in an MCP request's `_meta`, for server authors to read.

A write call (`tools/call` of a tool onceflow classifies as write, external or destructive) carries
the call's ledger key, `<run_id>:<tool_call_id>`, as a string under this name. It is the same for
every attempt, replay and reconcile lookup of that call, so a server that applies at most one
effect per key makes the call take effect once.
"""

IDEMPOTENCY_META_KEY = "io.onceflow/idempotency-key"

# On a result: `isError: true` with `_meta["io.onceflow/refused"] = true` is a refusal on policy
# grounds (an authorization limit, a guardrail). onceflow records it `failed` (`policy_refused`),
# final: the call is never sent again, and the model is told not to make it again. An `isError`
# result without it stays an ordinary rejection.
REFUSED_META_KEY = "io.onceflow/refused"
