"""What a pgtrain DAG file wires together: the default arguments, the ``train`` task for the author's launcher,
and a scheduled model's schedule (cron, new rows in its source, or whichever comes first).

The DAG files (``dags/``) hold the params and the task chain themselves:
provision_tables -> plan_run -> compute_shards -> train -> commit_parameters -> report
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import Asset, AssetOrTimeSchedule, AssetWatcher, BaseOperator

from pgtrain.airflow.dag.connection import DEFAULT_CONN_ID
from pgtrain.airflow.dag.failures import RETRY_POLICY
from pgtrain.airflow.dag.timetable import NextTickCronTimetable
from pgtrain.airflow.triggers.new_rows import NewRowsTrigger
from pgtrain.config.model_entries import ModelEntry
from pgtrain.config.settings import AuthorSettings

DEFAULT_ARGS: dict[str, Any] = {"retries": 1, "retry_delay": timedelta(minutes=1), "retry_policy": RETRY_POLICY}
TRAIN_TIMEOUT = timedelta(hours=24)


def train_task(training_run: Any, settings: AuthorSettings) -> BaseOperator:
    """The ``train`` task for the author's launcher. Both are plain operators at parse time: the Kubernetes
    provider (both Kubernetes clients: most of a parse's cost) is imported only when a kubernetes train task runs."""
    if settings.launcher == "kubernetes":
        from pgtrain.airflow.kubernetes.train import MPIJobTrainOperator

        return MPIJobTrainOperator(task_id="train", training_run_id=training_run, execution_timeout=TRAIN_TIMEOUT,
                                   **settings.operator_arguments())
    from pgtrain.airflow.local.operator import LocalTrainOperator

    return LocalTrainOperator(task_id="train", training_run_id=training_run, execution_timeout=TRAIN_TIMEOUT)


def new_rows_asset(entry: ModelEntry, conn_id: str = DEFAULT_CONN_ID) -> Asset:
    """The asset of new rows in a model's source, watched by a NewRowsTrigger in the triggerer."""
    trigger = NewRowsTrigger(model_name=entry.name, source_table=entry.source_table, key_column=entry.key_column,
                             min_new_rows=entry.min_new_rows, poll_seconds=entry.poll_seconds, conn_id=conn_id)
    return Asset(uri=f"pgtrain://{conn_id}/{entry.name}/new-rows", name=f"pgtrain new rows for {entry.name}",
                 group="pgtrain-sources",
                 watchers=[AssetWatcher(name=f"pgtrain-new-rows-{entry.name}", trigger=trigger)])


def model_schedule(entry: ModelEntry, conn_id: str = DEFAULT_CONN_ID) -> Any:
    """Cron (from the next tick on: NextTickCronTimetable), new rows, or whichever comes first
    (AssetOrTimeSchedule)."""
    cron = NextTickCronTimetable(entry.cron, timezone="UTC") if entry.cron else None
    if entry.min_new_rows is None:
        return cron
    rows = new_rows_asset(entry, conn_id)
    return rows if cron is None else AssetOrTimeSchedule(timetable=cron, assets=rows)
