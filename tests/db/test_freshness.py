"""New-data retraining on a real PostgreSQL: counting new rows against a version's watermark, the exact
"unchanged since the head" check that lets scheduled runs skip, and the asset watcher's trigger run directly
with asyncio, across a restart of the database, firing once per batch of rows."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import numpy as np
import psycopg
import pytest
from pgserver._commands import pg_ctl

from dev import devdb
from pgtrain.airflow.triggers.new_rows import NewRowsTrigger
from pgtrain.config.params import TrainingConfig
from pgtrain.core.migrations import apply_migrations
from pgtrain.data import freshness
from pgtrain.models.spec import ModelSpec
from pgtrain.runs.record import record_epoch
from pgtrain.store.model_store import commit_run
from pgtrain.store.tensors import write_staged
from tests.support import planned_run, seed_samples

MODEL = "fresh-mlp"
TABLE = '"public"."samples"'  # as policy.admit pins it in a run's config


def commit_version(conn: psycopg.Connection, dag_run_id: str, val_accuracy: float = 0.5, **params) -> str:
    """A committed version of MODEL trained on public.samples as it is now (planned as the DAG plans it; the
    parameters are staged directly: what they are does not matter here)."""
    run = planned_run(conn, dag_run_id, model_name=MODEL, source_table=TABLE, world_size=1, **params)
    spec = ModelSpec(run.input_dim, run.config.hidden_sizes, run.num_classes)
    write_staged(conn, run.run_id, {n: np.zeros(s, np.float32) for n, s in spec.parameter_shapes().items()})
    record_epoch(conn, run.run_id, 1, {"train_loss": 1.0, "train_accuracy": 0.5, "val_loss": 1.0,
                                       "val_accuracy": val_accuracy, "seconds": 0.1})
    commit_run(conn, run.run_id, owner={"task_id": "test"})
    return run.run_id


def new_rows(conn: psycopg.Connection, limit: int = 1000) -> freshness.NewRows:
    return freshness.count_new_rows(conn, MODEL, freshness.resolve_key(conn, "public.samples", "id"), limit)


def unchanged(conn: psycopg.Connection) -> str | None:
    return freshness.source_unchanged(conn, MODEL, TABLE, "id")


def test_without_a_version_every_row_is_new_counted_up_to_the_limit(autocommit):
    seed_samples(autocommit, 30)
    assert (new_rows(autocommit).new_rows, new_rows(autocommit, limit=10).new_rows) == (30, 10)
    assert new_rows(autocommit).since_key is None and new_rows(autocommit).max_key == "30"


def test_rows_above_the_head_versions_watermark_are_new(autocommit):
    seed_samples(autocommit, 30)
    commit_version(autocommit, "first")
    found = new_rows(autocommit)
    assert (found.new_rows, found.since_key, found.head_version) == (0, "30", 1)
    seed_samples(autocommit, 7, seed=1)
    assert new_rows(autocommit).new_rows == 7
    with pytest.raises(Exception, match="key_column 'nope' is not a column"):
        freshness.resolve_key(autocommit, "public.samples", "nope")


def test_a_claimed_event_is_never_claimed_again(autocommit):
    seed_samples(autocommit, 30)
    commit_version(autocommit, "first")
    seed_samples(autocommit, 5, seed=1)
    found = new_rows(autocommit)
    assert freshness.claim_event(autocommit, found)
    assert not freshness.claim_event(autocommit, found), "a second claim of the same read (another triggerer)"
    assert new_rows(autocommit).new_rows == 0, "rows up to the fired key do not count again"
    seed_samples(autocommit, 3, seed=2)
    again = new_rows(autocommit)
    assert (again.new_rows, again.since_key) == (3, "35")
    assert freshness.claim_event(autocommit, again)
    assert autocommit.execute("SELECT events, fired_key FROM pgtrain.new_rows_events").fetchone() == (2, "38")
    commit_version(autocommit, "second")  # the head moves past the fired key: it is the watermark now
    assert new_rows(autocommit).new_rows == 0 and new_rows(autocommit).head_version == 2


def test_rows_there_before_watching_began_start_no_run(autocommit, db_url):
    """No version yet: the first poll records the largest key as the baseline instead of firing (unpausing a
    model's DAG starts no run by itself); min_new_rows rows added after fire once."""
    seed_samples(autocommit, 30)
    trigger = NewRowsTrigger(model_name=MODEL, source_table="public.samples", key_column="id", min_new_rows=5,
                             poll_seconds=0.1)
    trigger._connect(db_url)
    try:
        assert [trigger._poll() for _ in range(2)] == [None, None]
        assert autocommit.execute("SELECT fired_key, events FROM pgtrain.new_rows_events").fetchone() == ("30", 0)
        seed_samples(autocommit, 4, seed=1)
        assert trigger._poll() is None, "4 new rows, below min_new_rows"
        seed_samples(autocommit, 1, seed=2)
        fired = trigger._poll()
        assert fired is not None and (fired["since_key"], fired["max_key"]) == ("30", "35")
        assert trigger._poll() is None
    finally:
        trigger._close()
    assert autocommit.execute("SELECT fired_key, events FROM pgtrain.new_rows_events").fetchone() == ("35", 1)


def test_a_swapped_table_is_watched_by_its_name_and_fires_once(autocommit, db_url):
    """ETL swaps (RENAME old away, RENAME new in) make the name another relation: each poll resolves it again,
    so the head's watermark and the last event still bound what is new (no event on every poll)."""
    seed_samples(autocommit, 30)
    commit_version(autocommit, "first")
    trigger = NewRowsTrigger(model_name=MODEL, source_table="public.samples", key_column="id", min_new_rows=5,
                             poll_seconds=0.1)
    trigger._connect(db_url)
    try:
        assert trigger._poll() is None  # nothing new yet
        autocommit.execute("CREATE TABLE public.samples_next (LIKE public.samples INCLUDING ALL)")
        autocommit.execute("INSERT INTO public.samples_next (id, features, label) "
                           "SELECT id, features, label FROM public.samples UNION ALL "
                           "SELECT id + 30, features, label FROM public.samples WHERE id <= 6")
        autocommit.execute("ALTER TABLE public.samples RENAME TO samples_before")
        autocommit.execute("ALTER TABLE public.samples_next RENAME TO samples")
        fired = [trigger._poll() for _ in range(3)]
    finally:
        trigger._close()
    assert [f is not None for f in fired] == [True, False, False], fired
    assert (fired[0]["new_rows"], fired[0]["since_key"], fired[0]["max_key"]) == (5, "30", "36")  # counted up to 5


def test_unchanged_is_exact_for_inserts_updates_and_deletes(autocommit):
    seed_samples(autocommit, 40)
    assert unchanged(autocommit) is None, "no head version: train"
    run_id = commit_version(autocommit, "first")
    reason = unchanged(autocommit)
    assert reason and "version 1" in reason and "40 rows" in reason and run_id in reason
    with pytest.raises(psycopg.errors.QueryCanceled), autocommit.transaction():
        autocommit.execute("INSERT INTO public.samples (features, label) VALUES ('{1,2,3,4,5,6,7,8}', 1)")
        autocommit.execute("SET LOCAL statement_timeout = 1; SELECT pg_sleep(1)")  # rolled back
    assert unchanged(autocommit), "a rolled-back insert changes nothing"

    autocommit.execute("UPDATE public.samples SET label = label WHERE id = 7")
    assert unchanged(autocommit) is None, "an update (even to the same value) is a change"
    commit_version(autocommit, "after-update")
    assert unchanged(autocommit)

    autocommit.execute("DELETE FROM public.samples WHERE id = 3")
    assert unchanged(autocommit) is None, "a delete is a change"
    commit_version(autocommit, "after-delete")
    autocommit.execute("DELETE FROM public.samples WHERE id = 4")
    seed_samples(autocommit, 1, seed=3)
    assert autocommit.execute("SELECT count(*) FROM public.samples").fetchone() == (39 - 1 + 1,)
    assert unchanged(autocommit) is None, "a delete and an insert keep the count, not the rows"


def test_only_scheduled_runs_skip_and_force_trains(autocommit):
    seed_samples(autocommit, 20)
    commit_version(autocommit, "first")
    config = TrainingConfig(model_name=MODEL, source_table=TABLE, world_size=1)  # as the head's run was
    assert "set the force param" in freshness.skip_reason(autocommit, config, "scheduled")
    changed = TrainingConfig(model_name=MODEL, source_table=TABLE, world_size=1, hidden_sizes=(16,))
    assert freshness.skip_reason(autocommit, changed, "scheduled") is None, "the author changed the model"
    assert freshness.skip_reason(autocommit, config, "asset_triggered")
    assert freshness.skip_reason(autocommit, config, "manual") is None
    assert freshness.skip_reason(autocommit, TrainingConfig.from_mapping(
        {"model_name": MODEL, "source_table": TABLE, "world_size": 1, "force": True}), "scheduled") is None
    other = TrainingConfig(model_name="another-model", source_table=TABLE)
    assert freshness.skip_reason(autocommit, other, "scheduled") is None, "no head of that model"


# --- the trigger ----------------------------------------------------------------------------------------------

@pytest.fixture
def own_server():
    """A PostgreSQL server of this test's own, which it may stop and start; yields (data dir, database URL)."""
    with tempfile.TemporaryDirectory(prefix="pgtrain-restart-") as data_dir:
        admin = devdb.start(data_dir)
        url = devdb.create_database(admin, "watched")
        try:
            yield Path(data_dir), url
        finally:
            devdb.stop(data_dir)


def stop_server(data_dir: Path) -> None:
    import pgserver

    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=data_dir, user=pgserver.get_server(data_dir).system_user)


def start_server(data_dir: Path, url: str) -> None:
    import pgserver

    socket_dir = psycopg.conninfo.conninfo_to_dict(url)["host"]
    pg_ctl(["-w", "-o", '-h ""', "-o", f"-k {socket_dir}", "-l", str(data_dir / "log"), "start"], pgdata=data_dir,
           user=pgserver.get_server(data_dir).system_user)


def watcher(min_new_rows: int) -> NewRowsTrigger:
    return NewRowsTrigger(model_name=MODEL, source_table="public.samples", key_column="id",
                          min_new_rows=min_new_rows, poll_seconds=0.2, max_backoff_seconds=0.5)


def test_the_trigger_serializes_to_what_builds_it():
    trigger = watcher(5)
    classpath, kwargs = trigger.serialize()
    assert classpath == "pgtrain.airflow.triggers.new_rows.NewRowsTrigger"
    assert NewRowsTrigger(**kwargs).serialize() == (classpath, kwargs)


def test_the_trigger_fires_once_per_batch_across_a_database_restart(own_server, monkeypatch, capfd):
    data_dir, url = own_server
    monkeypatch.setenv("AIRFLOW_CONN_PGTRAIN_DB", url)
    with psycopg.connect(url, autocommit=True) as conn:
        apply_migrations(conn)
        seed_samples(conn, 30)
        commit_version(conn, "first")
        seed_samples(conn, 3, seed=1)

    async def scenario() -> list[dict]:
        trigger = watcher(5)
        events = trigger.run()
        # Fewer rows than min_new_rows: a look at the source finds nothing to fire.
        await asyncio.to_thread(trigger._connect, url)
        assert await asyncio.to_thread(trigger._poll) is None
        pending = asyncio.ensure_future(events.__anext__())
        await asyncio.sleep(0)
        stop_server(data_dir)  # the database goes away while the trigger watches
        while not trigger.failures:
            await asyncio.sleep(0.1)
            assert not pending.done(), "no event while the rows are below min_new_rows"
        start_server(data_dir, url)
        with psycopg.connect(url, autocommit=True) as conn:
            seed_samples(conn, 3, seed=2)  # 6 new rows now
        fired = [(await pending).payload]
        # A restarted triggerer (a new trigger instance) sees the event recorded and does not fire again.
        restarted = watcher(5)
        await asyncio.to_thread(restarted._connect, url)
        assert await asyncio.to_thread(restarted._poll) is None
        stop_server(data_dir)
        start_server(data_dir, url)
        with psycopg.connect(url, autocommit=True) as conn:
            seed_samples(conn, 5, seed=3)
        fired.append((await events.__anext__()).payload)
        await events.aclose()
        await restarted.cleanup()
        return fired

    fired = asyncio.run(asyncio.wait_for(scenario(), timeout=120))
    assert [(e["since_key"], e["max_key"], e["new_rows"], e["head_version"]) for e in fired] == [
        ("30", "36", 5, 1), ("36", "41", 5, 1)]
    log = "".join(capfd.readouterr())
    assert "the training database is unreachable" in log and "reconnected to the training database" in log
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT events, fired_key FROM pgtrain.new_rows_events").fetchone() == (2, "41")
        assert conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgtrain-new-rows' "
                            "AND state = 'idle in transaction'").fetchone() == (0,)


def test_plan_run_skips_a_scheduled_run_of_an_unchanged_source_and_says_why(autocommit, db_url, monkeypatch):
    """The plan_run task's own code (Airflow's context given as the task gets it): a scheduled run of an unchanged
    source is skipped with the reason, and leaves it for the DAG run's note; a manual one is planned."""
    from types import SimpleNamespace

    from airflow.sdk.exceptions import AirflowSkipException

    from pgtrain.airflow.dag import tasks
    from pgtrain.airflow.dag.params import dag_params
    from pgtrain.config.settings import AuthorSettings
    from tests.k8s_sim.airflow_context import FakeTaskInstance

    monkeypatch.setenv("AIRFLOW_CONN_PGTRAIN_DB", db_url)
    seed_samples(autocommit, 20)
    commit_version(autocommit, "first")
    params = {name: param.value for name, param in dag_params(fixed=["launcher"]).items()} | {
        "model_name": MODEL, "world_size": 1}

    def plan(run_type: str, run_id: str, **conf):
        ti = FakeTaskInstance(dag_id="pgtrain_training", task_id="plan_run", run_id=run_id)
        dag_run = SimpleNamespace(dag_id="pgtrain_training", run_id=run_id, run_type=run_type, conf=conf)
        return ti, lambda: tasks.plan_run.function(AuthorSettings().to_dict(), {"launcher": "local"},
                                                   params=params | conf, dag_run=dag_run, ti=ti)

    ti, call = plan("scheduled", "scheduled__1")
    with pytest.raises(AirflowSkipException, match="no row of .* was added, updated or deleted since version 1"):
        call()
    assert ti.xcoms[tasks.OUTCOME_KEY].startswith(f"{MODEL}: skipped: no row of ")
    assert autocommit.execute("SELECT count(*) FROM pgtrain.training_runs WHERE dag_run_id = 'scheduled__1'"
                              ).fetchone() == (0,)
    assert plan("scheduled", "scheduled__2", force=True)[1]() == "pgtrain_training/scheduled__2"
    assert plan("manual", "manual__1")[1]() == "pgtrain_training/manual__1"


def test_the_outcome_line_says_version_metric_and_head_or_why_not(autocommit):
    from pgtrain.core.errors import CommitRejected
    from pgtrain.runs.record import outcome, record_verdict

    seed_samples(autocommit, 20)
    first = commit_version(autocommit, "first", val_accuracy=0.75)
    assert outcome(autocommit, first) == f"{MODEL} v1 committed: val_accuracy 0.7500, val_loss 1.0000; head none -> v1"
    with pytest.raises(CommitRejected):
        commit_version(autocommit, "worse", val_accuracy=0.5, max_accuracy_drop=0.0)
    assert outcome(autocommit, "pgtrain_test/worse") == (
        f"{MODEL}: rejected: quality gate: validation accuracy 0.5000 is more than max_accuracy_drop=0 below head "
        "version 1 (0.7500); the head stays at version 1; head stays v1")
    refused = planned_run(autocommit, "refused", model_name=MODEL, source_table=TABLE, world_size=1).run_id
    record_verdict(autocommit, refused, "refused", "a feature is NaN")
    assert outcome(autocommit, refused) == f"{MODEL}: refused: a feature is NaN; head stays v1"
