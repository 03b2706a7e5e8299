"""What became of a training run, as the XCom each deciding task leaves (the DAG run's note is made from it)."""

from __future__ import annotations

from typing import Any

# The XCom each task leaves when it decides what became of the run; its value becomes the DAG run's note
# (pgtrain.airflow.ui.run_notes).
OUTCOME_KEY = "pgtrain_outcome"


def leave_outcome(ti: Any, conn: Any, run_id: str) -> None:
    """Leave the run's outcome as it stands in the database (``record.outcome``) for the DAG run's note."""
    from pgtrain.runs import record

    ti.xcom_push(key=OUTCOME_KEY, value=record.outcome(conn, run_id))
