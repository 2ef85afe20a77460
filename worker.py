"""Run a onceflow worker: `python worker.py`.

Reads TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, ONCEFLOW_TASK_QUEUE, ONCEFLOW_DATABASE_URL and
ONCEFLOW_AGENTS (default ./agents.yaml). Stops cleanly on SIGINT or SIGTERM.
"""

from onceflow.worker import main

if __name__ == "__main__":
    main()
