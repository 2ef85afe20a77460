"""Ending a process that used a Temporal client, without the interpreter's teardown.

The Temporal SDK does its network work on native threads (Rust, tokio). After `main` returns, one
of them can still be finishing a call and touch Python objects while the interpreter is freeing
them. The process then dies of SIGSEGV or SIGABRT ("PyGILState_Release ... finalizing",
temporalio/sdk-python#300) although every piece of its work is done and recorded: a supervisor
reports a crashed worker where there was a clean stop, and a deploy pipeline may roll back.
Seen here: a worker stopped by SIGTERM died of SIGSEGV in a CI run (a tokio thread freeing a
Python object, per the kernel log), and a short client script that starts, describes and terminates
a workflow aborted in 13 of 190 exits (bench/client_exit.py; none of 220 with this function).

Every onceflow process that holds a Temporal client ends through it: `python worker.py` and
`onceflow worker`, `onceflow dev`, `onceflow demo`, `onceflow run start` and `onceflow drill`. (The
operator API needs it not: uvicorn re-raises the SIGTERM it caught, and the signal ends it first.)

`exit_after_cleanup` does what a normal exit does that anyone can observe, in the interpreter's
own order (Py_FinalizeEx): it waits for non-daemon threads, runs the atexit handlers (the
OpenTelemetry providers flush their spans and metrics there, and so does anything a tool
registered), and flushes stdout and stderr. Then `os._exit` ends the process, skipping only the
teardown of modules and objects, which is where those native threads race.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def exit_after_cleanup(code: int = 0) -> NoReturn:
    """Exit with `code` after threads, atexit handlers and stdio are done; skip the teardown."""
    # What Python runs first when it exits: the callbacks that tell executors' idle threads to
    # stop, then a join of every non-daemon thread. CPython calls it by this name.
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a pipe whose reader is gone
            pass
    os._exit(code)
