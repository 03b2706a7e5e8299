"""The task chain every pgtrain training DAG runs, built in one place for the generic DAG and the per-model ones:

provision_tables -> plan_run -> compute_shards -> train -> commit_parameters -> report
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import (
    Asset,
    AssetOrTimeSchedule,
    AssetWatcher,
    BaseOperator,
    CronTriggerTimetable,
    get_parsing_context,
)
from airflow.sdk.exceptions import AirflowFailException

from pgtrain.airflow.dag import tasks
from pgtrain.airflow.dag.connection import DEFAULT_CONN_ID
from pgtrain.airflow.dag.failures import RETRY_POLICY
from pgtrain.airflow.triggers.new_rows import NewRowsTrigger
from pgtrain.config.model_entries import ModelEntry
from pgtrain.config.settings import AuthorSettings

DEFAULT_ARGS: dict[str, Any] = {"retries": 1, "retry_delay": timedelta(minutes=1), "retry_policy": RETRY_POLICY}
TRAIN_TASK_ID = "train"


class TrainPlaceholder(BaseOperator):
    """Stands in for ``train`` when a task process parses the DAG file to run another task (see
    ``train_task``). It never runs: that process executes only its own task."""

    ui_color = "#c6dbef"

    def execute(self, context: Any) -> None:
        raise AirflowFailException("TrainPlaceholder ran: the train task must be HorovodTrainOperator "
                                   "(pgtrain.airflow.dag.pipeline.train_task)")


def train_task(settings: AuthorSettings, training_run: Any) -> BaseOperator:
    """The ``train`` task: HorovodTrainOperator, but a placeholder where only another task of the DAG runs.

    HorovodTrainOperator is a KubernetesPodOperator (the kubernetes launcher), whose provider imports both
    Kubernetes clients: about 0.7 s on an idle machine, 1-2 s under load, most of a parse of the DAG file. Every
    task process parses the DAG file to find its one task (the LocalExecutor forks one per task, and Airflow
    sets the parsing context to that task first), so a run of six tasks paid it six times for the one task that
    needs it. The dag-processor and ``airflow dags test`` parse with no parsing context: they get the real
    operator, so the serialized DAG and the UI show it."""
    # Only for this very DAG and a task other than this train task (full id, inside a TaskGroup too): the context
    # comes from environment variables, which child processes of any task inherit.
    context, upstream = get_parsing_context(), training_run.operator
    train_id = upstream.task_group.child_id(TRAIN_TASK_ID)
    if context.task_id and context.dag_id == upstream.dag_id and context.task_id != train_id:
        # Never executed: the scheduler schedules from the stored DAG, which has the real operator.
        placeholder = TrainPlaceholder(task_id=TRAIN_TASK_ID, execution_timeout=timedelta(hours=24))
        training_run >> placeholder
        return placeholder
    from pgtrain.airflow.local.operator import HorovodTrainOperator

    return HorovodTrainOperator(task_id=TRAIN_TASK_ID, training_run_id=training_run,
                                execution_timeout=timedelta(hours=24), **settings.operator_arguments())


def training_pipeline(settings: AuthorSettings, model_entry: str | None = None) -> None:
    """Add the training tasks to the DAG being defined (call it inside ``with DAG(...)``).

    ``settings``: the author's settings the train task is built with (Kubernetes arguments);
    ``model_entry``: the models-file entry whose fixed source, model and settings the run uses (None: the
    generic DAG, whose params say what to train and whose settings are the settings file's).
    """
    training_run = tasks.plan_run(model_entry=model_entry)
    shards = tasks.compute_shards(training_run, model_entry=model_entry)
    trained = train_task(settings, training_run)
    committed = tasks.commit_parameters(training_run)
    summary = tasks.report(training_run)

    tasks.provision_tables() >> training_run
    shards >> trained >> committed >> summary


def new_rows_asset(entry: ModelEntry, conn_id: str = DEFAULT_CONN_ID) -> Asset:
    """The asset of new rows in a model's source, watched by a NewRowsTrigger in the triggerer."""
    trigger = NewRowsTrigger(model_name=entry.name, source_table=entry.source_table, key_column=entry.key_column,
                             min_new_rows=entry.min_new_rows, poll_seconds=entry.poll_seconds, conn_id=conn_id)
    return Asset(uri=f"pgtrain://{conn_id}/{entry.name}/new-rows", name=f"pgtrain new rows for {entry.name}",
                 group="pgtrain-sources",
                 watchers=[AssetWatcher(name=f"pgtrain-new-rows-{entry.name}", trigger=trigger)])


def model_schedule(entry: ModelEntry, conn_id: str = DEFAULT_CONN_ID) -> Any:
    """Cron, new rows, or whichever comes first (AssetOrTimeSchedule)."""
    cron = CronTriggerTimetable(entry.cron, timezone="UTC") if entry.cron else None
    if entry.min_new_rows is None:
        return cron
    rows = new_rows_asset(entry, conn_id)
    return rows if cron is None else AssetOrTimeSchedule(timetable=cron, assets=rows)
