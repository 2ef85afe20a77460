"""onceflow's write protocol for agents written with other frameworks, on the same worker, ledger,
operator API and CLI as onceflow's own runs.

- `onceflow.adapters.host`: what every adapter shares and imports no framework: `WriteTools` (the
  write tools, declared with onceflow's own decorators, as the ledger and the worker know them) and
  `OnceflowHost` (the base class a hosting workflow inherits, for the `resolve` signal and update,
  `escalated`, `conflict`, the `status` query and onceflow's search attributes).
- `onceflow.adapters.heard`: what the model heard of earlier calls (passed to the ledger with each
  write), `OnceflowState` for continue-as-new, and `OnceflowInterceptor`, which OnceflowPlugin adds.
- `onceflow.adapters.pydantic_ai` (extra `onceflow[pydantic-ai]`) and
  `onceflow.adapters.openai_agents` (extra `onceflow[openai-agents]`) import their framework; import
  them only where it is installed.

The worker takes `onceflow.OnceflowPlugin` (onceflow/runtime/plugin.py). docs/adapters.md says how
to adopt them.
"""
