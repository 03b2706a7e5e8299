"""The whole DAG with launcher=kubernetes: `airflow dags test` against the simulated cluster (a test double).

The `train` task creates an MPIJob; the simulated MPI Operator runs its launcher's horovodrun as
local processes with the real trainer; the DAG then commits the model version.
"""

from __future__ import annotations

import json

import psycopg
import pytest

from tests.k8s_sim.validation import assert_cluster_accepted_every_manifest

pytestmark = [pytest.mark.airflow, pytest.mark.horovod]


def test_dag_trains_on_kubernetes_and_commits_a_version(kubernetes_dag_test, k8s_cluster, password_sentinel):
    run = kubernetes_dag_test({"world_size": 2, "epochs": 3, "batch_size": 16, "model_name": "k8s-mlp"})
    db_url, namespace, output = run.db_url, run.namespace, run.output

    creates = k8s_cluster.history(namespace, verb="create", resource="mpijobs")
    assert len(creates) == 1, "the train task created no MPIJob: is it MPIJobTrainOperator? (docs/kubernetes.md)"
    create = creates[0]
    assert create["body"]["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    assert k8s_cluster.history(namespace, verb="exec")  # the launcher ran the trainer
    assert "[launcher]" in output  # its log reached the task log
    assert not k8s_cluster.mpijobs(namespace)  # on_finish_action=delete_pod
    assert_cluster_accepted_every_manifest(k8s_cluster, namespace)
    with psycopg.connect(db_url) as conn:
        status, version = conn.execute(
            "SELECT r.status, v.version FROM pgtrain.training_runs r "
            "JOIN pgtrain.model_versions v USING (run_id) WHERE v.model_name = 'k8s-mlp'").fetchone()
    assert (status, version) == ("committed", 1)
    assert password_sentinel not in output and password_sentinel not in json.dumps(create)
