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


def training_tasks(run: Any, settings: AuthorSettings) -> tuple[Any, ...]:
    """What follows compute_shards: train -> commit_parameters -> report; where the author allows a search
    (``search_limits``), plan_trials -> train mapped over the trials (at most ``concurrency`` at once) ->
    commit_parameters of the best, whatever became of the others (but not after a skipped run: nothing planned, no
    commit) -> report_search."""
    from pgtrain.airflow.dag.search_tasks import plan_trials, report_search
    from pgtrain.airflow.dag.tasks import commit_parameters, report

    if not settings.search_limits:
        return train_task(run, settings), commit_parameters(run), report(run)
    trials = plan_trials(run, settings.to_dict())
    commit = commit_parameters.override(trigger_rule="all_done_min_one_success")(run)
    return trials, trial_tasks(trials, settings), commit, report_search(run)


def trial_tasks(trials: Any, settings: AuthorSettings) -> Any:
    """The train task mapped over ``trials`` (plan_trials' XCom): one task instance per trial, each with its own
    attempts, verdict, retries and checkpoint; locally the trials share the worker's CPUs, on Kubernetes each is
    its own MPIJob (Kueue may queue them)."""
    from pgtrain.config.search import SearchLimits

    limits = SearchLimits.from_dict(settings.search_limits)
    common = {"task_id": "train", "execution_timeout": TRAIN_TIMEOUT,
              "max_active_tis_per_dagrun": limits.concurrency if limits else 1}
    if settings.launcher == "kubernetes":
        from pgtrain.airflow.kubernetes.train import MPIJobTrainOperator

        return MPIJobTrainOperator.partial(**common, job_arguments=settings.operator_arguments()).expand(
            training_run_id=trials)
    from pgtrain.airflow.local.operator import LocalTrainOperator

    return LocalTrainOperator.partial(**common).expand(training_run_id=trials)


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
