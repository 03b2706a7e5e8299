"""A bad row that only the loader finds (NaN): the rank that loads it refuses the whole job for good, with the report.
(Bad rows found and reported without ranks: tests/db/test_bad_rows.py.)"""

from __future__ import annotations

import logging

import pytest

from pgtrain.runs import record
from tests.db.test_bad_rows import reported_kinds


@pytest.mark.horovod
def test_a_rank_that_loads_a_nan_refuses_the_whole_job_for_good_with_the_report(autocommit, db_url):
    from pgtrain.core.errors import TrainingInputError
    from pgtrain.launch import local as launch_local
    from tests.support import planned_run, seed_samples

    seed_samples(autocommit, rows=300, dim=8, classes=3)  # keys 1..300: rank 1 holds 151..300
    autocommit.execute("UPDATE public.samples SET features[8] = 'NaN' WHERE id = 300")
    run = planned_run(autocommit, world_size=2, epochs=2)  # compute_shards leaves the NaN to the loader

    with pytest.raises(TrainingInputError) as failure:
        launch_local.run_local(run.run_id, 2, db_url, logging.getLogger("test.nan"), timeout_seconds=300)

    run = record.get_run(autocommit, run.run_id)
    assert run.status == "refused" and run.attempt == 1
    assert run.status_reason.startswith("rank 1 found 1 rows with NaN"), run.status_reason
    assert reported_kinds(run.status_reason) == {"non_finite": (1, ["300"])}
    assert run.status_reason in str(failure.value)
    assert autocommit.execute("SELECT count(*) FROM pgtrain.run_metrics WHERE run_id = %s",
                              (run.run_id,)).fetchone()[0] == 0
