"""TrainingRunMPIJobOperator: the MPIJobOperator ``MPIJobTrainOperator`` builds and runs when a pgtrain train
task runs on Kubernetes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pgtrain.airflow.dag import train_run
from pgtrain.airflow.dag.connection import DEFAULT_CONN_ID
from pgtrain.airflow.kubernetes.operator import MPIJobOperator
from pgtrain.airflow.kubernetes.training_trigger import TrainingRunMPIJobTrigger
from pgtrain.airflow.kubernetes.trigger import MPIJobTrigger
from pgtrain.launch.attempt import DEFERRED_TTL

if TYPE_CHECKING:
    from airflow.sdk import Context

    from pgtrain.launch.attempt import TrainingClaim


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
