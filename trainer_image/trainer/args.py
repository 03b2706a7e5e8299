"""The rank's command line: read before torch is imported (trainer.prefetch needs it) and again by trainer.train."""

from __future__ import annotations

import argparse

from pgtrain.config.params import DEFAULT_COLLECTIVE_TIMEOUT


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainer", description="one rank of a pgtrain run")
    parser.add_argument("--run-id", required=True, help="the training run (pgtrain.training_runs.run_id)")
    # Required: an unfenced trainer (started by hand) could overwrite a newer attempt's output.
    parser.add_argument("--attempt", type=int, required=True,
                        help="the train attempt (pgtrain.runs.record.begin_attempt); a stale attempt cannot write")
    # The launcher's choice: it started the ranks the way this backend needs (pgtrain.launch.backends).
    parser.add_argument("--backend", choices=("horovod", "torch"), default="horovod",
                        help="the ranks' collectives (trainer.collectives)")
    parser.add_argument("--collective-timeout", type=float, default=DEFAULT_COLLECTIVE_TIMEOUT,
                        help="torch backend: seconds a rank waits in one collective before the job fails")
    parser.add_argument("--alone", action="store_true",
                        help="the run's only rank, started by the local launcher itself: no horovodrun, no "
                             "rendezvous (trainer.collectives.solo)")
    return parser.parse_args(argv)
