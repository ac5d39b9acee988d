"""WorkloadsError, the one refusal of the workloads filters: a setting that cannot be rendered or cannot run,
with a message that names the variable. Every filter module raises this class (they share this file's one copy,
see their ``_sibling``), so the role and the tests catch one class whichever module refused."""

from __future__ import annotations

from typing import Any


class WorkloadsError(ValueError):
    """A workloads setting that cannot be rendered; the message names the variable."""


def require(condition: bool, message: str) -> None:
    if not condition:
        raise WorkloadsError(message)


class FilterModule:
    """No filter: the other files' shared refusal (Ansible loads every file of filter_plugins)."""

    def filters(self) -> dict[str, Any]:
        return {}
