"""MPIJobTrainOperator: the DAG's ``train`` task with launcher=kubernetes: a planned run's trainer as an MPIJob.

A plain BaseOperator holding the author's Kubernetes arguments: the cncf-kubernetes provider (both Kubernetes
clients, most of a DAG file's parse) is imported only when the task runs, where it builds the
``TrainingRunMPIJobOperator`` that submits and watches the job. Every other task process of the DAG parses the
same DAG without it. World size comes from the run record (plan_run's config snapshot), so a re-run trains what
was planned.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from pgtrain.airflow.dag import train_run
from pgtrain.airflow.dag.connection import DEFAULT_CONN_ID
from pgtrain.airflow.dag.failures import RETRY_POLICY
from pgtrain.core.errors import ConfigError
from pgtrain.launch.backends import kubernetes_backend
from pgtrain.launch.mpijob.spec import author_problems

if TYPE_CHECKING:
    from airflow.sdk import Context

    from pgtrain.airflow.kubernetes.training_job import TrainingRunMPIJobOperator

# BaseOperator's own arguments (task_id, retries, execution_timeout, ...); every other keyword is the job's.
_TASK_ARGUMENTS = frozenset(inspect.signature(BaseOperator.__init__).parameters) - {"self", "kwargs"}


class MPIJobTrainOperator(BaseOperator):
    """Train one planned run as an MPIJob (``launcher: kubernetes``).

    :param training_run_id: the run plan_run created (pass its XComArg); templated
    :param conn_id: Airflow connection of the training database; templated
    :param job_arguments: (a mapping, or every other keyword) the Kubernetes settings (``pgtrain.config.kubernetes``:
        namespace, image, gpus_per_worker, database_secret, node_selector, tolerations, deferrable, ...), checked
        now, and KubernetesPodOperator's other arguments, chosen by the DAG's author (``pgtrain.config.settings``),
        never by a trigger's conf
    """

    template_fields: Sequence[str] = ("training_run_id", "conn_id")
    ui_color = "#c6dbef"

    def __init__(self, *, training_run_id: str | None = None, conn_id: str = DEFAULT_CONN_ID,
                 job_arguments: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        # job_arguments by name too: a mapped task's partial() takes only the operators' named parameters
        twice = sorted(set(job_arguments or {}) & set(kwargs))
        if twice:
            raise ConfigError(f"MPIJobTrainOperator: {', '.join(twice)} given both in job_arguments and as a keyword; "
                              "give each setting once")
        kwargs = {**(job_arguments or {}), **kwargs}
        task = {key: kwargs.pop(key) for key in list(kwargs) if key in _TASK_ARGUMENTS}
        problems = author_problems(kwargs)  # when the DAG is parsed, as the settings file's schema is checked
        if problems:
            raise ConfigError(f"the train task's Kubernetes arguments are invalid: {'; '.join(problems)}; fix "
                              "`kubernetes:` in the DAG author's settings file (docs/kubernetes.md lists the keys)")
        default_args = dict(task.get("default_args") or {})
        if "retry_policy" not in default_args:  # a DAG's own policy wins over pgtrain's
            task.setdefault("retry_policy", RETRY_POLICY)
        super().__init__(**task)
        self.training_run_id = training_run_id
        self.conn_id = conn_id
        self.job_arguments = kwargs
        # the DAG's default_args for the job (deferrable, kubernetes_conn_id, ...), as a KubernetesPodOperator
        # would have taken them
        self.job_defaults = {key: value for key, value in default_args.items() if key not in _TASK_ARGUMENTS}
        self._job: TrainingRunMPIJobOperator | None = None

    def job_operator(self, context: Context | None = None) -> TrainingRunMPIJobOperator:
        """The operator that submits and watches this task's MPIJob (its templates rendered with ``context``)."""
        from pgtrain.airflow.kubernetes.training_job import TrainingRunMPIJobOperator

        # training_run_id is plan_run's XComArg until the task's templates are rendered: unresolved, it is no id
        run_id = self.training_run_id if isinstance(self.training_run_id, str) else None
        # Airflow hands each argument of the job's operators its default_args, as a KubernetesPodOperator task's
        job = TrainingRunMPIJobOperator(task_id=self.task_id, training_run_id=run_id, conn_id=self.conn_id,
                                        default_args=self.job_defaults, **self.job_arguments)
        if context is not None:
            job.render_template_fields(context, jinja_env=self.get_template_env())  # the DAG's macros and filters
        self._job = job
        return job

    def execute(self, context: Context) -> None:
        run_id = train_run.run_id_of(self.training_run_id, context)
        with train_run.failure_recorded(self.conn_id, run_id, context["ti"]):
            run = train_run.planned_run(self.conn_id, run_id, "kubernetes")
            self.log.info("training run %s: world_size %d, launcher kubernetes", run_id, run.config.world_size)
            try:
                job = self.job_operator(context)
            except (TypeError, ConfigError) as error:  # a retry would meet the same arguments
                raise AirflowFailException(
                    f"the train task's Kubernetes arguments are invalid: {error}; fix `kubernetes:` in the DAG "
                    "author's settings file (docs/kubernetes.md lists the keys)") from error
            job.world_size = run.config.world_size
            backend = kubernetes_backend(run.config.backend)
            self.log.info("backend: %s%s", backend, " (auto: the image's Horovod)" if run.config.backend == "auto"
                          else " (the author's setting)")
            job.job_settings = {**job.job_settings, "backend": backend,
                                "collective_timeout": run.config.collective_timeout}
            job.stall_timeout = run.config.stall_timeout
            with train_run.training_claimed(self.conn_id, run, context["ti"]) as claim:
                job.claim = claim  # deferred, the trigger keeps it until execute_complete (docs/locks.md)
                job.run_job(context)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> None:
        """Back from the triggerer (the job was deferrable): act on its verdict."""
        run_id = train_run.run_id_of(self.training_run_id, context)
        with train_run.trigger_claim_released(self.conn_id, event.get("claim"), self.log), \
                train_run.failure_recorded(self.conn_id, run_id, context["ti"]):
            self.job_operator(context).execute_complete(context, event)

    def on_kill(self) -> None:
        if self._job is not None:
            self._job.on_kill()
