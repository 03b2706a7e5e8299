"""The trainer records its verdict in the run; both launchers read it there, never from log text."""

from __future__ import annotations

import logging
import sys

import psycopg
import pytest

from pgtrain.core.errors import TrainingFailed, TrainingInputError
from pgtrain.launch import local as launch_local
from pgtrain.runs import record
from tests.k8s_sim import fixtures
from tests.k8s_sim.airflow_context import task_context
from tests.support import planned_run, seed_samples

k8s_cluster, k8s, password_sentinel, namespace = (fixtures.k8s_cluster, fixtures.k8s, fixtures.password_sentinel,
                                                   fixtures.namespace)
DAG_ID = "pgtrain_test"  # tests.support.planned_run plans runs of this DAG


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
    monkeypatch.setattr(launch_local, "local_command", lambda run_id, world_size, attempt: crash)
    with pytest.raises(TrainingFailed) as failure:
        launch_local.run_local(run.run_id, 2, db_url, logging.getLogger("test.crash"), timeout_seconds=60)
    assert not isinstance(failure.value, TrainingInputError)
    assert "exited with status 2" in str(failure.value)
    assert "(just a line in the log)" in str(failure.value)  # the output's tail comes with the failure
    assert verdict(autocommit, run.run_id) == ("training", None)


@pytest.mark.horovod
def test_the_mpijob_path_reads_the_refusal_from_the_run(k8s, namespace, autocommit, password_sentinel):
    from pgtrain.airflow.kubernetes.operator import MPIJobInputRefused, MPIJobTrainOperator

    seed_samples(autocommit, rows=240, dim=8, classes=3)
    run = planned_run(autocommit, "refusing", world_size=2, epochs=2, batch_size=16, launcher="kubernetes")
    delete_a_row_of_rank(autocommit, run.run_id, 1)
    operator = MPIJobTrainOperator(task_id="train", poll_interval=0.3, namespace=namespace,
                                    image="pgtrain-trainer:test", startup_timeout_seconds=60,
                                    training_run_id=run.run_id, on_finish_action="keep_pod")
    with pytest.raises(MPIJobInputRefused) as failure:
        operator.execute(task_context(DAG_ID, "refusing"))

    status, reason = verdict(autocommit, run.run_id)
    assert status == "refused" and reason.startswith("rank 1 read ")
    assert f"trainer verdict: refused: {reason}" in str(failure.value)
    assert password_sentinel not in str(failure.value)
    (job,) = k8s.mpijobs(namespace)
    command = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]
    assert command[-2:] == ["--attempt", "1"] and record.get_run(autocommit, run.run_id).attempt == 1
