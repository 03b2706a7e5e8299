"""Planning is one set of plain functions (pgtrain.planning.plan): the DAG's plan_run and compute_shards tasks, the
tests' helper (tests.support.planned_run) and the benchmarks all plan a run through them, so each applies the
author's policy and the launcher's capacity, and records what they decide in the run's record."""

from __future__ import annotations

import re
import runpy
from types import SimpleNamespace

import psycopg
import pytest

from pgtrain.config.settings import AuthorSettings
from pgtrain.core.errors import ConfigError
from tests.conftest import REPO
from tests.support import planned_run, seed_samples

# An mlp no worker can train on its local ranks (about 1.5 TB): only planning's capacity check refuses it.
HUGE = {"source_table": "public.samples", "world_size": 1, "launcher": "local", "hidden_sizes": [65536] * 16}


def dag_tasks(conn: psycopg.Connection, dag_run_id: str) -> None:
    """plan_run, then compute_shards, as the DAG calls them for a manual trigger."""
    from pgtrain.airflow.dag import tasks
    from pgtrain.airflow.dag.params import dag_params
    from tests.k8s_sim.airflow_context import FakeTaskInstance

    defaults = {name: param.value for name, param in dag_params(fixed=["launcher"]).items()}
    dag_run = SimpleNamespace(dag_id="pgtrain_training", run_id=dag_run_id, run_type="manual", conf={})
    settings = AuthorSettings().to_dict()
    ti = FakeTaskInstance(dag_id="pgtrain_training", task_id="plan_run", run_id=dag_run_id)
    run_id = tasks.plan_run.function(settings, {"launcher": "local"}, params={**defaults, **HUGE},
                                     dag_run=dag_run, ti=ti)
    ti = FakeTaskInstance(dag_id="pgtrain_training", task_id="compute_shards", run_id=dag_run_id)
    tasks.compute_shards.function(run_id, settings, ti=ti)


def benchmark_plan(conn: psycopg.Connection, monkeypatch) -> None:
    """bench_gpu's planning step, loaded as `make bench` starts the script (its folder first on sys.path)."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    bench = runpy.run_path(str(REPO / "benchmarks" / "bench_gpu.py"), run_name="bench")
    bench["plan"](conn, 1, **{k: v for k, v in HUGE.items() if k != "world_size"})


def test_the_dag_the_tests_helper_and_a_benchmark_plan_through_the_same_functions(autocommit, db_url, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_PGTRAIN_DB", db_url)
    seed_samples(autocommit, rows=40)
    for planning in (lambda: dag_tasks(autocommit, "dag"), lambda: planned_run(autocommit, "helper", **HUGE),
                     lambda: benchmark_plan(autocommit, monkeypatch)):
        with pytest.raises(ConfigError, match=r"make an mlp of [\d,]+ parameters; training it on 1 local ranks"):
            planning()
    runs = autocommit.execute("SELECT dag_id, status, status_reason, config ->> 'source_table' "
                              "FROM pgtrain.training_runs ORDER BY dag_id").fetchall()
    assert [r[0] for r in runs] == ["bench_gpu", "pgtrain_test", "pgtrain_training"]
    # The refusal is recorded with each run, and each source was pinned as the catalog resolved it (policy.admit).
    assert {(status, source) for _, status, _, source in runs} == {("refused", '"public"."samples"')}
    # The same refusal; only the memory available at that moment may differ between the three.
    assert len({re.sub(r"has [\d.]+ [GM]iB", "has N", reason) for _, _, reason, _ in runs}) == 1, runs


def test_the_tests_helper_applies_the_authors_policy(autocommit):
    seed_samples(autocommit, rows=40)
    with pytest.raises(ConfigError, match="model 'mlp' is not one of the models this DAG may build"):
        planned_run(autocommit, author=AuthorSettings(allowed_models=("trainer.examples.resmlp:build",)))
    assert autocommit.execute("SELECT count(*) FROM pgtrain.training_runs").fetchone()[0] == 0

