"""An older attempt can no longer write to its run: every table a trainer writes refuses a stale attempt.

(A killed launcher's ranks, fenced the same way: tests/integration/horovod/test_orphans.py.)
"""

from __future__ import annotations

import numpy as np
import psycopg
import pytest

from pgtrain.core.db import connect
from pgtrain.launch.attempt import clear_output
from pgtrain.runs import record
from pgtrain.store import tensors
from tests.support import planned_run, seed_samples


def assert_refused(conn: psycopg.Connection, write, attempt: int, run_id: str) -> None:
    with pytest.raises(psycopg.Error, match=f"stale train attempt {attempt} of run {run_id}") as refused:
        write(conn)
    assert refused.value.sqlstate == "PT409"


def test_writes_of_an_older_attempt_are_refused_and_others_pass(db_url):
    with psycopg.connect(db_url, autocommit=True) as conn:
        seed_samples(conn, rows=40)
        run = planned_run(conn, world_size=2, epochs=1)
        assert record.get_run(conn, run.run_id).attempt == 0
        assert [record.begin_attempt(conn, run.run_id) for _ in range(3)] == [1, 2, 3]
    epoch = {"train_loss": 1.0, "train_accuracy": 0.5, "seconds": 1.0}
    with connect(db_url, attempt=3) as current:
        record.record_epoch(current, run.run_id, 1, epoch)
    with connect(db_url, attempt=2) as stale:
        for write in (
            lambda c: record.record_epoch(c, run.run_id, 2, epoch),
            lambda c: record.mark_training(c, run.run_id),
            lambda c: record.set_status(c, run.run_id, "trained"),
            lambda c: c.execute("DELETE FROM pgtrain.run_metrics WHERE run_id = %s", (run.run_id,)),
            lambda c: tensors.write_staged(c, run.run_id, {"w": np.zeros(3, np.float32)}),
            lambda c: tensors.write_checkpoint(c, run.run_id, 1, {"w": np.zeros(3, np.float32)}, {}),
        ):
            assert_refused(stale, write, 2, run.run_id)
    with connect(db_url, attempt=3) as current:
        tensors.write_checkpoint(current, run.run_id, 1, {"w": np.zeros(3, np.float32)}, {})
        tensors.write_staged(current, run.run_id, {"w": np.zeros(3, np.float32)})
        record.set_status(current, run.run_id, "trained")
    with connect(db_url) as airflow_side:  # no attempt: the launchers and commit are not fenced
        record.set_status(airflow_side, run.run_id, "committed")
        assert [m["epoch"] for m in record.epoch_metrics(airflow_side, run.run_id)] == [1]
        assert record.get_run(airflow_side, run.run_id).status == "committed"
        clear_output(airflow_side, run.run_id)


def test_every_table_a_trainer_writes_is_fenced(conn):
    fenced = {row[0] for row in conn.execute(
        "SELECT tgrelid::regclass::text FROM pg_trigger WHERE tgname = 'refuse_stale_attempt'").fetchall()}
    # tensor bytes (pgtrain.tensor_chunks) are written in the transaction that writes these layout rows first
    assert fenced == {f"pgtrain.{t}" for t in ("training_runs", "run_metrics", "staged_parameters", "checkpoints")}
