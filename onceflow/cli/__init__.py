"""The `onceflow` command line."""

from onceflow.cli.commands import app, main

__all__ = ["app", "main"]
