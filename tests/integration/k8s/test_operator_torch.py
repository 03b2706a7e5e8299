"""The torch backend's MPIJob end to end on the simulated cluster (tests/k8s_sim, a test double): the operator's
rendered ``mpirun`` runs as rendered in the launcher pod, reaches the two worker pods by their hostfile names over
the simulated sshd, and the ranks train, find their rendezvous and stage what a single process computes."""

from __future__ import annotations

import shutil

import psycopg
import pytest
import torch.nn.functional as F

from pgtrain.models.ensemble import member_loss
from pgtrain.runs import record
from pgtrain.store import tensors
from tests.integration.horovod.test_training import assert_same_parameters, reference_training
from tests.k8s_sim.airflow_context import task_context
from tests.k8s_sim.sshd import nss_wrapper
from tests.k8s_sim.validation import assert_cluster_accepted_every_manifest
from tests.support import planned_run, seed_samples

from .test_operator import DAG_ID, train_operator

pytestmark = [pytest.mark.horovod, pytest.mark.skipif(
    shutil.which("mpirun") is None or nss_wrapper() is None,
    reason="needs Open MPI's mpirun and nss_wrapper (the simulated pod network): `make mpi` installs them")]


def test_a_torch_backend_job_trains_through_mpirun_on_two_worker_pods(k8s, namespace, db_url, capfd):
    with psycopg.connect(db_url, autocommit=True) as conn:
        seed_samples(conn, 96, dim=6, classes=3, seed=7)
        run = planned_run(conn, "torch", world_size=2, epochs=1, batch_size=8, hidden_sizes=[5], backend="torch",
                          validation_fraction=0.0, test_fraction=0, allow_unvalidated=True, learning_rate=0.1,
                          seed=3, launcher="kubernetes", collective_timeout=60)
    train_operator(namespace, training_run_id=run.run_id, on_finish_action="keep_pod").execute(
        task_context(DAG_ID, "torch"))
    task_log = "".join(capfd.readouterr())

    (job,) = k8s.mpijobs(namespace)
    name = job["metadata"]["name"]
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]
    (executed,) = [h["argv"] for h in k8s.history(namespace, verb="exec")]
    # as rendered (/etc/mpi seen from here): the launcher reads the hostfile's first host into MASTER_ADDR
    assert launcher[:4] == ["python", "-m", "pgtrain.launch.mpijob.rendezvous", "mpirun"]
    assert len(executed) == len(launcher)
    for index in (0, 1):  # each worker pod took one orted over ssh, which started its rank
        (login,) = k8s.ssh_logins(f"{name}-worker-{index}.{name}-worker.{namespace}.svc")
        assert login.split()[0] == "orted" and f"ess_base_vpid {index + 1} " in login
    assert "collectives: torch (2 ranks)" in task_log
    assert "[launcher]" in task_log and "rank 1/2" in task_log

    with psycopg.connect(db_url, autocommit=True) as conn:
        assert conn.execute("SELECT backend, status FROM pgtrain.training_runs WHERE run_id = %s",
                            (run.run_id,)).fetchone() == ("torch", "trained")
        staged = tensors.read_staged(conn, run.run_id)
        model, _ = reference_training(conn, record.get_run(conn, run.run_id),
                                      lambda m, x, y: member_loss(F.cross_entropy, m(x), y))
    assert_same_parameters(staged, model, run)  # within 1e-5 of one process on the same global batches
    assert_cluster_accepted_every_manifest(k8s, namespace)
