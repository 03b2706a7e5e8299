"""A model DAG's cron timetable (pgtrain.airflow.dag.timetable): a DAG with no scheduled run waits for the next
tick instead of running the latest past one; after a run it is Airflow's CronTriggerTimetable. The clock is set
through the one Airflow's timetable reads; the scheduler's side is tests/integration/stack/test_schedule_stack.py."""

from __future__ import annotations

import pendulum
import pytest
from airflow.timetables import trigger
from airflow.timetables.base import DataInterval, TimeRestriction

from pgtrain.airflow.dag.timetable import NextTickCronTimetable

START = pendulum.datetime(2026, 1, 1, tz="UTC")  # the model DAGs' start_date: long past
NO_CATCHUP = TimeRestriction(earliest=START, latest=None, catchup=False)


def at(monkeypatch, *when: int) -> pendulum.DateTime:
    now = pendulum.datetime(*when, tz="UTC")
    monkeypatch.setattr(trigger, "utcnow", lambda: now)
    return now


def first_run(timetable, restriction=NO_CATCHUP, last: DataInterval | None = None):
    info = timetable.next_dagrun_info(last_automated_data_interval=last, restriction=restriction)
    return None if info is None else info.run_after


def test_a_dag_with_no_run_waits_for_the_next_tick_where_airflows_runs_the_last_one(monkeypatch):
    at(monkeypatch, 2026, 12, 2, 10, 30)
    assert first_run(NextTickCronTimetable("@daily", timezone="UTC")) == pendulum.datetime(2026, 12, 3, tz="UTC")
    # what unpausing used to do: Airflow's own timetable offers this morning's tick, which runs at once
    stock = trigger.CronTriggerTimetable("@daily", timezone="UTC")
    assert first_run(stock) == pendulum.datetime(2026, 12, 2, tz="UTC")


@pytest.mark.parametrize("cron, now, expected", [
    ("@daily", (2026, 12, 2, 0, 0, 0), (2026, 12, 2, 0, 0, 0)),  # on the tick: that tick
    ("@daily", (2026, 12, 2, 0, 4, 59), (2026, 12, 2, 0, 0, 0)),  # within the grace (5 min): still that tick
    ("@daily", (2026, 12, 2, 0, 5, 1), (2026, 12, 3, 0, 0, 0)),
    ("* * * * *", (2026, 12, 2, 9, 7, 5), (2026, 12, 2, 9, 7, 0)),  # every minute: a grace of 6 s
    ("* * * * *", (2026, 12, 2, 9, 7, 7), (2026, 12, 2, 9, 8, 0)),
    ("0 */6 * * *", (2026, 12, 2, 6, 30, 0), (2026, 12, 2, 12, 0, 0)),
])
def test_the_grace_is_a_tenth_of_the_period_at_most_five_minutes(monkeypatch, cron, now, expected):
    """A parse just after the first tick, before the scheduler created its run, must not push it a period on."""
    at(monkeypatch, *now)
    assert first_run(NextTickCronTimetable(cron, timezone="UTC")) == pendulum.datetime(*expected, tz="UTC")


def test_after_a_run_the_next_is_the_following_tick(monkeypatch):
    at(monkeypatch, 2026, 12, 2, 10, 30)
    today = pendulum.datetime(2026, 12, 2, tz="UTC")
    timetable = NextTickCronTimetable("@daily", timezone="UTC")
    assert first_run(timetable, last=DataInterval(today, today)) == today.add(days=1)
    # ticks missed (the DAG paused, the scheduler down): Airflow's catchup=False, the latest tick, none before it
    earlier = today.subtract(days=3)
    assert first_run(timetable, last=DataInterval(earlier, earlier)) == today


def test_catchup_and_the_dags_dates_are_airflows(monkeypatch):
    at(monkeypatch, 2026, 12, 2, 10, 30)
    timetable = NextTickCronTimetable("@daily", timezone="UTC")
    assert first_run(timetable, TimeRestriction(earliest=START, latest=None, catchup=True)) == START
    later = pendulum.datetime(2027, 3, 1, 12, tz="UTC")
    assert first_run(timetable, TimeRestriction(earliest=later, latest=None, catchup=False)) == pendulum.datetime(
        2027, 3, 2, tz="UTC")
    ended = TimeRestriction(earliest=START, latest=pendulum.datetime(2026, 12, 2, 12, tz="UTC"), catchup=False)
    assert first_run(timetable, ended) is None


def test_a_model_dag_serializes_its_timetable_and_the_scheduler_reads_it_back(tmp_path, monkeypatch):
    """The dag-processor writes the custom timetable's import path; the scheduler finds the class only because
    pgtrain's plugin registers it (an unregistered one fails serialization with TimetableNotRegistered)."""
    from airflow import plugins_manager
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization

    from tests.conftest import REPO

    assert plugins_manager.get_timetables_plugins()["pgtrain.airflow.dag.timetable.NextTickCronTimetable"] is (
        NextTickCronTimetable)
    models = tmp_path / "models.yaml"
    models.write_text("models:\n  - {name: m, source: {table: public.t, label_column: label}, "
                      "schedule: {cron: '@daily', min_new_rows: 5}}\n")
    monkeypatch.setenv("PGTRAIN_MODELS", str(models))
    dag = DagBag(dag_folder=str(REPO / "dags" / "pgtrain_models.py")).dags["pgtrain_model_m"]
    at(monkeypatch, 2026, 12, 2, 10, 30)
    read_back = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    assert isinstance(read_back.timetable.timetable, NextTickCronTimetable)  # inside AssetOrTimeSchedule
    info = read_back.next_dagrun_info(last_automated_run_info=None)
    assert info.run_after == pendulum.datetime(2026, 12, 3, tz="UTC")
