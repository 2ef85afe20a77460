"""An MCP server on onceflow's receiver kit (onceflow.receiver.mcp): refunds applied once per key.

python -m onceflow.examples.refunds_mcp --database-url DSN     # stdio
"""
