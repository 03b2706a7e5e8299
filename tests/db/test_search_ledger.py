"""A search's ledger against a real PostgreSQL, without ranks (issue 34's review): the trials planned from the search
run's plan, a trial too big for the worker refused before any rank starts, and the commit's checks of what trained."""

from __future__ import annotations

import pytest

from pgtrain.config.settings import AuthorSettings
from pgtrain.core.errors import ConfigError
from pgtrain.planning import plan
from pgtrain.runs import record, trials
from tests.support import make_mixed_table, mixed_params, planned_run

AUTHOR = AuthorSettings(allowed_models=("mlp", "xgboost"), search_limits={"max_trials": 4, "concurrency": 2})
# 16 layers of 65536: about 6.4e10 parameters, some 1.5 TB to train; no worker has that
HUGE = [65536] * 16


def search_run(conn, search: dict, name: str = "search") -> record.Run:
    make_mixed_table(conn, 200)
    return planned_run(conn, name, **mixed_params(model_name="penguins-search", search=search))


def test_a_trial_too_big_for_the_worker_is_refused_and_the_search_goes_on(autocommit):
    search = search_run(autocommit, {"candidates": [{"model": "mlp", "params": {"hidden_sizes": [[8], HUGE]}},
                                                    {"model": "xgboost"}]})
    runs = plan.plan_trials(autocommit, search.run_id, AUTHOR)
    assert runs == [trials.trial_run_id(search.run_id, n) for n in (1, 3)]  # the train task is not mapped over 2
    refused = record.get_run(autocommit, trials.trial_run_id(search.run_id, 2))
    assert refused.status == "refused"
    assert "not trained: hidden_sizes [65536," in refused.status_reason and "of memory" in refused.status_reason
    assert record.get_run(autocommit, search.run_id).status == "sharded"  # the search goes on
    ledger = trials.ledger(autocommit, search.run_id)
    assert [t["status"] for t in ledger] == ["sharded", "refused", "sharded"]


def test_a_search_no_trial_of_which_fits_is_refused(autocommit):
    search = search_run(autocommit, {"candidates": [{"model": "mlp", "params": {"hidden_sizes": [HUGE]}}]})
    with pytest.raises(ConfigError, match="no trial fits in this worker's memory"):
        plan.plan_trials(autocommit, search.run_id, AUTHOR)
    assert record.get_run(autocommit, search.run_id).status == "refused"
