"""`${NAME}` in configuration values, replaced by the worker's environment when the value is used.

Only a well-formed name is a reference: `${1X}` or `${A:-b}` stays as written (a shell command in an
MCP server's `args` may mean it for the shell). `malformed_references` finds those, for settings
where nothing but a reference can be meant (HTTP headers of a model provider).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_BRACED = re.compile(r"\$\{([^}]*)\}")


class UnsetVariableError(ValueError):
    """A value uses ${NAME} and the environment has no NAME. Says which variable and where."""

    def __init__(self, name: str, where: str) -> None:
        super().__init__(f"{where} uses ${{{name}}}, which is not set in the environment")
        self.name = name
        self.where = where


def references(text: str) -> list[str]:
    """The variables `text` names, in order."""
    return _REFERENCE.findall(text)


def malformed_references(text: str) -> list[str]:
    """What stands inside `${...}` in `text` without being a variable name."""
    return [inside for inside in _BRACED.findall(text) if not _REFERENCE.fullmatch(f"${{{inside}}}")]


def expand_variables(text: str, where: str, environ: Mapping[str, str] | None = None) -> str:
    """`text` with each ${NAME} replaced; `where` names the setting in the error for an unset one."""
    values = os.environ if environ is None else environ

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        found = values.get(name)
        if found is None:
            raise UnsetVariableError(name, where)
        return found

    return _REFERENCE.sub(substitute, text)
