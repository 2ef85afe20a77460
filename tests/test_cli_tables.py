"""The command line's tables (onceflow/cli/tables.py), drawn by rich: on a pipe they are plain text that
splits on whitespace, never wrapped, cut or coloured; in a terminal a key is never cut or wrapped.

Each case runs the drawing in a fresh interpreter, its stdout a pipe or a pseudo-terminal."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

LONG_KEY = "run-" + "7" * 200 + ":call-[red]1[/red]-:smile:"
DRAW = f"""
from onceflow.cli.tables import field_lines, table_lines
rows = [[{LONG_KEY!r}, "indeterminate", "why " * 30], ["r:2", "held", ""]]
for line in table_lines(["KEY", "STATUS", "NOTES"], rows, wrap={{"NOTES"}}):
    print(line)
print()
for line in field_lines([("key", {LONG_KEY!r}), ("payload sha256", "ab" * 32)]):
    print(line)
"""


def _on_a_pipe() -> str:
    done = subprocess.run(
        [sys.executable, "-c", DRAW],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "40"},
        check=True,
    )
    return done.stdout


def _in_a_terminal(columns: int) -> str:
    primary, secondary = pty.openpty()
    env = {**os.environ, "COLUMNS": str(columns), "LINES": "50", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    with subprocess.Popen(
        [sys.executable, "-c", DRAW], stdout=secondary, stderr=subprocess.PIPE, env=env
    ) as proc:
        os.close(secondary)
        chunks = []
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    os.close(primary)
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_on_a_pipe_rows_are_whole_lines_of_plain_text() -> None:
    out = _on_a_pipe()
    table, fields = out.split("\n\n")
    header, first, second = table.splitlines()
    assert header.split() == ["KEY", "STATUS", "NOTES"]
    # Not wrapped or cut at COLUMNS=40, and markup or emoji codes in a value are shown as written.
    assert first.split() == [LONG_KEY, "indeterminate", *["why"] * 30]
    assert second.split() == ["r:2", "held"]
    assert "\x1b" not in out
    assert all(line == line.rstrip() for line in out.splitlines())
    # Two spaces between columns, so a label with a space in it still reads as one.
    assert first.startswith(LONG_KEY + "  indeterminate  why")
    assert fields.splitlines() == [
        "key" + " " * 13 + LONG_KEY,
        "payload sha256  " + "ab" * 32,
    ]


def test_in_a_narrow_terminal_keys_stay_whole_and_free_text_wraps() -> None:
    out = _in_a_terminal(columns=60)
    assert "\x1b[1m" in out  # bold headers, for a person
    plain = [line for line in out.splitlines() if LONG_KEY in line]
    # The key is whole on one line in the table and in the fields, never folded or cut.
    assert len(plain) == 2
    notes = out.split("\n\n")[0].splitlines()
    assert sum("why" in line for line in notes) > 1  # the free-text column wrapped under itself
