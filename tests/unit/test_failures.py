"""The retry rule of every pgtrain task: what retrying could fix is retried, the rest fails the task for good."""

from __future__ import annotations

from datetime import timedelta

import pytest
from airflow.sdk import RetryAction
from airflow.sdk.exceptions import AirflowTaskTimeout

from pgtrain.airflow.dag.failures import RETRY_POLICY
from pgtrain.core.errors import (
    CommitRejected,
    ConfigError,
    LockTimeout,
    SourceError,
    StaleLockToken,
    TrainingFailed,
    TrainingInputError,
)


@pytest.mark.parametrize("error", [SourceError("empty"), ConfigError("bad"), CommitRejected("gate"),
                                   TrainingInputError("rows changed")])
def test_what_a_retry_would_meet_again_fails_for_good(error):
    assert RETRY_POLICY.evaluate(error, try_number=1, max_tries=3).action == RetryAction.FAIL


@pytest.mark.parametrize("error", [TrainingFailed("rank crashed"), LockTimeout("busy"), StaleLockToken("lost")])
def test_what_may_pass_is_retried(error):
    assert RETRY_POLICY.evaluate(error, try_number=1, max_tries=3).action == RetryAction.RETRY


def test_a_hit_execution_timeout_waits_a_day():
    decision = RETRY_POLICY.evaluate(AirflowTaskTimeout(), try_number=1, max_tries=3)
    assert (decision.action, decision.retry_delay) == (RetryAction.RETRY, timedelta(hours=24))


def test_other_errors_follow_the_tasks_retries():
    assert RETRY_POLICY.evaluate(OSError("disk"), try_number=1, max_tries=3).action == RetryAction.DEFAULT

