"""How much memory this process can still allocate: the host's MemAvailable and its container's headroom.

A container over its cgroup limit is killed by the kernel, not refused by malloc, so the allocator
never raises there; the trainer compares a model's size with this figure before it allocates it.
"""

from __future__ import annotations

from pathlib import Path

# cgroup v2, then v1: (limit file, usage file). v1 writes a huge number for "no limit".
_CGROUP_FILES = (
    (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory.current")),
    (Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"), Path("/sys/fs/cgroup/memory/memory.usage_in_bytes")),
)
_MEMINFO = Path("/proc/meminfo")

# Bytes a float32 parameter costs while training: the weight, its gradient, AdamW's two moments (the default
# optimizer; SGD keeps one momentum), Horovod's fusion copy of the gradient, and early stopping's copy of the
# best epoch's weights.
TRAINING_BYTES_PER_PARAMETER = 6 * 4


def available_bytes() -> int | None:
    """The smaller of the host's available memory and the cgroup's limit minus its usage; None if unknown."""
    found = [value for value in (_meminfo_available(), _cgroup_headroom()) if value is not None]
    return min(found) if found else None


def _meminfo_available() -> int | None:
    try:
        for line in _MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_headroom() -> int | None:
    for limit_file, usage_file in _CGROUP_FILES:
        try:
            limit_text = limit_file.read_text().strip()
            if limit_text == "max":
                return None
            return max(0, int(limit_text) - int(usage_file.read_text().strip()))
        except (OSError, ValueError):
            continue
    return None
