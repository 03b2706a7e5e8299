"""Print a training run's summary.

    python -m pgtrain.cli.report [RUN_ID] [--require-committed]     # default: the most recent run
"""

from __future__ import annotations

import argparse
import sys

from pgtrain.core.db import connect
from pgtrain.core.errors import PgtrainError
from pgtrain.runs.record import latest_run_id
from pgtrain.runs.report import build_summary, format_summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pgtrain.cli.report", description=__doc__.splitlines()[0])
    parser.add_argument("run_id", nargs="?", help="default: the most recent run")
    parser.add_argument("--require-committed", action="store_true", help="exit 1 unless the run committed")
    args = parser.parse_args(argv)
    with connect() as conn:
        run_id = args.run_id or latest_run_id(conn)
        if run_id is None:
            print("no training runs yet", file=sys.stderr)
            return 1
        try:
            summary = build_summary(conn, run_id)
        except PgtrainError as error:
            print(error, file=sys.stderr)
            return 1
    print(format_summary(summary))
    return 1 if args.require_committed and summary["status"] != "committed" else 0


if __name__ == "__main__":
    sys.exit(main())
