"""How many CPU threads torch's operators get: the container's CPU limit, not the host's core count.

torch sizes its intra-op pool from the cores it can see (``torch.get_num_threads()``: the affinity mask), which in a
pod limited to 2 CPUs on a 32-core node is 32: the kernel's CFS quota then throttles the process every period and a
forward pass takes several times longer. The limit is the cgroup's CPU quota:

* cgroup v2: ``cpu.max`` holds ``"$MAX $PERIOD"`` (``max`` = no limit); kernel documentation,
  Documentation/admin-guide/cgroup-v2.rst, "cpu.max".
* cgroup v1: ``cpu.cfs_quota_us`` (-1 = no limit) and ``cpu.cfs_period_us`` under the ``cpu`` controller;
  Documentation/scheduler/sched-bwc.rst.

A fractional limit rounds up (1.5 CPUs: 2 threads); the result is never more than the usable cores.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

log = logging.getLogger(__name__)


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cgroup_cpu_limit(root: str | Path = "/sys/fs/cgroup") -> float | None:
    """The CPU quota of this container in CPUs (``1.5``), or None when there is none or it cannot be read."""
    root = Path(root)
    v2 = _read(root / "cpu.max")
    if v2 is not None:
        parts = v2.split()
        if len(parts) == 2 and parts[0] != "max":
            try:
                quota, period = int(parts[0]), int(parts[1])
            except ValueError:
                return None
            return quota / period if quota > 0 and period > 0 else None
        return None
    for controller in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        quota, period = _read(root / controller / "cpu.cfs_quota_us"), _read(root / controller / "cpu.cfs_period_us")
        if quota is not None and period is not None:
            try:
                q, p = int(quota), int(period)
            except ValueError:
                return None
            return q / p if q > 0 and p > 0 else None
    return None


def torch_threads(setting: int, root: str | Path = "/sys/fs/cgroup") -> tuple[int, str]:
    """Threads for ``torch.set_num_threads`` and where the number comes from.

    ``setting`` > 0 is taken as given; 0 means the container's CPU limit (rounded up), else the usable cores.
    """
    if setting < 0:
        raise ValueError(f"torch threads must be 0 (the CPU limit) or a positive number, got {setting}")
    if setting > 0:
        return setting, "DINO_TORCH_THREADS"
    cores = usable_cores()
    limit = cgroup_cpu_limit(root)
    if limit is None:
        return cores, f"{cores} usable cores, no CPU limit"
    return min(cores, max(1, math.ceil(limit - 1e-9))), f"CPU limit {limit:g} of {cores} usable cores"
