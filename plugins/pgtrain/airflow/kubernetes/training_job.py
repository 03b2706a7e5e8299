"""TrainingRunMPIJobOperator: the MPIJobOperator ``MPIJobTrainOperator`` builds and runs when a pgtrain train
task runs on Kubernetes."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pgtrain.airflow.dag import train_run
from pgtrain.airflow.dag.connection import DEFAULT_CONN_ID
from pgtrain.airflow.kubernetes.errors import MPIJobStalled
from pgtrain.airflow.kubernetes.operator import MPIJobOperator
from pgtrain.airflow.kubernetes.training_trigger import STALLED, TrainingRunMPIJobTrigger
from pgtrain.airflow.kubernetes.trigger import STOPPED, MPIJobTrigger
from pgtrain.core.errors import ClaimLost, StaleLockToken, TrainingFailed
from pgtrain.launch.attempt import DEFERRED_TTL

if TYPE_CHECKING:
    from airflow.sdk import Context

    from pgtrain.launch.attempt import TrainingClaim
    from pgtrain.launch.mpijob import watch


CLAIM_GUARD_INTERVAL = 1.0  # seconds between the claim guard's looks at whether the synchronous watch has ended


class TrainingRunMPIJobOperator(MPIJobOperator):
    """An MPIJobOperator whose jobs are a pgtrain run's train attempts: each new job begins the run's next attempt
    (the trainer is told its number), and a failed job is explained with the trainer's recorded verdict.
    ``MPIJobTrainOperator`` builds one when the train task runs.

    :param conn_id: Airflow connection of the training database (starting an attempt, reading the trainer's
        verdict); the pods read the database URL from the Kubernetes Secret instead.

    ``claim``: the run's training claim, held around the job (``MPIJobTrainOperator``); deferred, the task hands it
    to its trigger, which keeps it until the task resumes. ``stall_timeout``: the run's (``MPIJobTrainOperator``
    sets it); once the job runs, a guard deletes it when no new epoch is recorded for that long
    (``pgtrain.launch.stall``), and the task fails naming the stall.
    """

    template_fields: Sequence[str] = (*MPIJobOperator.template_fields, "conn_id")

    def __init__(self, *, conn_id: str = DEFAULT_CONN_ID, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.conn_id = conn_id
        self.claim: TrainingClaim | None = None
        self._lost: ClaimLost | None = None  # the claim was lost: the job deleted, or left to a new try of the run
        self._guard_lock = threading.Lock()  # the guards act only while the synchronous watch runs
        self.stall_timeout: float | None = None
        self._stalled: str | None = None  # why the stall guard deleted the job
        self._run_id: str | None = None

    def run_job(self, context: Context) -> None:
        self._run_id = self._training_run_id(context)
        super().run_job(context)

    def before_submit(self, context: Context) -> None:
        """A new job is a new attempt (the earlier one's writes are refused from now on) and trains from
        scratch: the earlier attempt's metrics and staged parameters are forgotten."""
        run_id = self._training_run_id(context)
        self.attempt = train_run.start_attempt(self.conn_id, run_id)
        self.log.info("training run %s: attempt %d", run_id, self.attempt)

    def trainer_verdict(self, context: Context) -> tuple[str, str] | None:
        return train_run.trainer_verdict(self.conn_id, self._training_run_id(context), self.attempt)

    def make_trigger(self, **arguments: Any) -> MPIJobTrigger:
        if self.claim is None:
            return super().make_trigger(**arguments)
        try:  # renewed on each poll: a lease of at least three polls
            kept = self.claim.hand_over(max(DEFERRED_TTL, 3 * float(self.poll_interval)), held_by="trigger",
                                        host=None, pid=None, mpijob=f"{arguments['namespace']}/{arguments['name']}")
        except StaleLockToken:  # lost between its acquisition and now
            lost = train_run.claim_lost(self.conn_id, self.claim.lease)
            if not lost.superseded:
                self.delete_mpijob(str(lost))
            raise lost from None
        return TrainingRunMPIJobTrigger(claim=kept, conn_id=self.conn_id, stall_timeout=self.stall_timeout,
                                        training_run_id=self._run_id, **arguments)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> None:
        if event.get("status") == "error" and event.get("reason") == STALLED:  # the trigger deleted the job
            raise MPIJobStalled(f"MPIJob {event.get('namespace')}/{event.get('name')}: {event.get('message')}")
        if event.get("status") == "error" and event.get("reason") == STOPPED:  # the trigger deleted the job
            raise ClaimLost(event.get("message") or "the training claim was lost")
        super().execute_complete(context, event)

    def _wait(self) -> watch.WatchVerdict:
        """The synchronous watch; meanwhile a guard acts once the claim's heartbeat finds the claim lost
        (``_guard_claim``), so that two jobs never go on training one model, and another once the running job
        records no epoch for ``stall_timeout`` (``_guard_stall``)."""
        ended = threading.Event()
        if self.claim is not None:
            threading.Thread(target=self._guard_claim, args=(ended,), name="pgtrain-claim-guard", daemon=True).start()
        if self.stall_timeout:
            threading.Thread(target=self._guard_stall, args=(ended,), name="pgtrain-stall-guard", daemon=True).start()
        try:
            return super()._wait()
        except TrainingFailed:
            if self._lost is not None:  # the deleted job's own failure says less than why it was deleted
                raise self._lost from None
            if self._stalled is not None:
                raise self._stall_error() from None
            raise
        finally:
            with self._guard_lock:
                ended.set()

    def _stall_error(self) -> MPIJobStalled:
        return MPIJobStalled(f"MPIJob {self.job_namespace}/{self.job_name}: {self._stalled}")

    def _guard_stall(self, ended: threading.Event) -> None:
        """Once the job runs, ask on each poll whether it recorded an epoch within ``stall_timeout``; when it has
        not, delete it (its launcher's log then ends, and ``_finish`` names the stall)."""
        from pgtrain.airflow.dag.connection import database_url
        from pgtrain.core.db import connect
        from pgtrain.launch.stall import check_stall

        while not ended.wait(float(self.poll_interval)):
            running_at = getattr(self, "running_at", None)
            if running_at is None or self._run_id is None:
                continue
            try:
                with connect(database_url(self.conn_id), application_name="pgtrain-stall-guard") as conn:
                    stalled = check_stall(conn, self._run_id, time.monotonic() - running_at, self.stall_timeout)
            except Exception:  # the database away: asked again at the next poll
                self.log.warning("could not read the epochs of run %s", self._run_id, exc_info=True)
                continue
            if stalled is None:
                continue
            with self._guard_lock:
                if ended.is_set():
                    return
                self.log.error("%s", stalled)
                self._stalled = stalled
                try:
                    self.delete_mpijob("it stalled")
                except Exception:
                    self.log.exception("could not delete MPIJob %s/%s: delete it by hand", self.job_namespace,
                                       self.job_name)
            return

    def _guard_claim(self, ended: threading.Event) -> None:
        """Once the claim is lost: delete the job when another run (or nobody) holds the claim now; leave it when a
        new try of this run does (it re-attached to this very job), and stop watching it. Who holds it is asked
        again until the database answers."""
        lease = self.claim.lease
        while not lease.lost_event.wait(CLAIM_GUARD_INTERVAL):
            if ended.is_set():
                return
        lost = None
        while lost is None:
            try:
                lost = train_run.claim_lost(self.conn_id, lease)
            except Exception:
                self.log.warning("training claim %s lost; who holds it now could not be read, asking again",
                                 lease.name, exc_info=True)
                if ended.wait(CLAIM_GUARD_INTERVAL):
                    return
        with self._guard_lock:
            if ended.is_set():  # the watch has ended (the job succeeded or failed): nothing to stop
                return
            self.log.error("%s", lost)
            self._lost = lost
            if lost.superseded:
                return
            try:
                self.delete_mpijob(str(lost))
            except Exception:
                self.log.exception("could not delete MPIJob %s/%s: delete it by hand", self.job_namespace,
                                   self.job_name)

    def watch_abandoned(self) -> bool:
        return self._lost is not None and self._lost.superseded

    def _finish(self, verdict: watch.WatchVerdict, context: Context) -> None:
        if self._lost is not None:
            raise self._lost
        if self._stalled is not None:
            raise self._stall_error()
        super()._finish(verdict, context)

    def _cleanup(self, verdict: watch.WatchVerdict | None) -> None:
        if self.watch_abandoned():  # the job is the new try's now
            return
        super()._cleanup(verdict)

    def on_kill(self) -> None:
        if self.watch_abandoned():
            return
        super().on_kill()
