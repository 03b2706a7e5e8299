"""TrainingRunMPIJobOperator: the MPIJobOperator ``MPIJobTrainOperator`` builds and runs when a pgtrain train
task runs on Kubernetes."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pgtrain.airflow.dag import train_run
from pgtrain.airflow.dag.connection import DEFAULT_CONN_ID
from pgtrain.airflow.kubernetes.operator import MPIJobOperator
from pgtrain.airflow.kubernetes.training_trigger import TrainingRunMPIJobTrigger
from pgtrain.airflow.kubernetes.trigger import MPIJobTrigger
from pgtrain.core.errors import TrainingFailed
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
    to its trigger, which keeps it until the task resumes.
    """

    template_fields: Sequence[str] = (*MPIJobOperator.template_fields, "conn_id")

    def __init__(self, *, conn_id: str = DEFAULT_CONN_ID, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.conn_id = conn_id
        self.claim: TrainingClaim | None = None
        self._claim_lost: str | None = None  # why the job was deleted: its claim went to another run

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
        # renewed on each poll: a lease of at least three polls
        kept = self.claim.hand_over(max(DEFERRED_TTL, 3 * float(self.poll_interval)), held_by="trigger",
                                    host=None, pid=None, mpijob=f"{arguments['namespace']}/{arguments['name']}")
        return TrainingRunMPIJobTrigger(claim=kept, conn_id=self.conn_id, **arguments)

    def _wait(self) -> watch.WatchVerdict:
        """The synchronous watch; meanwhile a guard deletes the job if the claim's heartbeat finds the claim lost to
        another run (``train_run.lost_to_another_run``), so that two jobs never go on training one model."""
        if self.claim is None:
            return super()._wait()
        ended = threading.Event()
        threading.Thread(target=self._guard_claim, args=(ended,), name="pgtrain-claim-guard", daemon=True).start()
        try:
            return super()._wait()
        except TrainingFailed:
            if self._claim_lost:  # the deleted job's own failure says less than why it was deleted
                raise TrainingFailed(self._claim_lost) from None
            raise
        finally:
            ended.set()

    def _guard_claim(self, ended: threading.Event) -> None:
        lost = self.claim.lease.lost_event
        while not lost.wait(CLAIM_GUARD_INTERVAL):
            if ended.is_set():
                return
        if ended.is_set():
            return
        reason = train_run.lost_to_another_run(self.conn_id, self.claim.lease)
        if reason is None:
            self.log.error("training claim of MPIJob %s/%s lost: %s. A new try of the run holds it and watches this "
                           "job now.", self.job_namespace, self.job_name, self.claim.lease.lost)
            return
        self.log.error("%s", reason)
        self._claim_lost = reason
        self.delete_mpijob(reason)

    def _finish(self, verdict: watch.WatchVerdict, context: Context) -> None:
        if self._claim_lost:
            raise TrainingFailed(self._claim_lost)
        super()._finish(verdict, context)
