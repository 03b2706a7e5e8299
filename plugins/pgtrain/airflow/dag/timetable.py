"""A model DAG's cron: Airflow's ``CronTriggerTimetable``, except that a DAG with no scheduled run yet waits for
the next tick instead of running the latest past one.

With ``catchup=False`` Airflow 3's cron timetable always offers the most recent tick (``run_immediately`` only
matters without a ``start_date``, and even then that tick stays a candidate), so unpausing a new model's DAG
queued ``scheduled__<the last tick>`` at once: on Kubernetes an unplanned GPU job. Here the first run is the
first tick at or after the moment the next run is computed (each parse of the DAG file, and each run the
scheduler creates), less a grace of a tenth of the cron's period, at most five minutes: the dag-processor
recomputes the next run every parse, and without the grace a parse landing just after a tick, before the
scheduler created its run, would push the first run to the following tick. Once the DAG has a scheduled run,
the next run is Airflow's (the tick after the last, or the latest tick when ticks were missed).

A custom timetable must be registered by a plugin for the scheduler to read the serialized DAG back:
``pgtrain.airflow.plugins`` lists it in ``timetables``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

import pendulum
from airflow.timetables import trigger
from airflow.timetables.base import DagRunInfo, DataInterval, TimeRestriction

if TYPE_CHECKING:
    from pendulum import DateTime

MAX_GRACE = timedelta(minutes=5)


class NextTickCronTimetable(trigger.CronTriggerTimetable):
    """``CronTriggerTimetable`` whose first scheduled run (``catchup=False``) is the next tick, not a past one."""

    def grace(self, now: DateTime) -> timedelta:
        """How long after a tick the first run may still be that tick: a tenth of the period, at most 5 min."""
        following = self._get_next(self._align_to_next(now))
        return min((following - self._align_to_next(now)) / 10, MAX_GRACE)

    def next_dagrun_info(self, *, last_automated_data_interval: DataInterval | None,
                         restriction: TimeRestriction) -> DagRunInfo | None:
        if restriction.catchup or last_automated_data_interval is not None:
            return super().next_dagrun_info(last_automated_data_interval=last_automated_data_interval,
                                            restriction=restriction)
        now = pendulum.instance(trigger.utcnow())  # Airflow's timetable's clock, so both read one time
        start = self._align_to_next(now - self.grace(now))
        if restriction.earliest is not None:
            start = max(start, self._align_to_next(restriction.earliest))
        if restriction.latest is not None and restriction.latest < start:
            return None
        return DagRunInfo.interval(pendulum.instance(start - self._interval), start)
