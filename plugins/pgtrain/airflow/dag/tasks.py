"""The DAG's Python tasks. Each is a thin shell: resolve the database, call the plain pgtrain function.

The author's settings reach them as arguments (``AuthorSettings.to_dict()``, with a model entry's merged in), resolved
once when the task's process parses the DAG file; the run's params come from the trigger. Which errors are
retried is decided by the DAG's one retry policy (``pgtrain.airflow.dag.failures``).
"""

from __future__ import annotations

import logging
from typing import Any

from airflow.sdk import task

from pgtrain.airflow.dag.assets import MODELS_ALIAS, is_declared, model_asset
from pgtrain.airflow.dag.connection import DEFAULT_CONN_ID, database_url
from pgtrain.airflow.dag.outcome import OUTCOME_KEY, leave_outcome

log = logging.getLogger(__name__)
# plan_run's task state store key: the training run this DAG run planned.
RUN_BINDING = "pgtrain_training_run"


@task
def provision_tables(conn_id: str = DEFAULT_CONN_ID) -> list[int]:
    from pgtrain.core.db import connect
    from pgtrain.core.migrations import apply_migrations

    with connect(database_url(conn_id)) as conn:
        applied = apply_migrations(conn)
    log.info("migrations applied now: %s", applied or "none (schema up to date)")
    return applied


@task
def plan_run(settings: dict[str, Any], fixed: dict[str, Any], models_file: str | None = None,
             conn_id: str = DEFAULT_CONN_ID, params: dict | None = None, dag_run: Any = None, ti: Any = None,
             task_state_store: Any = None) -> str:
    """Check the run against the author's ``settings`` and record it. ``fixed``: the params the author fixed
    (a model entry's source and launcher; the generic DAG's launcher). ``models_file``: the generic DAG's, whose
    models it may not train (they belong to their own DAGs).

    The training run is bound to this DAG run through Airflow's task state store, which retries and clears keep
    and which is deleted with the DAG run: a retried or cleared plan_run returns the run it planned, and a new DAG
    run that reuses an old run id (a reset metadata database) plans a run of its own."""
    from airflow.sdk.exceptions import AirflowSkipException

    from pgtrain.config.settings import AuthorSettings
    from pgtrain.core.db import connect
    from pgtrain.core.errors import PgtrainError
    from pgtrain.planning.plan import Skip, admit_run, requested_config

    author = AuthorSettings.from_dict(settings)
    try:
        config = requested_config(dag_run.conf or {}, params, fixed)
        with connect(database_url(conn_id)) as conn:
            run = admit_run(conn, config, author, dag_run.dag_id, dag_run.run_id, run_type=_run_type(dag_run),
                            models_file=models_file, run_id=_run_binding(dag_run, task_state_store))
    except PgtrainError as refused:
        ti.xcom_push(key=OUTCOME_KEY, value=f"refused before planning: {refused}")
        raise
    if isinstance(run, Skip):
        log.info("not training, no new version: %s", run.reason)
        ti.xcom_push(key=OUTCOME_KEY, value=f"{run.model_name}: skipped: {run.reason}")
        raise AirflowSkipException(run.reason)
    log.info("training run %s (model %s, base version %s) with %s", run.run_id, run.model_name, run.base_version,
             run.config.to_dict())
    return run.run_id


@task
def compute_shards(training_run: str, settings: dict[str, Any], conn_id: str = DEFAULT_CONN_ID,
                   ti: Any = None) -> dict[str, Any]:
    from pgtrain.config.settings import AuthorSettings
    from pgtrain.core.db import connect
    from pgtrain.core.errors import PgtrainError
    from pgtrain.planning.plan import plan_shards_checked

    with connect(database_url(conn_id)) as conn:
        try:
            plan = plan_shards_checked(conn, training_run, AuthorSettings.from_dict(settings))
        except PgtrainError:
            leave_outcome(ti, conn, training_run)
            raise
    for shard in plan.shards:
        log.info("rank %d: keys %s..%s, %d rows (%d training, %d validation, %d test)", shard.rank, shard.key_lo,
                 shard.key_hi, shard.row_count, shard.train_count, shard.val_count, shard.test_count)
    if plan.excluded_rows:
        log.warning("excluded %d bad rows (bad_rows=exclude): %s", plan.excluded_rows, plan.summary()["bad_rows"])
    return plan.summary()


@task(outlets=[MODELS_ALIAS])
def commit_parameters(training_run: str, conn_id: str = DEFAULT_CONN_ID, ti: Any = None,
                      outlet_events: Any = None) -> dict[str, Any]:
    from pgtrain.airflow.dag.train_run import task_owner
    from pgtrain.core.db import connect
    from pgtrain.core.errors import CommitRejected
    from pgtrain.runs import record
    from pgtrain.store.search_commit import commit_search

    owner = task_owner(ti)
    with connect(database_url(conn_id)) as conn:
        # Committed, or rejected with the reason: the DAG run's note (pgtrain.airflow.ui.run_notes).
        try:
            result, choice = commit_search(conn, training_run, owner=owner)  # a search commits its best trial
        except CommitRejected:
            leave_outcome(ti, conn, training_run)
            raise
        committed = choice.run_id if choice else training_run
        leave_outcome(ti, conn, committed)
        why = None if result.head_moved else record.get_run(conn, committed).status_reason
    log.info("model %s version %d (%s)", result.model_name, result.version,
             "new" if result.created else "already committed by an earlier try")
    if why is not None:
        log.warning("the head of %s did not move to version %d: %s", result.model_name, result.version, why)
    asset = model_asset(result.model_name, conn_id)
    if is_declared(outlet_events, asset):
        outlet_events[MODELS_ALIAS].add(asset, extra={
            "version": result.version, "head_moved": result.head_moved, "run_id": training_run,
            "metrics": result.metrics})
    else:
        log.info("no asset event: no DAG schedules on %s", asset.uri)
    return {"model_name": result.model_name, "version": result.version, "created": result.created,
            "head_moved": result.head_moved, "run_id": committed}


@task
def report(training_run: str, conn_id: str = DEFAULT_CONN_ID) -> dict[str, Any]:
    from pgtrain.core.db import connect
    from pgtrain.runs import record
    from pgtrain.runs import report as reporting

    with connect(database_url(conn_id)) as conn:
        summary = reporting.build_summary(conn, training_run)
        record.save_summary(conn, training_run, summary)
    log.info("run summary:\n%s", reporting.format_summary(summary))
    return summary


def _run_binding(dag_run: Any, state_store: Any) -> Any:
    """How the training run is bound to this DAG run: the id its task state store holds from an earlier try, else a
    new one, bound before the run's record exists. Without a state store (a task called outside Airflow): None, the
    run of the DAG run's id."""
    if state_store is None:
        return None

    def bound(conn: Any) -> str:
        from airflow.sdk import NEVER_EXPIRE

        from pgtrain.runs import record

        run_id = state_store.get(RUN_BINDING)
        if not run_id:
            run_id = record.unused_run_id(conn, dag_run.dag_id, dag_run.run_id)
            state_store.set(RUN_BINDING, run_id, retention=NEVER_EXPIRE)
        return run_id

    return bound


def _run_type(dag_run: Any) -> str:
    run_type = getattr(dag_run, "run_type", None)
    return str(getattr(run_type, "value", run_type))
