"""exit_after_cleanup: a process ends as a normal exit would, minus the interpreter's teardown.

Each case runs a small script in a fresh interpreter. The script leaves the traces a normal exit
leaves (a non-daemon thread's last words, an atexit handler's, buffered stdout, an idle executor
thread that must be told to stop) and one that only the teardown leaves: an object whose `__del__`
runs when module globals are freed. The same script ending on its own is the control: it shows the
teardown trace does appear when the teardown runs, so its absence means something.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import atexit, sys, threading, time
    from concurrent.futures import ThreadPoolExecutor

    class FreedAtTeardown:
        def __del__(self):
            sys.stderr.write("teardown ran\\n")

    kept = FreedAtTeardown()
    atexit.register(lambda: sys.stderr.write("atexit ran\\n"))

    def late():
        time.sleep(0.3)
        sys.stderr.write("thread finished\\n")

    threading.Thread(target=late).start()
    pool = ThreadPoolExecutor(max_workers=1)  # its thread stays, idle, until Python says stop
    pool.submit(lambda: None).result()
    sys.stdout.write("buffered, no newline")  # stdout is a pipe: held in the buffer until flushed

    if sys.argv[1] == "exit_after_cleanup":
        from onceflow.runtime.process_exit import exit_after_cleanup
        exit_after_cleanup(3)
    sys.exit(3)
    """
)


def run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=30, check=False
    )


def test_exit_after_cleanup_keeps_what_a_normal_exit_does() -> None:
    ended = run(SCRIPT, "exit_after_cleanup")

    assert ended.returncode == 3
    assert ended.stdout == "buffered, no newline"
    # Threads first, then atexit handlers: the interpreter's own order.
    assert ended.stderr.splitlines() == ["thread finished", "atexit ran"]


def test_exit_after_cleanup_skips_the_teardown_a_normal_exit_runs() -> None:
    normal = run(SCRIPT, "normal")
    assert normal.returncode == 3
    assert normal.stderr.splitlines() == ["thread finished", "atexit ran", "teardown ran"]

    ended = run(SCRIPT, "exit_after_cleanup")
    assert "teardown ran" not in ended.stderr


SPAN_SCRIPT = textwrap.dedent(
    """
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    provider = TracerProvider()  # flushes its batch from an atexit handler
    provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter(), schedule_delay_millis=60_000))
    trace.set_tracer_provider(provider)
    with trace.get_tracer("t").start_as_current_span("last call before exit"):
        pass

    from onceflow.runtime.process_exit import exit_after_cleanup
    exit_after_cleanup(0)
    """
)


def test_a_span_ended_just_before_the_exit_still_reaches_its_exporter() -> None:
    ended = run(SPAN_SCRIPT)
    assert ended.returncode == 0, ended.stderr
    assert '"name": "last call before exit"' in ended.stdout
