"""What onceflow puts in an MCP request's `_meta`, for server authors to read.

Every `tools/call` onceflow sends carries a key of its own under IDEMPOTENCY_META_KEY, a string:

- a write (a tool onceflow classifies as write, external or destructive): the call's ledger key,
  `<run_id>:<tool_call_id>`, the same for every attempt, replay and resend of that call, so a server
  that applies at most one effect per key makes the call take effect once;
- a read the model asked for: its own call's key, `<run_id>:<tool_call_id>` (a different call id);
- a read onceflow makes for a write (a budget's `limit_from` read, `<write key>:limit`) and a
  reconcile lookup (`<write key>:lookup:<nonce>`, new for every lookup, so that no cache answers one
  lookup with an earlier one's "not found"): a key of their own, with the write's key under
  WRITE_KEY_META_KEY.

So a server (or a gateway in front of it) that deduplicates on the key alone, whatever the tool,
can never answer a write with a read's cached answer, nor a read with the write's.
"""

IDEMPOTENCY_META_KEY = "io.onceflow/idempotency-key"

# On a limit read or a reconcile lookup: the ledger key of the write it is made for.
WRITE_KEY_META_KEY = "io.onceflow/write-key"

# On a result: `isError: true` with `_meta["io.onceflow/refused"] = true` is a refusal on policy
# grounds (an authorization limit, a guardrail). onceflow records it `failed` (`policy_refused`),
# final: the call is never sent again, and the model is told not to make it again. An `isError`
# result without it stays an ordinary rejection.
REFUSED_META_KEY = "io.onceflow/refused"

# Servers on onceflow's receiver kit (onceflow.receiver.mcp): a refusal of the kit is an error result
# naming its problem here (`missing-key`, `bad-key`, `key-reused`, `key-in-progress`, `key-fenced`),
# and a result given again for a key that completed before says so here.
RECEIVER_PROBLEM_META_KEY = "io.onceflow/receiver-problem"
REPLAYED_META_KEY = "io.onceflow/replayed"

# The kit's reconcile protocol as tools, each taking `idempotency_key`: the lookup (read-only) and
# the fence. A tool declared `receiver: kit` in agents.yaml is reconciled through them.
KIT_LOOKUP_TOOL = "onceflow_key_lookup"
KIT_FENCE_TOOL = "onceflow_key_fence"
