from onceflow.examples.refunds_mcp.server import main

if __name__ == "__main__":
    main()
