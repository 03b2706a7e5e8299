"""LocalTrainOperator: the DAG's ``train`` task with launcher=local, ``horovodrun --gloo`` on this worker.

A plain BaseOperator (it imports no Kubernetes provider). World size comes from the run record (plan_run's
config snapshot), so a re-run trains what was planned.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from pgtrain.airflow.dag import train_run
from pgtrain.airflow.dag.connection import DEFAULT_CONN_ID, database_url
from pgtrain.airflow.dag.failures import RETRY_POLICY
from pgtrain.core.errors import TrainingFailed

if TYPE_CHECKING:
    from airflow.sdk import Context


class LocalTrainOperator(BaseOperator):
    """Train one planned run with Horovod on this machine (``launcher: local``).

    :param training_run_id: the run plan_run created (pass its XComArg); templated
    :param conn_id: Airflow connection of the training database
    """

    template_fields: Sequence[str] = ("training_run_id", "conn_id")
    ui_color = "#c6dbef"

    def __init__(self, *, training_run_id: str | None = None, conn_id: str = DEFAULT_CONN_ID, **kwargs: Any) -> None:
        if "retry_policy" not in (kwargs.get("default_args") or {}):  # a DAG's own policy wins over pgtrain's
            kwargs.setdefault("retry_policy", RETRY_POLICY)
        super().__init__(**kwargs)
        self.training_run_id = training_run_id
        self.conn_id = conn_id
        self._running = False

    def execute(self, context: Context) -> None:
        from pgtrain.launch.local import run_local

        run_id = train_run.run_id_of(self.training_run_id, context)
        with train_run.failure_recorded(self.conn_id, run_id, context["ti"]):
            run = train_run.planned_run(self.conn_id, run_id, "local")
            self.log.info("training run %s: world_size %d, launcher local", run_id, run.config.world_size)
            with train_run.training_claimed(self.conn_id, run, context["ti"]) as claim:
                self._running = True  # run_local starts a new attempt and clears the earlier one's output
                try:
                    run_local(run_id, run.config.world_size, database_url(self.conn_id), self.log,
                              claim=claim.lease)
                finally:
                    self._running = False

    def on_kill(self) -> None:
        if self._running:
            # Airflow calls on_kill from its SIGTERM handler in the task's main thread: raising here
            # unwinds run_local, which stops the horovodrun process group it started.
            self._running = False
            raise TrainingFailed("the task was killed; stopping the local Horovod ranks")
