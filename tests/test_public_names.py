"""What tool authors and client code import from `onceflow` itself, and what that import costs."""

from __future__ import annotations

import json
import subprocess
import sys

import onceflow


def test_every_public_name_resolves() -> None:
    for name in onceflow.__all__:
        assert getattr(onceflow, name) is not None, name


def test_the_names_tool_authors_use_import_from_the_top() -> None:
    from onceflow import Guards, ToolContext, Toolset, external, read

    assert {Guards.__name__, ToolContext.__name__, Toolset.__name__} == {"Guards", "ToolContext", "Toolset"}
    assert callable(external) and callable(read)


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        onceflow.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("onceflow.NoSuchThing resolved")


def test_importing_onceflow_imports_none_of_its_modules() -> None:
    # Temporal's sandbox re-imports a workflow module's parent packages: an eager `onceflow`
    # would give it second copies of the ledger's enums, and a replay would take another path.
    done = subprocess.run(
        [sys.executable, "-c", "import json, sys, onceflow; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
    )
    loaded = [name for name in json.loads(done.stdout) if name.startswith("onceflow.")]
    assert loaded == []
