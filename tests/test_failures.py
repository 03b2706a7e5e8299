"""The retry rule of every pgtrain task: what retrying could fix propagates, the rest fails the task for good."""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import AirflowFailException

from pgtrain.airflow.failures import retry_only_what_may_pass
from pgtrain.errors import (
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
    with pytest.raises(AirflowFailException, match=str(error)) as raised, retry_only_what_may_pass():
        raise error
    assert raised.value.__cause__ is error


@pytest.mark.parametrize("error", [TrainingFailed("rank crashed"), LockTimeout("busy"), StaleLockToken("lost")])
def test_what_may_pass_is_left_to_the_retries(error):
    with pytest.raises(type(error)) as raised, retry_only_what_may_pass():
        raise error
    assert raised.value is error
