"""A model name is bound to what it learns from (issue 30, finding 1), on a real PostgreSQL through plan_run's task
function: a run of the same model_name on another table is refused before planning, with the reason in the run's
record and in the outcome the DAG run's note is made of; the author's allow_retarget lets it through; a run on the
head's own table plans and commits as before; and a commit never moves the head to a version of other data."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import psycopg
import pytest
from psycopg import sql

from pgtrain.config.params import TrainingConfig
from pgtrain.config.settings import AuthorSettings
from pgtrain.core.errors import ConfigError
from pgtrain.data import manifest
from pgtrain.models.spec import ModelSpec
from pgtrain.runs.record import get_run, plan_run, record_epoch
from pgtrain.store.model_store import commit_run, head_version
from pgtrain.store.tensors import write_staged

MODEL = "pengprod"
COLUMNS = {"public.t": ("a", "b"), "public.t_copy": ("a", "b"), "public.t_other": ("x", "y")}


@pytest.fixture
def tables(autocommit: psycopg.Connection, db_url: str, monkeypatch) -> psycopg.Connection:
    """public.t, public.t_copy (the same columns, another label rule) and public.t_other (other columns)."""
    monkeypatch.setenv("AIRFLOW_CONN_PGTRAIN_DB", db_url)
    for table, (one, two) in COLUMNS.items():
        relation = sql.Identifier(*table.split("."))
        autocommit.execute(sql.SQL("CREATE TABLE {} (id integer PRIMARY KEY, {} double precision NOT NULL, "
                                   "{} double precision NOT NULL, label integer NOT NULL)").format(
            relation, sql.Identifier(one), sql.Identifier(two)))
        shift = int(table == "public.t_copy")  # another label rule
        autocommit.execute(sql.SQL("INSERT INTO {} SELECT i, i * 0.5, i %% 7, (i + %s) %% 3 "
                                   "FROM generate_series(1, 60) i").format(relation), (shift,))
    return autocommit


def params(table: str) -> dict[str, object]:
    from pgtrain.airflow.dag.params import dag_params

    defaults = {name: param.value for name, param in dag_params(fixed=["launcher"]).items()}
    return defaults | {"model_name": MODEL, "source_table": table, "key_column": "id", "features_column": None,
                       "feature_columns": list(COLUMNS[table]), "label_column": "label", "world_size": 1}


def plan_run_task(table: str, dag_run_id: str, settings: AuthorSettings | None = None) -> tuple[object, object]:
    """plan_run as the DAG calls it, for a manual trigger on ``table``: (its task instance, its result or error)."""
    from pgtrain.airflow.dag import tasks
    from tests.k8s_sim.airflow_context import FakeTaskInstance

    ti = FakeTaskInstance(dag_id="pgtrain_training", task_id="plan_run", run_id=dag_run_id)
    dag_run = SimpleNamespace(dag_id="pgtrain_training", run_id=dag_run_id, run_type="manual", conf={})
    try:
        return ti, tasks.plan_run.function((settings or AuthorSettings()).to_dict(), {"launcher": "local"},
                                           params=params(table), dag_run=dag_run, ti=ti)
    except ConfigError as refused:
        return ti, refused


def trained(conn: psycopg.Connection, run_id: str, val_accuracy: float = 0.9) -> str:
    """compute_shards, then parameters staged as a train task leaves them (their values do not matter here)."""
    run = get_run(conn, run_id)
    manifest.plan_shards(conn, run)
    run = get_run(conn, run_id)
    spec = ModelSpec(run.input_dim, run.config.hidden_sizes, run.num_classes)
    write_staged(conn, run_id, {n: np.zeros(s, np.float32) for n, s in spec.parameter_shapes().items()})
    record_epoch(conn, run_id, 1, {"train_loss": 1.0, "train_accuracy": 0.5, "val_loss": 1.0,
                                   "val_accuracy": val_accuracy, "seconds": 0.1})
    return run_id


def head_on_t(conn: psycopg.Connection) -> None:
    ti, run_id = plan_run_task("public.t", "manual__1")
    assert commit_run(conn, trained(conn, run_id), owner={"task_id": "test"}).version == 1
    assert head_version(conn, MODEL) == 1


def run_row(conn: psycopg.Connection, dag_run_id: str) -> tuple[str, str | None, int]:
    return conn.execute(
        """SELECT status, status_reason, (SELECT count(*) FROM pgtrain.shard_manifest m WHERE m.run_id = r.run_id)
           FROM pgtrain.training_runs r WHERE dag_run_id = %s""", (dag_run_id,)).fetchone()


@pytest.mark.parametrize(("table", "differs"), [
    ("public.t_copy", 'source "public"."t_copy" (the head\'s: "public"."t")'),
    ("public.t_other", "input columns 'x', 'y' that the head's lacks, without the head's 'a', 'b'")])
def test_a_run_on_another_table_is_refused_before_planning_with_the_reason_recorded(tables, table, differs):
    from pgtrain.airflow.dag.tasks import OUTCOME_KEY

    head_on_t(tables)

    ti, refused = plan_run_task(table, "manual__2")

    assert isinstance(refused, ConfigError)
    reason = str(refused)
    assert reason.startswith(f"model '{MODEL}' is bound to the data its head version 1 learned from: "
                             "\"public\".\"t\" (key 'id', target 'label', classification, input columns 'a', 'b')")
    assert differs in reason and "choose another model_name" in reason.lower() and "allow_retarget: true" in reason
    assert ti.xcoms[OUTCOME_KEY] == f"refused before planning: {reason}"  # the DAG run's note
    assert run_row(tables, "manual__2") == ("refused", reason, 0)  # recorded, nothing planned
    assert head_version(tables, MODEL) == 1


def test_the_authors_allow_retarget_lets_a_run_on_another_table_through(tables):
    head_on_t(tables)
    allowing = AuthorSettings(quality_gate={"allow_retarget": True})

    _, run_id = plan_run_task("public.t_copy", "manual__2", allowing)

    assert get_run(tables, run_id).config.allow_retarget
    # The gate does not compare it with the head of other data (a drop of 0 would reject 0.5 against 0.9).
    tables.execute("UPDATE pgtrain.training_runs SET config = config || '{\"max_accuracy_drop\": 0}' "
                   "WHERE run_id = %s", (run_id,))
    result = commit_run(tables, trained(tables, run_id, val_accuracy=0.5), owner={"task_id": "test"})
    assert (result.version, result.head_moved, head_version(tables, MODEL)) == (2, True, 2)


def test_a_run_on_the_heads_own_table_plans_and_commits_as_before(tables):
    head_on_t(tables)

    _, run_id = plan_run_task("public.t", "manual__2")

    result = commit_run(tables, trained(tables, run_id), owner={"task_id": "test"})
    assert (result.version, result.head_moved, head_version(tables, MODEL)) == (2, True, 2)
    assert get_run(tables, run_id).status == "committed"


def test_a_version_of_other_data_never_moves_a_head_that_moved_since_planning(tables):
    # Planned while the model had no head; a drop of 0 would reject its 0.5 against the head's 0.9.
    config = TrainingConfig.from_mapping(params("public.t_copy") | {"source_table": '"public"."t_copy"',
                                                                    "max_accuracy_drop": 0.0})
    early = plan_run(tables, "pgtrain_training", "early", config)
    head_on_t(tables)

    result = commit_run(tables, trained(tables, early.run_id, val_accuracy=0.5), owner={"task_id": "test"})

    assert (result.version, result.head_moved, head_version(tables, MODEL)) == (2, False, 1)
    reason = get_run(tables, early.run_id).status_reason
    assert "its data differs from the head's, \"public\".\"t\" (key 'id'" in reason
    assert 'source "public"."t_copy"' in reason and "allow_retarget: true" in reason
    assert "quality gate" not in reason  # not compared with the head of other data
