"""MCP servers as toolsets: declared in agents.yaml, classified by their annotations, keyed, sent once.

- `config`: what agents.yaml says (`mcp_servers:`); no SDK import, so the base install reads it.
- `classify`: annotations (and overrides) to onceflow's side-effect class, with the reason.
- `connection`: one session per server per worker process, re-made after the server dies.
- `tools`: each listed tool as an onceflow `Tool`; the key travels in `_meta` (see `meta`).
- `runtime`: `mcp_toolsets(registry)` starts the servers and attaches their tools (worker start-up).
- `inspect`: `onceflow mcp inspect <server>`.

The SDK itself (`pip install 'onceflow[mcp]'`) is imported only when a server is started.
"""

from onceflow.mcp.classify import Classification, Hints, classify
from onceflow.mcp.config import McpConfigError, McpServerConfig, McpToolConfig
from onceflow.mcp.meta import IDEMPOTENCY_META_KEY

__all__ = [
    "IDEMPOTENCY_META_KEY",
    "Classification",
    "Hints",
    "McpConfigError",
    "McpServerConfig",
    "McpToolConfig",
    "classify",
]
