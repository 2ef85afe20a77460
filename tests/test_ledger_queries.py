"""Where the ledger's SQL and its tables of outcomes live (STYLE.md: all SQL as named statements).

Read from the source with `ast`, no database: every statement of ledger/queries/ is reachable as
`queries.NAME`, no other ledger module spells SQL of its own (migrate.py applies the migration
files and keeps its schema-version bookkeeping), and the plain reservation's table of outcomes
(status -> Reservation) exists once, in ledger/calls.py; the guarded path gets its outcome from
the SQL function.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from onceflow.ledger import queries

LEDGER = Path(__file__).resolve().parent.parent / "ledger"
ROOT = LEDGER.parent
_SQL = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH)\s", re.IGNORECASE)
# Outside ledger/queries/: the migration runner's own bookkeeping statements.
_SQL_ALLOWED = {LEDGER / "migrate.py"}


def _statements(path: Path) -> dict[str, str]:
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            (target,) = node.targets
            assert isinstance(target, ast.Name) and isinstance(node.value.value, str)
            found[target.id] = node.value.value
    return found


def _python_files(*folders: str) -> list[Path]:
    return sorted(path for folder in folders for path in (ROOT / folder).rglob("*.py"))


def test_every_statement_is_defined_once_and_reachable_from_the_package() -> None:
    defined: dict[str, str] = {}
    for module in sorted((LEDGER / "queries").glob("*.py")):
        if module.name == "__init__.py":
            continue
        for name, text in _statements(module).items():
            assert name not in defined, f"{name} is defined in {defined[name]} and in {module.name}"
            defined[name] = module.name
            assert getattr(queries, name) == text
    assert sorted(defined) == sorted(queries.__all__)
    assert len(defined) > 40  # the split kept every statement


def test_no_ledger_module_outside_queries_spells_sql() -> None:
    spelled = []
    for path in _python_files("ledger"):
        if path.parent.name == "queries" or path in _SQL_ALLOWED:
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                if _SQL.match(node.value):
                    spelled.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert spelled == []


def _outcome_tables(path: Path) -> list[int]:
    """Lines of dict literals whose values are Reservation members: tables of reservation outcomes."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Dict) and node.values:
            values = node.values
            if all(
                isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and v.value.id == "Reservation"
                for v in values
            ):
                lines.append(node.lineno)
    return lines


def test_the_plain_reservation_outcome_table_exists_once() -> None:
    tables = {
        str(path.relative_to(ROOT)): found
        for path in _python_files("ledger", "activities", "workflows", "onceflow")
        if (found := _outcome_tables(path))
    }
    assert list(tables) == ["ledger/calls.py"]
    assert len(tables["ledger/calls.py"]) == 1


def test_the_table_finder_finds_a_table(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("T = {Status.HELD: Reservation.HELD}\nU = {1: 2}\n")
    assert _outcome_tables(sample) == [1]
