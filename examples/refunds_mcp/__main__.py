from onceflow.examples.refunds_mcp.server import main

main()
