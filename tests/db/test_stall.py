"""A running job's progress, as the watchers read it from the database: seconds since the run's latest epoch (the
database's clock), and when that makes the job stalled (pgtrain.launch.stall). Real PostgreSQL."""

from __future__ import annotations

import psycopg

from pgtrain.launch.stall import check_stall, stall_reason
from pgtrain.runs import record
from tests.support import planned_run, seed_samples


def test_no_epoch_within_stall_timeout_of_running_is_a_stall():
    assert stall_reason(None, 59.0, 60) is None
    first = stall_reason(None, 60.0, 60)
    assert first is not None and "waiting for its first epoch; stall_timeout 60 s" in first
    assert stall_reason(30.0, 600.0, 60) is None  # an epoch 30 s ago
    later = stall_reason(61.0, 600.0, 60)
    assert later is not None and "no epoch recorded for 61 s" in later and "waiting for a new epoch" in later
    # an epoch recorded before the watcher saw the job running (a re-attached retry) counts from the running
    assert stall_reason(5000.0, 30.0, 60) is None


def test_the_seconds_since_the_last_epoch_come_from_the_database(ac: psycopg.Connection):
    seed_samples(ac, 40, dim=4, classes=2)
    run = planned_run(ac, "stall-clock", world_size=1, epochs=3)
    assert record.seconds_since_last_epoch(ac, run.run_id) is None
    assert check_stall(ac, run.run_id, 10.0, 10) is not None  # running 10 s, no first epoch
    record.record_epoch(ac, run.run_id, 1, {"train_loss": 0.5, "seconds": 0.1})
    ac.execute("UPDATE pgtrain.run_metrics SET recorded_at = now() - interval '90 seconds' WHERE run_id = %s",
               (run.run_id,))
    assert 89 <= record.seconds_since_last_epoch(ac, run.run_id) < 120
    assert "no epoch recorded for 9" in check_stall(ac, run.run_id, 1000.0, 60)
    record.record_epoch(ac, run.run_id, 2, {"train_loss": 0.4, "seconds": 0.1})
    assert record.seconds_since_last_epoch(ac, run.run_id) < 60
    assert check_stall(ac, run.run_id, 1000.0, 60) is None
