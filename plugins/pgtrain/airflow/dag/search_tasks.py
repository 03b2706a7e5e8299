"""The DAG's tasks of a search (``pgtrain.config.search``): plan the trials over the planned run, and report what
each did. The trials are the mapped train task (``pgtrain.airflow.pipeline.trial_tasks``); commit_parameters commits
the best one (``pgtrain.store.search_commit``)."""

from __future__ import annotations

import logging
from typing import Any

from airflow.sdk import task

from pgtrain.airflow.dag.connection import DEFAULT_CONN_ID, database_url
from pgtrain.airflow.dag.outcome import OUTCOME_KEY

log = logging.getLogger(__name__)


@task
def plan_trials(training_run: str, settings: dict[str, Any], conn_id: str = DEFAULT_CONN_ID,
                ti: Any = None) -> list[str]:
    """The runs the train task is mapped over: the planned run itself, or its search's trials, each over a copy of
    its plan. A search beyond the author's caps is refused here, before any rank starts."""
    from pgtrain.config.settings import AuthorSettings
    from pgtrain.core.db import connect
    from pgtrain.core.errors import PgtrainError
    from pgtrain.planning import plan

    with connect(database_url(conn_id)) as conn:
        try:
            runs = plan.plan_trials(conn, training_run, AuthorSettings.from_dict(settings))
        except PgtrainError as refused:
            ti.xcom_push(key=OUTCOME_KEY, value=f"search refused before training: {refused}")
            raise
    log.info("%d run(s) to train: %s", len(runs), ", ".join(runs))
    return runs


@task
def report_search(training_run: str, conn_id: str = DEFAULT_CONN_ID) -> dict[str, Any]:
    """The committed trial's summary (the run's own without a search), with every trial's params, status, validation
    metric and time, and the choice in words; stored with the search run."""
    from pgtrain.core.db import connect
    from pgtrain.runs import record, trials
    from pgtrain.runs import report as reporting

    with connect(database_url(conn_id)) as conn:
        choice = trials.recorded_choice(conn, training_run)
        summary = reporting.build_summary(conn, choice.run_id if choice and choice.run_id else training_run)
        if choice is not None:
            summary["search"] = {"choice": choice.explanation, "metric": choice.metric, "trials": [
                {"trial": t["trial"], "params": t["params"], "status": t["status"],
                 choice.metric: t["metrics"].get(choice.metric), "seconds": round(t["seconds"], 2)}
                for t in trials.ledger(conn, training_run)]}
        record.save_summary(conn, training_run, summary)
    log.info("run summary:\n%s", reporting.format_summary(summary))
    if choice is not None:
        log.info("search: %s", choice.explanation)
    return summary
