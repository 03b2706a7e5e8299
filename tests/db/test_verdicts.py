"""The trainer records its verdict in the run; both launchers read it there, never from log text.

Here the statuses and verdicts on a real PostgreSQL; the launchers reading them:
tests/integration/horovod/test_verdicts_local.py and tests/integration/k8s/test_verdicts_mpijob.py.
"""

from __future__ import annotations

import psycopg
import pytest

from pgtrain.runs import record
from tests.support import planned_run, seed_samples


def verdict(conn: psycopg.Connection, run_id: str) -> tuple[str, str | None]:
    run = record.get_run(conn, run_id)
    return run.status, run.status_reason


def test_training_and_refused_are_statuses_and_nonsense_is_not(autocommit):
    seed_samples(autocommit, rows=20)
    run = planned_run(autocommit, world_size=1)
    for status in ("training", "refused", "failed", "trained"):
        record.set_status(autocommit, run.run_id, status)
    with pytest.raises(psycopg.errors.CheckViolation):
        record.set_status(autocommit, run.run_id, "crashed")


def test_a_refusal_outranks_the_failures_it_causes_and_a_new_attempt_clears_both(autocommit):
    seed_samples(autocommit, rows=20)
    run = planned_run(autocommit, world_size=2)
    assert record.begin_attempt(autocommit, run.run_id) == 1
    assert verdict(autocommit, run.run_id) == ("training", None)
    record.record_verdict(autocommit, run.run_id, "failed", "RuntimeError: peer closed the connection")
    record.mark_training(autocommit, run.run_id)  # a slower rank starting does not hide the verdict
    record.record_verdict(autocommit, run.run_id, "failed", "RuntimeError: another")
    assert verdict(autocommit, run.run_id) == ("failed", "RuntimeError: peer closed the connection")
    record.record_verdict(autocommit, run.run_id, "refused", "rank 1 read 3 rows")
    record.record_verdict(autocommit, run.run_id, "failed", "RuntimeError: later")
    record.record_verdict(autocommit, run.run_id, "refused", "rank 0 read 2 rows")
    assert verdict(autocommit, run.run_id) == ("refused", "rank 1 read 3 rows")
    assert record.begin_attempt(autocommit, run.run_id) == 2
    assert verdict(autocommit, run.run_id) == ("training", None)
    with pytest.raises(ValueError):
        record.record_verdict(autocommit, run.run_id, "trained", "fine")


def delete_a_row_of_rank(conn: psycopg.Connection, run_id: str, rank: int) -> None:
    """After planning: the rank will find one row fewer than its manifest says, and refuse."""
    shard = record.get_manifest(conn, run_id)[rank]
    deleted = conn.execute("DELETE FROM public.samples WHERE id = (SELECT max(id) FROM public.samples "
                           "WHERE id BETWEEN %s AND %s)", (int(shard.key_lo), int(shard.key_hi))).rowcount
    assert deleted == 1
