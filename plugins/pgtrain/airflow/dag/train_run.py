"""What both train operators (local and Kubernetes) do around their job: find the planned run, refuse one
planned for the other launcher, hold the model's training claim, start an attempt, and record a failed job's
verdict before the task fails."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from pgtrain.airflow.dag.connection import database_url
from pgtrain.airflow.dag.outcome import leave_outcome
from pgtrain.core.errors import ClaimLost, TrainingBusy, TrainingFailed, TrainingInputError


def task_owner(ti: Any) -> dict[str, Any]:
    """Who holds a lock or commits, as the lock table's owner record names a task's try."""
    return {"dag_id": ti.dag_id, "run_id": ti.run_id, "task_id": ti.task_id, "try_number": ti.try_number}


def run_id_of(explicit: str | None, context: Any) -> str:
    """The training run a train task trains: ``explicit`` (plan_run's XCom), else the DAG run's own."""
    if explicit:
        return str(explicit)
    from pgtrain.runs.record import training_run_id

    return training_run_id(context["ti"].dag_id, context["run_id"])


def planned_run(conn_id: str, run_id: str, launcher: str) -> Any:
    """The run record; a run planned for another launcher than this train task's fails for good."""
    from pgtrain.core.db import connect
    from pgtrain.runs import record

    with connect(database_url(conn_id)) as conn:
        run = record.get_run(conn, run_id)
    if run.config.launcher != launcher:
        raise AirflowFailException(
            f"training run {run_id} was planned for launcher={run.config.launcher!r}, but this DAG's train task "
            f"launches {launcher!r} (the DAG's author changed the launcher since plan_run): re-run the DAG run "
            "from plan_run")
    return run


def start_attempt(conn_id: str, run_id: str) -> int:
    from pgtrain.core.db import connect
    from pgtrain.launch.attempt import start_attempt as start

    with connect(database_url(conn_id)) as conn:
        return start(conn, run_id)


def trainer_verdict(conn_id: str, run_id: str, attempt: int | None) -> tuple[str, str] | None:
    """What the trainer recorded when it stopped (start_attempt cleared any earlier attempt's verdict)."""
    from pgtrain.core.db import connect
    from pgtrain.runs import record

    with connect(database_url(conn_id)) as conn:
        return record.trainer_verdict(conn, run_id, attempt)


@contextmanager
def failure_recorded(conn_id: str, run_id: str, ti: Any) -> Iterator[None]:
    """A failed job marks the run 'failed' (with the first line of why) before the task fails, unless the
    trainer recorded its own verdict (refused, or failed with its reason): that one stays. A try whose claim a new
    try of the run took over records nothing: the run's outcome is that try's."""
    try:
        yield
    except ClaimLost as lost:
        if not lost.superseded:
            _record_failure(conn_id, run_id, ti, lost)
        raise
    except TrainingFailed as failure:
        _record_failure(conn_id, run_id, ti, failure)
        raise


def _record_failure(conn_id: str, run_id: str, ti: Any, failure: TrainingFailed) -> None:
    from pgtrain.core.db import connect
    from pgtrain.runs import record

    status = "refused" if isinstance(failure, TrainingInputError) else "failed"
    with connect(database_url(conn_id)) as conn:
        record.record_verdict(conn, run_id, status, str(failure).splitlines()[0])
        # The DAG run's note (pgtrain.airflow.ui.run_notes): the verdict that stays, with its reason.
        leave_outcome(ti, conn, run_id)


@contextmanager
def training_claimed(conn_id: str, run: Any, ti: Any) -> Iterator[Any]:
    """Hold the model's training claim (``pgtrain.launch.attempt.training_claim``) around the job; a deferring task
    hands it to its trigger (``TrainingClaim.hand_over``). A run refused because another run of the model is
    training is marked 'refused' with who holds it (the DAG run's note), and the task fails for good: nothing was
    launched."""
    from pgtrain.core.db import connect
    from pgtrain.launch.attempt import training_claim
    from pgtrain.runs import record

    url = database_url(conn_id)
    try:
        with training_claim(url, run, task_owner(ti)) as claim:
            yield claim
    except TrainingBusy as busy:
        with connect(url) as conn:
            record.record_verdict(conn, run.run_id, "refused", str(busy))
            leave_outcome(ti, conn, run.run_id)
        raise


@contextmanager
def trigger_claim_released(conn_id: str, claim: Mapping[str, Any] | None, log: Any) -> Iterator[None]:
    """Back from the triggerer: release the claim its trigger held (``TrainingClaim.hand_over``'s record; none from a
    trigger of pgtrain 0.1.0) once the block ends, whatever its outcome; a release that cannot complete fails no task
    and hides no error (``released_at_end``)."""
    from pgtrain.core.db import connect
    from pgtrain.launch.attempt import release_claim
    from pgtrain.store.control import released_at_end

    if not claim:
        yield
        return

    def release() -> None:
        with connect(database_url(conn_id)) as conn:
            if not release_claim(conn, claim):
                log.warning("training claim %s (token %s) had already ended while the trigger watched the job",
                            claim["name"], claim["token"])

    with released_at_end(release, f"training claim {claim['name']} (token {claim['token']})",
                         lambda: f"within {claim['ttl']:g} s of the trigger's last renewal"):
        yield


def claim_lost(conn_id: str, lease: Any) -> ClaimLost:
    """``pgtrain.launch.attempt.claim_lost`` for the claim ``lease``, asked through the task's connection. Raises when
    the database cannot be asked."""
    from pgtrain.core.db import connect
    from pgtrain.launch.attempt import claim_lost as lost_to

    with connect(database_url(conn_id)) as conn:
        return lost_to(conn, lease.name, lease.owner.get("training_run"))
