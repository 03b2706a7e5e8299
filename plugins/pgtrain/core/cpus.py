"""How many CPUs this process may use: its affinity mask, capped by its container's CPU limit.

``sched_getaffinity`` lists every CPU of the node (128 on a large one) even when the container may use only a few:
the limit is a CFS quota (``cpu.max`` in cgroup v2, ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` in v1), and
threads beyond it only wait for their share.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def usable_cpus(cgroup_root: Path = CGROUP_ROOT) -> int:
    """The CPUs this process may run on, no more than its cgroup's quota allows (rounded up)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cgroup_cpu_quota(cgroup_root)
    return max(1, min(cpus, math.ceil(quota))) if quota is not None else cpus


def cgroup_cpu_quota(cgroup_root: Path = CGROUP_ROOT) -> float | None:
    """The cgroup's CPU limit in CPUs (quota / period), or None when it has none or none can be read."""
    try:  # cgroup v2: "max 100000" (no limit) or "<quota> <period>"
        quota, period = (cgroup_root / "cpu.max").read_text().split()
        return None if quota == "max" else _cpus(int(quota), int(period))
    except (OSError, ValueError):
        pass
    for directory in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):  # cgroup v1: quota -1 means no limit
        try:
            quota = int((cgroup_root / directory / "cpu.cfs_quota_us").read_text())
            period = int((cgroup_root / directory / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return None if quota < 0 else _cpus(quota, period)
    return None


def _cpus(quota: int, period: int) -> float | None:
    return quota / period if quota > 0 and period > 0 else None
