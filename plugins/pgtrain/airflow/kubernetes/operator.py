"""MPIJobOperator: run the trainer as a Kubeflow MPIJob, the way SparkKubernetesOperator drives its resource.

A subclass of the cncf-kubernetes provider's KubernetesPodOperator: KPO builds the pod (image, env,
secrets, volumes, resources, node selector, tolerations, affinity, pull secrets, service account,
labels), ``pgtrain.launch.mpijob.spec`` turns it into the launcher and worker templates of one MPIJob. Then:

- re-attach: a running (or succeeded) MPIJob of this task instance, found through the task state
  store (Airflow 3.3) or by the task-instance labels, is watched instead of submitting a second one;
- create; find the launcher pod by ``training.kubeflow.org/job-name`` and ``job-role=launcher``;
  stream its log into the task log while it runs; finish on the MPIJob's Succeeded/Failed condition;
- a failure raises with the condition's reason and message and the launcher's last log lines;
- not running after ``startup_timeout_seconds`` (e.g. no GPUs free): the MPIJob is deleted and the
  error says which pods wait for what; a suspended job (waiting in a Kueue queue) is not late: its startup
  timeout counts from when it leaves the queue;
- no MPIJob CRD in the cluster (the MPI Operator is not installed): the task fails for good, saying so;
- ``on_kill`` deletes the MPIJob with foreground propagation; afterwards the MPIJob is deleted or
  kept according to ``on_finish_action`` (KPO's values: delete_pod, delete_succeeded_pod, keep_pod,
  delete_active_pod);
- ``deferrable=True``: a trigger polls the conditions, the worker slot is freed meanwhile;
- the job is read every ``poll_interval`` seconds, its pods only until it runs, and a pod's events only
  while it waits scheduled but not yet created (one field-selected list per such pod).

The API calls live in ``MPIJobClient``; what one look at the job and its pods means (running,
succeeded, failed, cannot start, timed out) is ``pgtrain.launch.mpijob.watch.watch_step``, the same in the
operator's loop and in the trigger.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator
from airflow.providers.cncf.kubernetes.utils.pod_manager import OnFinishAction, OnKillAction
from airflow.providers.common.compat.sdk import AirflowNotFoundException
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowFailException
from kubernetes.client import models as k8s
from kubernetes.client.exceptions import ApiException

from pgtrain.airflow.dag import train_run
from pgtrain.airflow.kubernetes import errors
from pgtrain.airflow.kubernetes.client import MPIJobClient, container_started
from pgtrain.airflow.kubernetes.trigger import MISSING_OPERATOR, MPIJobTrigger
from pgtrain.airflow.kubernetes.watching import MPIJobWatch
from pgtrain.config import kubernetes
from pgtrain.core.errors import ConfigError, TrainingFailed
from pgtrain.launch.mpijob import api, cli, spec, watch

if TYPE_CHECKING:
    from airflow.sdk import Context

STATE_STORE_KEY = "pgtrain_mpijob"
CHECKED_LABEL = KubernetesPodOperator.POD_CHECKED_KEY


def _to_pod_operator_arguments(kwargs: dict[str, Any], env: dict[str, str]) -> None:
    """The author's settings that KubernetesPodOperator has arguments for, in its forms (pull secrets by name;
    ``env`` into its env_vars): KPO puts them on the pod both templates derive from."""
    secrets = kwargs.get("image_pull_secrets")
    if isinstance(secrets, (list, tuple)):
        kwargs["image_pull_secrets"] = [k8s.V1LocalObjectReference(name=s) if isinstance(s, str) else s
                                        for s in secrets]
    if env:
        env_vars = kwargs.get("env_vars") or []
        kwargs["env_vars"] = ({**env_vars, **env} if isinstance(env_vars, dict)
                              else [*env_vars, *(k8s.V1EnvVar(name=k, value=v) for k, v in env.items())])


class MPIJobOperator(MPIJobWatch, KubernetesPodOperator):
    """Run ``python -m trainer --run-id RUN`` under Horovod as an MPIJob (kubeflow.org/v2beta1).

    :param training_run_id: the training run (default: ``<dag_id>/<dag run id>``, as plan_run names it)
    :param world_size: Horovod ranks = GPUs in total (templated)
    :param log_tail_lines: launcher log lines carried in a failure's error message

    Every Kubernetes setting of ``pgtrain.config.kubernetes.KubernetesSettings`` is an argument of its name (its
    field says its default and what it does): the ``job`` ones become ``job_settings`` (templated, like
    KubernetesPodOperator's own arguments), the ``pod`` and ``operator`` ones are KubernetesPodOperator's own
    arguments (``env`` is its ``env_vars``, checked: no pgtrain variable, nothing that looks like a secret), with
    pgtrain's defaults for ``startup_timeout_seconds`` (counted from the job's creation, or from when it left its
    queue if it was created suspended) and ``poll_interval`` (also the trigger's). A DAG's ``default_args`` for a
    job setting apply as to any argument.

    Every other keyword is KubernetesPodOperator's (env_vars, secrets, volumes, container_resources, affinity,
    kubernetes_conn_id, config_file, on_finish_action, on_kill_action, get_logs, ...); they apply to both replica
    templates.
    """

    BASE_CONTAINER_NAME = api.CONTAINER_NAME
    template_fields: Sequence[str] = (
        *KubernetesPodOperator.template_fields, "training_run_id", "world_size", "job_settings",
    )
    ui_color = "#c6dbef"

    def __init__(self, *, training_run_id: str | None = None, world_size: int | str | None = None,
                 log_tail_lines: int = 40, **kwargs: Any) -> None:
        if kwargs.pop("do_xcom_push", False):
            raise ConfigError("MPIJobOperator has no XCom sidecar: the trainer writes its results to PostgreSQL")
        # the settings given, as arguments or the DAG's default_args (which Airflow hands only to named arguments)
        defaults = kwargs.get("default_args") or {}
        given = {name: value for name, value in defaults.items() if name in kubernetes.SETTINGS}
        given.update((name, kwargs.pop(name)) for name in list(kwargs) if name in kubernetes.SETTINGS)
        problems = spec.author_problems(given)  # refused now, not once KubernetesPodOperator has built a pod
        if problems:
            raise ConfigError("invalid MPIJob settings: " + "; ".join(problems))
        # KubernetesPodOperator's own arguments: the pod's as given, the watch's with pgtrain's defaults
        kwargs.update((name, given[name]) for name in kubernetes.named("pod") if name in given)
        kwargs.update((name, value) for name, value in kubernetes.with_defaults(given, "operator").items()
                      if value is not None)
        _to_pod_operator_arguments(kwargs, kwargs.pop("env", None) or {})
        super().__init__(do_xcom_push=False, **kwargs)
        self.training_run_id = training_run_id
        self.world_size = world_size
        # The MPIJob's own settings beyond KubernetesPodOperator's pod (pgtrain.launch.mpijob.spec.MPIJobSettings).
        self.job_settings = kubernetes.with_defaults(given, "job")
        self.log_tail_lines = log_tail_lines
        self.job_name: str | None = None
        self.attempt: int | None = None  # the train attempt the trainer is told (set by before_submit)
        self.job_namespace: str | None = None
        self._deleted = False
        self._tail: collections.deque[str] = collections.deque(maxlen=log_tail_lines)

    # --- the manifest ---

    @staticmethod
    def _get_ti_pod_labels(context: Context | None = None, include_try_number: bool = True) -> dict[str, str]:
        labels = KubernetesPodOperator._get_ti_pod_labels(context, include_try_number=include_try_number)
        if labels.pop("kubernetes_pod_operator", None) is not None:
            labels["pgtrain_mpijob_operator"] = "True"
        return labels

    def build_mpijob(self, context: Context | None = None, *, dry_run: bool = False) -> dict[str, Any]:
        """KPO's pod for this task, turned into the MPIJob (validated) that runs the trainer."""
        if self.image is None:
            self.image = kubernetes.default("image")
        pod = PodGenerator.serialize_pod(self.build_pod_request_obj(context, dry_run=dry_run))
        if self.world_size in (None, ""):
            raise ConfigError("world_size is required: the number of Horovod ranks (GPUs)")
        job = {**self.job_settings, "gpus_per_worker": int(self.job_settings["gpus_per_worker"])}
        world_size = int(self.world_size)
        workers, _ = spec.layout(world_size, job["gpus_per_worker"])
        run_id = self._training_run_id(context)
        if context is not None:
            ti = context["ti"]
            name = spec.job_name(ti.dag_id, ti.task_id, context["run_id"], ti.map_index, ti.try_number,
                                   workers=workers)
        else:
            name = spec.job_name(self.dag_id, self.task_id, run_id,
                                   workers=workers)
        settings = spec.MPIJobSettings(
            run_id=run_id, world_size=world_size, image=self.image, name=name,
            namespace=pod["metadata"]["namespace"], **job,
            # TrainingRunMPIJobOperator.before_submit sets the run's attempt; a plain MPIJobOperator has no database
            # to begin one in (and dry_run never submits), so its trainer is told attempt 1.
            attempt=self.attempt if self.attempt is not None else 1,
        )
        return spec.build_mpijob(settings, pod)

    def _training_run_id(self, context: Context | None) -> str:
        if context is None and not self.training_run_id:
            return "<dag_id>/<run_id>"
        return train_run.run_id_of(self.training_run_id, context)

    def dry_run(self) -> None:
        """Print the MPIJob this task would create (without the task-instance labels)."""
        print(cli.render_yaml(self.build_mpijob(dry_run=True)))

    # --- Kubernetes access (all of it through MPIJobClient) ---

    @cached_property
    def jobs(self) -> MPIJobClient:
        return MPIJobClient(self.hook, self.job_namespace)

    def read_mpijob(self) -> dict[str, Any]:
        job = self.jobs.get(self.job_name)
        if job is None:
            raise TrainingFailed(
                f"MPIJob {self.job_namespace}/{self.job_name} no longer exists: it was deleted while "
                "the task watched it (by hand, or by its ttlSecondsAfterFinished)")
        return job

    def delete_mpijob(self, why: str) -> None:
        """Delete with foreground propagation: the MPIJob goes once its pods are gone."""
        if not self.job_name or self._deleted:
            return
        self.log.info("Deleting MPIJob %s/%s (%s).", self.job_namespace, self.job_name, why)
        self.jobs.delete(self.job_name, self.termination_grace_period)
        self._deleted = True

    def _mark_checked(self) -> None:
        try:
            self.jobs.label(self.job_name, {CHECKED_LABEL: "True"})
        except ApiException as exc:
            self.log.warning("Could not label MPIJob %s as checked: %s", self.job_name, exc.reason)

    # --- finding or creating the job ---

    def find_mpijob(self, context: Context) -> dict[str, Any] | None:
        """This task instance's MPIJob from an earlier, interrupted attempt, if it is worth re-attaching to.

        Running or succeeded: re-attach. Failed: labelled as checked (and deleted per
        on_finish_action), so a fresh job is submitted.
        """
        job = self._job_from_state_store(context)
        if job is None:
            selector = self._build_find_pod_label_selector(context, exclude_checked=True)
            items = [j for j in self.jobs.list(selector) if not watch.is_deleting(j)]
            if len(items) > 1:
                self.log.warning("Found %d MPIJobs for this task instance; using the newest.", len(items))
            job = max(items, key=lambda j: j["metadata"]["creationTimestamp"], default=None)
        if job is None:
            return None
        self.job_name = job["metadata"]["name"]
        state = watch.job_state(job)
        if state.phase == "Failed":
            self.log.info("MPIJob %s from an earlier attempt failed (%s); submitting a new one.",
                          self.job_name, state.reason)
            self._cleanup(state)
            self.job_name, self._deleted = None, False
            return None
        self.log.info("Re-attaching to MPIJob %s/%s (%s) from an earlier attempt instead of submitting "
                      "another.", self.job_namespace, self.job_name, state.phase)
        return job

    def _job_from_state_store(self, context: Context) -> dict[str, Any] | None:
        store = context.get("task_state_store")
        stored = store.get(STATE_STORE_KEY) if store is not None else None
        if not isinstance(stored, dict) or stored.get("namespace") != self.job_namespace:
            return None
        job = self.jobs.get(stored.get("name"))
        if job is None:
            return None
        labels = job["metadata"].get("labels") or {}
        return None if labels.get(CHECKED_LABEL) == "True" or watch.is_deleting(job) else job

    def before_submit(self, context: Context) -> None:
        """Called once right before a new MPIJob is created (not when re-attaching)."""

    def submit(self, context: Context, manifest: dict[str, Any]) -> dict[str, Any]:
        name = manifest["metadata"]["name"]
        self.log.info("Creating MPIJob %s/%s: %s workers x %s GPUs, image %s.", self.job_namespace, name,
                      manifest["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"],
                      manifest["spec"]["slotsPerWorker"], self.image)
        try:
            job = self.jobs.create(manifest)
        except ApiException as exc:
            if exc.status == 404:
                raise errors.mpi_operator_missing() from exc
            if exc.status == 409:
                raise TrainingFailed(
                    f"MPIJob {self.job_namespace}/{name} already exists but belongs to an attempt that "
                    "was already handled; delete it (kubectl delete mpijob) and retry") from exc
            if exc.status == 403:
                raise ConfigError(
                    f"not allowed to create MPIJobs in namespace {self.job_namespace}: grant the Airflow "
                    "worker's service account the Role in docs/kubernetes.md") from exc
            raise
        self.job_name = name
        return job

    # --- running ---

    def execute(self, context: Context) -> None:
        self.run_job(context)

    def run_job(self, context: Context) -> None:
        """Submit (or re-attach to) the job and watch it to its end, or defer the watch to the triggerer."""
        try:
            manifest = self.build_mpijob(context)
        except ConfigError as exc:  # retrying cannot fix a bad setting
            raise AirflowFailException(str(exc)) from exc
        self.job_namespace = manifest["metadata"]["namespace"]
        self._tail.clear()
        try:
            job = self.find_mpijob(context)
            if job is None:
                self.before_submit(context)
                manifest = self.build_mpijob(context)  # with what before_submit decided (the attempt)
                job = self.submit(context, manifest)
        except errors.MPIOperatorMissing as exc:  # retrying cannot install it
            raise AirflowFailException(str(exc)) from exc
        store = context.get("task_state_store")
        if store is not None:
            store.set(STATE_STORE_KEY, {"name": self.job_name, "namespace": self.job_namespace})
        ti = context["ti"]
        ti.xcom_push(key="mpijob_name", value=self.job_name)
        ti.xcom_push(key="mpijob_namespace", value=self.job_namespace)

        if self.deferrable:
            self._defer()
        verdict: watch.WatchVerdict | None = None
        try:
            verdict = self._wait()
            self._finish(verdict, context)
        finally:
            self._cleanup(verdict)

    def _cleanup(self, verdict: watch.WatchVerdict | None) -> None:
        if self._killed or self._deleted or not self.job_name:
            return
        finished = verdict is not None and verdict.outcome in ("succeeded", "failed")
        action = self.on_finish_action
        delete = (action == OnFinishAction.DELETE_POD
                  or (action == OnFinishAction.DELETE_SUCCEEDED_POD and verdict is not None
                      and verdict.outcome == "succeeded")
                  or (action == OnFinishAction.DELETE_ACTIVE_POD and not finished))
        try:
            if delete:
                self.delete_mpijob(f"on_finish_action={action.value}")
            elif finished:
                self.log.info("Keeping MPIJob %s/%s (on_finish_action=%s).", self.job_namespace, self.job_name,
                              action.value)
                self._mark_checked()
        except ApiException as exc:
            self.log.warning("Could not clean up MPIJob %s: %s", self.job_name, exc.reason)

    def on_kill(self) -> None:
        self._killed = True
        if self.on_kill_action == OnKillAction.KEEP_POD:
            self.log.info("Keeping MPIJob %s: on_kill_action=keep_pod.", self.job_name)
            return
        try:
            self.delete_mpijob("the task was killed")
        except ApiException:
            self.log.exception("Unable to delete MPIJob %s", self.job_name)

    # --- deferrable ---

    def _defer(self) -> None:
        self.convert_config_file_to_dict()
        extras = None
        if self.kubernetes_conn_id:
            try:
                extras = BaseHook.get_connection(self.kubernetes_conn_id).extra_dejson
            except AirflowNotFoundException:
                self.log.warning("Connection %s not found; the triggerer resolves it itself.",
                                 self.kubernetes_conn_id)
        trigger = self.make_trigger(
            name=self.job_name, namespace=self.job_namespace, kubernetes_conn_id=self.kubernetes_conn_id,
            connection_extras=extras, config_dict=self._config_dict, cluster_context=self.cluster_context,
            in_cluster=self.in_cluster, poll_interval=self.poll_interval,
            startup_timeout=self.startup_timeout_seconds, on_kill_action=self.on_kill_action.value,
        )
        self.defer(trigger=trigger, method_name="execute_complete")

    def make_trigger(self, **arguments: Any) -> MPIJobTrigger:
        """The trigger that watches the job while the task is deferred (built right before it defers)."""
        return MPIJobTrigger(**arguments)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> None:
        """Back from the trigger with its ``watch_step`` verdict: log the launcher's output, act on it, clean up."""
        self.job_name, self.job_namespace = event["name"], event["namespace"]
        self._tail.clear()
        if event["status"] == "error":
            if event.get("reason") == MISSING_OPERATOR:  # uninstalled while the job ran: retrying cannot help
                raise AirflowFailException(event.get("message"))
            raise TrainingFailed(f"watching MPIJob {self.job_namespace}/{self.job_name} failed: "
                                 f"{event.get('message')}")
        verdict = watch.WatchVerdict(event["status"], event.get("message") or "", event.get("reason") or "")
        try:
            if verdict.outcome in ("succeeded", "failed"):
                if self.jobs.get(self.job_name) is None:
                    if verdict.outcome == "succeeded":
                        self.log.warning("MPIJob %s succeeded but is already gone; its log cannot be shown.",
                                         self.job_name)
                        return
                    self.read_mpijob()  # raises: the failed job is gone
                launcher = self.jobs.launcher_pod(self.job_name)
                if self.get_logs and launcher is not None and container_started(launcher):
                    self._stream_launcher_log(launcher, follow=False)
            self._finish(verdict, context)
        finally:
            self._cleanup(verdict)
