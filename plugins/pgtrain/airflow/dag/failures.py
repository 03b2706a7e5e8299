"""Which pgtrain errors Airflow may retry: the one retry rule of every pgtrain task, as a retry policy.

Bad input, bad settings and rejected commits fail the task for good (a retry would meet them again);
a crashed job, a busy lock or a lost lease are retried; a run that hit its ``execution_timeout`` is
retried only after a day (it would most likely time out again right away). Rules match in order.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import ExceptionRetryPolicy, RetryAction, RetryRule
from airflow.sdk.exceptions import AirflowTaskTimeout

from pgtrain.core.errors import LockTimeout, PgtrainError, StaleLockToken, TrainingFailed, TrainingInputError

RETRY_POLICY = ExceptionRetryPolicy(
    rules=[
        RetryRule(exception=TrainingInputError, action=RetryAction.FAIL,
                  reason="a rank refused its planned input: retrying cannot fix it"),
        RetryRule(exception=[TrainingFailed, LockTimeout, StaleLockToken], action=RetryAction.RETRY,
                  reason="the job crashed or the lock was busy or lost: a retry may pass"),
        RetryRule(exception=PgtrainError, action=RetryAction.FAIL,
                  reason="bad input, settings or a rejected commit: retrying cannot fix it"),
        RetryRule(exception=AirflowTaskTimeout, action=RetryAction.RETRY, retry_delay=timedelta(hours=24),
                  reason="the task hit its execution_timeout: not retried for another 24 hours"),
    ],
)
