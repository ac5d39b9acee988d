"""The layer kustomize rendered, as plain Python data: what the other workloads filters take and copy.

``dinops_rendered_objects``  ``stdout | dinops_rendered_objects``: kustomize's output (YAML documents) as a list of
                             plain dicts, lists, strings and numbers, empty documents left out.

Why not ``from_yaml_all``: ansible-core 2.19 tags every scalar that its YAML loader reads with the scalar's origin
(a dataclass per string), and hands a filter its arguments as lazy containers; a filter's ``copy.deepcopy`` of the
objects then copies every tag. Measured on the build machine with the workloads role's render (k3s, training):
the task that folds the objects took 8.9 s of the role's 23 s with ``from_yaml_all``, under 0.5 s with plain data
(tests/cluster/test_workloads_rendered.py checks both facts against the installed ansible-core). ``plain`` is the
copy the filters make of what they are given, for the same reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

# libyaml's loader where PyYAML was built with it (ansible-core's own loader prefers it the same way).
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def plain(value: Any) -> Any:
    """A deep copy of JSON-like data made of builtin types only: lazy containers become dicts and lists, tagged
    strings and numbers their builtin values (``str.__str__`` of a str subclass is a plain str)."""
    if isinstance(value, Mapping):
        return {plain(key): plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(plain(item) for item in value)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    raise TypeError(f"not JSON-like data: {type(value).__name__} {value!r}")


def rendered_objects(text: str) -> list[dict[str, Any]]:
    """kustomize's output as plain data, one dict per document; an empty document is left out. Each document must
    be an object (a mapping), as kustomize writes them."""
    if not isinstance(text, str):
        raise TypeError(f"dinops_rendered_objects takes kustomize's output as text, got {type(text).__name__}")
    objects = []
    for number, document in enumerate(yaml.load_all(str.__str__(text), Loader=_LOADER), start=1):
        if document is None:
            continue
        if not isinstance(document, dict):
            raise TypeError(f"document {number} of the rendered layer is a {type(document).__name__}, not an object")
        objects.append(document)
    return objects


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"dinops_rendered_objects": rendered_objects}
