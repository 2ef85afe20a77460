"""README's configuration table says what the code reads: each variable once, with the code's default."""

from __future__ import annotations

from pathlib import Path

from onceflow.runtime.config import ALL_ENVIRONMENT
from onceflow.runtime.constants import ACTIVITY_MARGIN
from onceflow.runtime.shutdown import SHUTDOWN_SLACK

README = Path(__file__).resolve().parent.parent / "README.md"


def _configuration_rows() -> list[tuple[str, str]]:
    """(variable, default) of each row of the table under "## Configuration"."""
    section = README.read_text().split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) >= 3:
            rows.append((cells[0].strip("`"), cells[1]))
    return rows


def test_each_variable_has_one_row_and_every_variable_the_code_reads_has_one() -> None:
    names = [name for name, _ in _configuration_rows()]
    assert sorted(name for name in set(names) if names.count(name) > 1) == []
    assert sorted(set(ALL_ENVIRONMENT) - set(names)) == []


def test_each_default_is_the_codes() -> None:
    defaults = dict(_configuration_rows())
    for name, default in ALL_ENVIRONMENT.items():
        if default:
            assert defaults[name] == f"`{default}`", name
    # Unset, the grace is the slowest tool's timeout plus the activity's margin and the slack.
    slack = (ACTIVITY_MARGIN + SHUTDOWN_SLACK).total_seconds()
    assert defaults["ONCEFLOW_SHUTDOWN_GRACE"] == f"slowest tool timeout + {slack:g} s"
