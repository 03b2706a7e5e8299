"""The local launcher reads the trainer's verdict from the run, never from log text (real Horovod ranks)."""

from __future__ import annotations

import logging
import sys

import pytest

from pgtrain.core.errors import TrainingFailed, TrainingInputError
from pgtrain.launch import local as launch_local
from pgtrain.runs import record
from tests.db.test_verdicts import delete_a_row_of_rank, verdict
from tests.support import planned_run, seed_samples


@pytest.mark.horovod
def test_one_refusing_rank_of_two_fails_the_job_for_good_with_its_reason(autocommit, db_url):
    seed_samples(autocommit, rows=300, dim=8, classes=3)
    run = planned_run(autocommit, world_size=2, epochs=2)
    delete_a_row_of_rank(autocommit, run.run_id, 1)

    with pytest.raises(TrainingInputError) as failure:
        launch_local.run_local(run.run_id, 2, db_url, logging.getLogger("test.refused"), timeout_seconds=300)

    status, reason = verdict(autocommit, run.run_id)
    assert status == "refused"
    assert reason.startswith("rank 1 read ") and "rows were deleted or updated after compute_shards" in reason
    assert str(failure.value).startswith(f"run {run.run_id} cannot train on its planned input: {reason}")
    assert record.get_run(autocommit, run.run_id).attempt == 1


@pytest.mark.horovod
def test_a_crash_without_a_verdict_is_a_failure_to_retry(autocommit, db_url, monkeypatch):
    """Nothing recorded (the rank died before it could): TrainingFailed, whatever the log says."""
    seed_samples(autocommit, rows=60)
    run = planned_run(autocommit, world_size=2, epochs=1)
    crash = [sys.executable, "-c", "print('run x refused its input: (just a line in the log)'); raise SystemExit(2)"]
    monkeypatch.setattr(launch_local, "local_command", lambda run_id, world_size, attempt, *backend: crash)
    with pytest.raises(TrainingFailed) as failure:
        launch_local.run_local(run.run_id, 2, db_url, logging.getLogger("test.crash"), timeout_seconds=60)
    assert not isinstance(failure.value, TrainingInputError)
    assert "exited with status 2" in str(failure.value)
    assert "(just a line in the log)" in str(failure.value)  # the output's tail comes with the failure
    assert verdict(autocommit, run.run_id) == ("training", None)
