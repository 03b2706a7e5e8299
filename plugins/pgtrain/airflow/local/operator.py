"""The DAG's ``train`` task: the same trainer, on this machine (launcher=local) or as an MPIJob (kubernetes).

World size and launcher come from the run record (plan_run's config snapshot), so a re-run trains
what was planned. Every Kubernetes setting (image, namespace, Secret, node selector, ...) is a
constructor argument, chosen by the DAG's author (``pgtrain.config.settings``), never by a trigger's conf.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException

from pgtrain.airflow.dag.connection import DEFAULT_CONN_ID, database_url
from pgtrain.airflow.dag.failures import RETRY_POLICY
from pgtrain.airflow.dag.tasks import leave_outcome
from pgtrain.airflow.kubernetes.operator import MPIJobOperator
from pgtrain.core.errors import TrainingFailed, TrainingInputError

if TYPE_CHECKING:
    from airflow.sdk import Context

class HorovodTrainOperator(MPIJobOperator):
    """Train one planned run with Horovod; ``launcher`` "local" runs horovodrun here, "kubernetes" an MPIJob.

    :param training_run_id: the run plan_run created (pass its XComArg); templated
    :param conn_id: Airflow connection of the training database (local launcher, and clearing the
        output of an earlier attempt). Pods read the database URL from the Kubernetes Secret instead.
    :param launcher: override of the run's configured launcher; templated
    """

    template_fields = (*MPIJobOperator.template_fields, "conn_id", "launcher")

    def __init__(self, *, training_run_id: str | None = None, conn_id: str = DEFAULT_CONN_ID,
                 launcher: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("retry_policy", RETRY_POLICY)
        super().__init__(training_run_id=training_run_id, **kwargs)
        self.conn_id = conn_id
        self.launcher = launcher
        self._local_running = False

    def execute(self, context: Context) -> None:
        with self._failure_recorded(context):
            return self._train(context)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> None:
        with self._failure_recorded(context):
            return super().execute_complete(context, event)

    @contextmanager
    def _failure_recorded(self, context: Context) -> Iterator[None]:
        """A failed job marks the run 'failed' (with the first line of why) before the task fails, unless the
        trainer recorded its own verdict (refused, or failed with its reason): that one stays."""
        from pgtrain.core.db import connect
        from pgtrain.runs import record

        try:
            yield
        except TrainingFailed as failure:
            status = "refused" if isinstance(failure, TrainingInputError) else "failed"
            with connect(database_url(self.conn_id)) as conn:
                record.record_verdict(conn, self._training_run_id(context), status, str(failure).splitlines()[0])
                # The DAG run's note (pgtrain.airflow.ui.run_notes): the verdict that stays, with its reason.
                leave_outcome(context["ti"], conn, self._training_run_id(context))
            raise

    def _train(self, context: Context) -> None:
        from pgtrain.core.db import connect
        from pgtrain.launch import local as launch_local
        from pgtrain.runs import record

        run_id = self._training_run_id(context)
        url = database_url(self.conn_id)
        with connect(url) as conn:
            run = record.get_run(conn, run_id)
        launcher = self.launcher or run.config.launcher
        self.log.info("training run %s: world_size %d, launcher %s", run_id, run.config.world_size, launcher)
        self.world_size = run.config.world_size
        if launcher == "local":  # run_local starts a new attempt and clears the earlier one's output
            self._local_running = True
            try:
                launch_local.run_local(run_id, run.config.world_size, url, self.log)
            finally:
                self._local_running = False
            return None
        if launcher != "kubernetes":
            raise AirflowFailException(f"launcher={launcher!r} should be 'local' or 'kubernetes'")
        return super().execute(context)

    def on_kill(self) -> None:
        if self._local_running:
            # Airflow calls on_kill from its SIGTERM handler in the task's main thread: raising here
            # unwinds run_local, which stops the horovodrun process group it started.
            self._local_running = False
            raise TrainingFailed("the task was killed; stopping the local Horovod ranks")
        super().on_kill()

    def before_submit(self, context: Context) -> None:
        """A new job is a new attempt (the earlier one's writes are refused from now on) and trains from
        scratch: forget metrics and staged parameters of the earlier attempt."""
        from pgtrain.core.db import connect
        from pgtrain.runs import record

        run_id = self._training_run_id(context)
        with connect(database_url(self.conn_id)) as conn:
            self.attempt = record.begin_attempt(conn, run_id)
            record.clear_training_output(conn, run_id)
        self.log.info("training run %s: attempt %d", run_id, self.attempt)

    def trainer_verdict(self, context: Context) -> tuple[str, str] | None:
        """What the trainer recorded when it stopped (begin_attempt cleared any earlier attempt's verdict)."""
        from pgtrain.core.db import connect
        from pgtrain.runs import record

        with connect(database_url(self.conn_id)) as conn:
            return record.trainer_verdict(conn, self._training_run_id(context), self.attempt)
