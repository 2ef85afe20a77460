"""The billing example as an MCP server: the same orders and credits, spoken over MCP.

Run it over stdio (an MCP client launches it) or streamable HTTP:

    python -m examples.billing_mcp --db credits.db                       # stdio
    python -m examples.billing_mcp --db credits.db --http --port 8931    # http://127.0.0.1:8931/mcp
"""

from onceflow.examples.billing_mcp.server import IDEMPOTENCY_META_KEY, create_server, requests_received

__all__ = ["IDEMPOTENCY_META_KEY", "create_server", "requests_received"]
