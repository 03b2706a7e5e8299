"""The DAG's Python tasks. Each is a thin shell: resolve the database, call the plain pgtrain function.

Which errors are retried is decided by the DAG's one retry policy (``pgtrain.airflow.failures``).
"""

from __future__ import annotations

import logging
from typing import Any

from airflow.sdk import task

from pgtrain.airflow.assets import MODELS_ALIAS, model_asset
from pgtrain.airflow.connection import DEFAULT_CONN_ID, database_url

log = logging.getLogger(__name__)


@task
def provision_tables(conn_id: str = DEFAULT_CONN_ID) -> list[int]:
    from pgtrain.db import connect
    from pgtrain.migrations import apply_migrations

    with connect(database_url(conn_id)) as conn:
        applied = apply_migrations(conn)
    log.info("migrations applied now: %s", applied or "none (schema up to date)")
    return applied


@task
def plan_run(conn_id: str = DEFAULT_CONN_ID, params: dict | None = None, dag_run: Any = None) -> str:
    from pgtrain import capacity, policy, runs
    from pgtrain.config import TrainingConfig, unknown_keys
    from pgtrain.db import connect
    from pgtrain.errors import ConfigError
    from pgtrain.settings import load_settings

    typos = unknown_keys(dict(dag_run.conf or {}))
    if typos:
        raise ConfigError("the run's conf has keys this DAG does not define: " + "; ".join(typos))
    config = TrainingConfig.from_mapping(dict(params))
    capacity.check_world_size(config)
    with connect(database_url(conn_id)) as conn:
        config = policy.admit(conn, config, load_settings())
        run = runs.plan_run(conn, dag_run.dag_id, dag_run.run_id, config)
    log.info("training run %s (model %s, base version %s) with %s", run.run_id, run.model_name, run.base_version,
             run.config.to_dict())
    return run.run_id


@task
def compute_shards(training_run: str, conn_id: str = DEFAULT_CONN_ID) -> dict[str, Any]:
    from pgtrain import capacity, manifest, policy, runs
    from pgtrain.db import connect
    from pgtrain.settings import load_settings

    with connect(database_url(conn_id)) as conn:
        run = runs.get_run(conn, training_run)
        policy.check_run(conn, run.config, load_settings())
        plan = manifest.plan_shards(conn, run)
    capacity.check_model_size(run.config, plan.input_dim, plan.output_dim)
    for shard in plan.shards:
        log.info("rank %d: keys %s..%s, %d rows (%d training)", shard.rank, shard.key_lo, shard.key_hi,
                 shard.row_count, shard.train_count)
    if plan.excluded_rows:
        log.warning("excluded %d bad rows (bad_rows=exclude): %s", plan.excluded_rows, plan.summary()["bad_rows"])
    return plan.summary()


@task(outlets=[MODELS_ALIAS])
def commit_parameters(training_run: str, conn_id: str = DEFAULT_CONN_ID, ti: Any = None,
                      outlet_events: Any = None) -> dict[str, Any]:
    from pgtrain.db import connect
    from pgtrain.model_store import commit_run

    owner = {"dag_id": ti.dag_id, "run_id": ti.run_id, "task_id": ti.task_id, "try_number": ti.try_number}
    with connect(database_url(conn_id)) as conn:
        result = commit_run(conn, training_run, owner=owner)
    log.info("model %s version %d (%s)", result.model_name, result.version,
             "new" if result.created else "already committed by an earlier try")
    if not result.head_moved:
        log.warning("the head of %s did not move to version %d: the model changed shape or kind; "
                    "`pgtrain-models promote %s %d` makes it the head", result.model_name, result.version,
                    result.model_name, result.version)
    outlet_events[MODELS_ALIAS].add(model_asset(result.model_name, conn_id), extra={
        "version": result.version, "head_moved": result.head_moved, "run_id": training_run,
        "metrics": result.metrics})
    return {"model_name": result.model_name, "version": result.version, "created": result.created,
            "head_moved": result.head_moved}


@task
def report(training_run: str, conn_id: str = DEFAULT_CONN_ID) -> dict[str, Any]:
    from pgtrain import report as reporting
    from pgtrain import runs
    from pgtrain.db import connect

    with connect(database_url(conn_id)) as conn:
        summary = reporting.build_summary(conn, training_run)
        runs.save_summary(conn, training_run, summary)
    log.info("run summary:\n%s", reporting.format_summary(summary))
    return summary
