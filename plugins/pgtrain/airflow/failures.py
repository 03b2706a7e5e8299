"""Which pgtrain errors Airflow may retry: the one rule every pgtrain task follows."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from airflow.sdk.exceptions import AirflowFailException

from pgtrain.errors import LockTimeout, PgtrainError, StaleLockToken, TrainingFailed, TrainingInputError


@contextmanager
def retry_only_what_may_pass() -> Iterator[None]:
    """Bad input, bad settings and rejected commits fail the task for good (a retry would meet them again);
    a crashed job, a busy lock or a lost lease propagate so that the task's retries apply."""
    try:
        yield
    except TrainingInputError as error:
        raise AirflowFailException(str(error)) from error
    except (TrainingFailed, LockTimeout, StaleLockToken):
        raise
    except PgtrainError as error:
        raise AirflowFailException(str(error)) from error
