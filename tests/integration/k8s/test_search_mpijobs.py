"""A search with launcher=kubernetes (issue 34): `airflow dags test` of pgtrain_training against the simulated cluster
(a test double). Each trial is a mapped task instance of train that creates its own MPIJob (a name and task-instance
labels of its own, its launcher training that trial's run), and the search commits the best trial."""

from __future__ import annotations

import json

import psycopg
import pytest

from pgtrain.runs import trials
from tests.k8s_sim.validation import assert_cluster_accepted_every_manifest

pytestmark = [pytest.mark.airflow, pytest.mark.horovod]

SEARCH = {"candidates": [{"model": "mlp", "params": {"hidden_sizes": [[8], [16]]}}], "metric": "val_accuracy"}


def test_each_trial_is_its_own_mpijob_and_the_best_is_committed(kubernetes_dag_test, k8s_cluster,
                                                                 password_sentinel):
    run = kubernetes_dag_test({"world_size": 1, "epochs": 2, "batch_size": 16, "model_name": "k8s-search",
                               "test_fraction": 0.2, "search": SEARCH},
                              "search_limits: {max_trials: 2, concurrency: 2, max_total_world_size: 2}\n", timeout=900)
    db_url, namespace, output = run.db_url, run.namespace, run.output

    with psycopg.connect(db_url, autocommit=True) as conn:
        search_run, = conn.execute("SELECT run_id FROM pgtrain.training_runs WHERE config->'search' <> "
                                   "'null'::jsonb").fetchone()
        runs = trials.trial_runs(conn, search_run)
        ledger = trials.ledger(conn, search_run)
        version_run, = conn.execute("SELECT v.run_id FROM pgtrain.model_versions v JOIN pgtrain.model_heads h "
                                    "USING (model_name, version) WHERE v.model_name = 'k8s-search'").fetchone()
    assert len(runs) == 2
    creates = [c["body"] for c in k8s_cluster.history(namespace, verb="create", resource="mpijobs")]
    # One MPIJob per trial: names of their own, each labelled with its task instance's map index ...
    names = [job["metadata"]["name"] for job in creates]
    assert len(creates) == 2 and len(set(names)) == 2, names
    assert sorted(job["metadata"]["labels"]["map_index"] for job in creates) == ["0", "1"]
    # ... whose launcher trains that trial's run, and no other.
    for job in creates:
        launcher = json.dumps(job["spec"]["mpiReplicaSpecs"]["Launcher"])
        mine = [run_id for run_id in runs if f'"{run_id}"' in launcher or f" {run_id} " in launcher
                or f"'{run_id}'" in launcher]
        map_index = int(job["metadata"]["labels"]["map_index"])
        assert mine == [runs[map_index]], (map_index, launcher)
    assert not k8s_cluster.mpijobs(namespace)  # each deleted when its task finished
    assert_cluster_accepted_every_manifest(k8s_cluster, namespace)
    best = max(ledger, key=lambda t: (t["metrics"]["val_accuracy"], -t["trial"]))
    assert [t["status"] for t in ledger] == ["committed" if t is best else "trained" for t in ledger]
    assert version_run == best["run_id"]
    assert password_sentinel not in output and password_sentinel not in json.dumps(creates)
