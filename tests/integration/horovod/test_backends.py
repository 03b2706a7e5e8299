"""The collectives backends on real ranks: ``auto`` without a usable Horovod trains with torch.distributed, and a
torch rank that dies fails its job (the surviving ranks are stopped) with the launcher's usual verdict handling."""

from __future__ import annotations

import os
import signal

import numpy as np
import psycopg
import pytest

from pgtrain.core.errors import TrainingFailed, TrainingInputError
from pgtrain.runs import record
from pgtrain.store import tensors
from tests.integration.horovod.test_resume import trainer_rank
from tests.support import job_in_background, planned_run, run_job, seed_samples, wait_for, wait_for_checkpoint

pytestmark = pytest.mark.horovod


def recorded_backend(conn: psycopg.Connection, run_id: str) -> str | None:
    return conn.execute("SELECT backend FROM pgtrain.training_runs WHERE run_id = %s", (run_id,)).fetchone()[0]


def test_auto_trains_with_torch_where_horovod_does_not_import(autocommit, db_url, tmp_path, monkeypatch):
    """A ``horovod`` package that raises ImportError first on the ranks' PYTHONPATH (they inherit it): ``auto``
    picks torch, says so, trains two ranks and records it; the same run planned again with Horovod importable
    picks horovod."""
    shim = tmp_path / "shim" / "horovod"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('horovod is not installed here (test shim)')\n")
    pythonpath = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(shim.parent), pythonpath]))
    seed_samples(autocommit, rows=120, dim=6, classes=3)
    run = planned_run(autocommit, world_size=2, epochs=2, hidden_sizes=[5])
    assert run.config.backend == "auto"
    output = run_job(run, db_url)
    assert any("backend: auto chose torch (torch.distributed): no usable Horovod (import horovod failed: "
               "ImportError: horovod is not installed here (test shim))" in line for line in output), output
    assert any("collectives: torch (2 ranks)" in line for line in output)
    assert recorded_backend(autocommit, run.run_id) == "torch"
    assert all(np.isfinite(a).all() for a in tensors.read_staged(autocommit, run.run_id).values())

    monkeypatch.setenv("PYTHONPATH", pythonpath)
    again = planned_run(autocommit, "with-horovod", world_size=2, epochs=1, hidden_sizes=[5])
    output = run_job(again, db_url)
    assert any("backend: auto chose horovod" in line for line in output)
    assert recorded_backend(autocommit, again.run_id) == "horovod"


def test_a_sigkilled_torch_rank_fails_the_job(autocommit, db_url):
    """Rank 1 SIGKILLed mid-training (rank 0 held in a database write): the job fails, as a failure (retried),
    not a refusal, and no rank is left behind."""
    seed_samples(autocommit, rows=200, dim=6, classes=3)
    run = planned_run(autocommit, world_size=2, epochs=6, batch_size=8, hidden_sizes=[8], backend="torch",
                      collective_timeout=20)
    with psycopg.connect(db_url) as blocker:
        blocker.execute("INSERT INTO pgtrain.run_metrics (run_id, epoch, train_loss, seconds) VALUES (%s, 2, 0, 0)",
                        (run.run_id,))
        job, failure = job_in_background(run, db_url)
        wait_for_checkpoint(db_url, run.run_id, 1)
        rank_1 = wait_for(lambda: trainer_rank(run.run_id, 1), 30, "rank 1")
        os.kill(rank_1.pid, signal.SIGKILL)
        job.join(timeout=240)
        assert not job.is_alive()
        blocker.rollback()
    assert len(failure) == 1 and isinstance(failure[0], TrainingFailed), failure
    assert not isinstance(failure[0], TrainingInputError)
    assert "the torch job of run" in str(failure[0])
    assert trainer_rank(run.run_id, 0) is None
    assert record.get_run(autocommit, run.run_id).status != "trained"
