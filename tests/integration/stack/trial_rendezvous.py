"""A model factory for the stack's search tests (``model="tests.integration.stack.trial_rendezvous:rendezvous_mlp"``,
allowed by the stack's settings file): the built-in mlp, whose build in a trial's rank first waits, bounded, until
``peers`` trials of the same search are in status 'training' at once (pgtrain.training_runs), or until the search
already had such a moment; and, with ``gated``, until the test opens the trial's gate. What each rank saw is
recorded in public.search_trial_overlap (TABLES_SQL), so the test reads from the database, not from timing, that
trials trained together and how many at most.

The factory reads its run from the trainer's ``--run-id`` and connects as the rank does (pgtrain.core.db.connect:
the URL and passfile the launcher gave the ranks).
"""

from __future__ import annotations

import sys
import time

import torch
from torch import nn

from pgtrain.core.db import connect
from pgtrain.models.network import mlp

# run_id, attempt, seen (trials of the search training at once), training (their run ids)
TABLES_SQL = ("CREATE TABLE IF NOT EXISTS public.search_trial_overlap (run_id text NOT NULL, attempt integer NOT "
              "NULL, seen integer NOT NULL, training text[] NOT NULL, at timestamptz NOT NULL DEFAULT "
              "clock_timestamp())",
              "CREATE TABLE IF NOT EXISTS public.search_trial_gate (run_id text PRIMARY KEY)")  # the trial may go on
TRIAL_MARK = "/trial-"  # pgtrain.runs.trials names a search's trials <search run>/trial-<n>


def rendezvous_mlp(input_dim: int, output_dim: int, width: int = 8, peers: int = 2, wait_seconds: float = 120.0,
                   gated: bool = False) -> nn.Module:
    net = mlp(input_dim, output_dim, hidden_sizes=[width])
    run_id = _run_id()
    # Not in a rank (a version loaded to score), or the rank's dry build that sizes the model: no waiting there.
    if run_id is None or torch.empty(0).device.type == "meta":
        return net
    search_run = run_id.rpartition(TRIAL_MARK)[0]
    deadline = time.monotonic() + wait_seconds
    with connect() as conn:
        while True:
            attempt, = conn.execute("SELECT attempt FROM pgtrain.training_runs WHERE run_id = %s",
                                    (run_id,)).fetchone()
            training = [r for r, in conn.execute(
                "SELECT run_id FROM pgtrain.training_runs WHERE run_id LIKE %s AND status = 'training' "
                "ORDER BY run_id", (f"{search_run}{TRIAL_MARK}%",))]
            met = len(training) >= peers or conn.execute(
                "SELECT EXISTS (SELECT FROM public.search_trial_overlap WHERE run_id LIKE %s AND seen >= %s)",
                (f"{search_run}{TRIAL_MARK}%", peers)).fetchone()[0]
            opened = not gated or conn.execute(
                "SELECT EXISTS (SELECT FROM public.search_trial_gate WHERE run_id = %s)", (run_id,)).fetchone()[0]
            if met and opened:
                conn.execute("INSERT INTO public.search_trial_overlap (run_id, attempt, seen, training) "
                             "VALUES (%s, %s, %s, %s)", (run_id, attempt, len(training), training))
                return net
            if time.monotonic() > deadline:
                raise RuntimeError(f"{run_id}: waited {wait_seconds:g} s and never saw {peers} trials of the search "
                                   f"training at once (last seen: {training or 'none'})"
                                   + ("" if opened else ", and the test never opened this trial's gate"))
            time.sleep(0.3)


def _run_id() -> str | None:
    """The trainer's ``--run-id``: None outside a trainer rank."""
    argv = sys.argv
    return argv[argv.index("--run-id") + 1] if "--run-id" in argv[:-1] else None
