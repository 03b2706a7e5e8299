"""Run every benchmarks/bench_*.py (or those named), collect their final JSON lines into results.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(names: list[str]) -> int:
    scripts = [HERE / f"bench_{n}.py" for n in names] if names else sorted(HERE.glob("bench_*.py"))
    results_path = Path(os.environ.get("PGTRAIN_BENCH_RESULTS") or HERE / "results.json")
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    failed = []
    for script in scripts:
        print(f"== {script.name}", flush=True)
        proc = subprocess.run([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
        print(proc.stdout, end="")
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            failed.append(script.name)
            continue
        results.update(json.loads(lines[-1]))
    results_path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(f"wrote {results_path}")
    if failed:
        print("failed: " + ", ".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
