"""Shared by the benchmark scripts: print a figure as it is measured, and finish with one JSON line."""

from __future__ import annotations

import json
import platform
import sys
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "plugins"))


def machine() -> dict[str, object]:
    import os

    return {"python": platform.python_version(), "cpus": os.cpu_count(), "machine": platform.machine()}


@contextmanager
def stopwatch():
    """with stopwatch() as elapsed: ...; elapsed() -> seconds (frozen when the block ends)."""
    start = time.perf_counter()
    end: list[float] = []
    yield lambda: (end[0] if end else time.perf_counter()) - start
    end.append(time.perf_counter())


def report(figures: dict[str, float | int | str]) -> None:
    """Print each figure on its own line, then all of them as the final JSON line (read by run_all)."""
    for name, value in figures.items():
        print(f"  {name:<48} {value}")
    print(json.dumps(figures, sort_keys=True))
