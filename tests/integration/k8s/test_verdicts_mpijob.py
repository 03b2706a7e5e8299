"""The MPIJob operator reads the trainer's verdict from the run, never from log text (the simulated cluster)."""

from __future__ import annotations

import pytest

from pgtrain.runs import record
from tests.db.test_verdicts import delete_a_row_of_rank, verdict
from tests.k8s_sim.airflow_context import task_context
from tests.support import planned_run, seed_samples

DAG_ID = "pgtrain_test"  # tests.support.planned_run plans runs of this DAG


@pytest.mark.horovod
def test_the_mpijob_path_reads_the_refusal_from_the_run(k8s, namespace, autocommit, password_sentinel):
    from pgtrain.airflow.kubernetes.errors import MPIJobInputRefused
    from pgtrain.airflow.kubernetes.train import MPIJobTrainOperator

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
