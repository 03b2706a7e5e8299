"""The DAG run's note says what became of a training run, in one line.

Airflow 3.3 gives a running task no way to set its DAG run's note: the Task SDK's execution API has none
(only TriggerDagRunOperator's new run gets one), and the REST API's PATCH of a run needs a user's credentials
in the worker. So the tasks that decide the outcome (plan_run, compute_shards, commit_parameters, train) leave it
as the XCom ``pgtrain_outcome``, and this listener, which Airflow calls where the DAG run's state is decided
(the scheduler, or ``dags test``) with the run's metadata session, copies it into the note when the run ends.
A run that failed without leaving one gets "failed in <tasks>". A note someone wrote when triggering stays
first. Registered by pgtrain.airflow.plugins. Listeners never fail the scheduler: Airflow logs and
swallows their exceptions.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from airflow.listeners import hookimpl

from pgtrain.airflow.dag.outcome import OUTCOME_KEY

log = logging.getLogger(__name__)
NOTE_LIMIT = 1000  # dag_run_note.content is a String(1000)
PGTRAIN_TASKS = {"plan_run", "commit_parameters"}


@hookimpl
def on_dag_run_success(dag_run: Any, msg: str) -> None:
    _write_note(dag_run)


@hookimpl
def on_dag_run_failed(dag_run: Any, msg: str) -> None:
    _write_note(dag_run)


def _write_note(dag_run: Any) -> None:
    from sqlalchemy.orm import object_session

    session = object_session(dag_run)
    if session is not None:  # the scheduler's: the note commits with the run's new state
        _note_in(session, dag_run)
        return
    from airflow.models.dagrun import DagRun  # a detached run (dags test): a session of our own
    from airflow.utils.session import create_session

    with create_session() as own:
        attached = own.get(DagRun, dag_run.id)
        if attached is not None:
            _note_in(own, attached)


def _note_in(session: Any, dag_run: Any) -> None:
    from airflow.models.xcom import XComModel
    from sqlalchemy import select

    instances = dag_run.get_task_instances(session=session)
    if not PGTRAIN_TASKS <= {ti.task_id for ti in instances}:
        return  # not a pgtrain training DAG
    value = session.scalar(
        select(XComModel.value).where(XComModel.dag_run_id == dag_run.id, XComModel.key == OUTCOME_KEY)
        .order_by(XComModel.timestamp.desc()).limit(1))
    outcome = XComModel.deserialize_value(_Row(value)) if value is not None else None
    if not outcome:
        failed = sorted(ti.task_id for ti in instances if ti.state in ("failed", "upstream_failed"))
        if not failed:
            return
        outcome = f"failed in {', '.join(failed)}: see the task log"
    note = markdown_inert(str(outcome))
    if dag_run.note and not dag_run.note.endswith(note):
        note = f"{dag_run.note}\n{note}"
    dag_run.note = note[:NOTE_LIMIT]
    log.info("DAG run %s note: %s", dag_run.run_id, note)


# What must be escaped for CommonMark (and Airflow's GFM) to render a note without images or links, and nothing
# more, so that the note reads the same unrendered (the REST API returns it raw): a ``]`` that closes a link or image
# (``](``) or a link reference definition (``]:``; without one, ``[a]`` and ``[a][b]`` stay text); a ``<`` that
# could open an autolink or raw HTML (anything but a space or the end after it); a backslash that would escape the
# next character. (A bare URL is still a link in GFM, as before: a link fetches nothing until clicked.)
_MARKDOWN_ACTIVE = re.compile(r"\\(?=[!-/:-@\[-`{-~])|\](?=[(:])|<(?!\s|$)")


def markdown_inert(text: str) -> str:
    """``text`` for a note Airflow renders as Markdown, with only the characters that would open a link, an image,
    an autolink or raw HTML backslash-escaped (``_MARKDOWN_ACTIVE``): a conf's column name such as
    ``![x](http://host/t.png)`` must not make every viewer's browser fetch that URL. It renders as the same text,
    and an ordinary note (``columns ['title'] are not ...``) is unchanged, raw as rendered."""
    return _MARKDOWN_ACTIVE.sub(lambda m: "\\" + m.group(0), text)


class _Row:
    """The shape XComModel.deserialize_value reads (a result row's ``value``)."""

    def __init__(self, value: Any) -> None:
        self.value = value
