"""Kubernetes quantities as the workloads filters read and write them: memory in whole MiB (rounded up), CPU in
millicores, and the name of the GPU resource, so that the sizing (sizing.py), the Docker runtime and the Kubeflow
kinds read one quantity the same way."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any


def _sibling(stem: str) -> ModuleType:
    """A sibling filter file, read by path as Ansible loads each plugin file on its own, once per process and folder
    (kept in sys.modules): every workloads filter then raises the one WorkloadsError class its callers catch."""
    name = f"dinops_workloads_{stem}:{Path(__file__).resolve().parent}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{stem}.py"))
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


WorkloadsError = _sibling("workloads_error").WorkloadsError
_require = _sibling("workloads_error").require

GPU_RESOURCE = "nvidia.com/gpu"
# Kubernetes quantity: a number with an optional binary or decimal suffix.
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
# Binary and decimal suffixes of a Kubernetes quantity, in MiB.
_MI = {"": 1 / 2**20, "Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 2**20, "Pi": 2**30, "Ei": 2**40}
_MI |= {suffix: 1000**power / 2**20 for power, suffix in enumerate(("k", "M", "G", "T", "P", "E"), start=1)}


def quantity_mi(text: Any) -> int:
    """A memory quantity ("8G", "8Gi", "512Mi") in whole MiB, rounded up."""
    match = QUANTITY.match(str(text))
    _require(bool(match), f"not a memory quantity: {text!r}")
    number = float(str(text)[: match.start(2)] if match.group(2) else str(text))
    return int(-(-number * _MI[match.group(2) or ""] // 1))


def cpu_m(text: Any) -> int:
    """A CPU quantity ("2", "500m", "0.5") in millicores."""
    text = str(text)
    return int(text[:-1]) if text.endswith("m") else int(round(float(text) * 1000))


def fmt_cpu(m: int) -> str:
    return f"{m}m"


def fmt_mem(mi: int) -> str:
    return f"{mi}Mi"


class FilterModule:
    """No filter: the quantity parsers of the other files (Ansible loads every file of filter_plugins)."""

    def filters(self) -> dict[str, Any]:
        return {}
