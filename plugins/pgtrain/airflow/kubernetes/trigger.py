"""MPIJobTrigger: the deferrable MPIJobOperator's wait, run in the triggerer.

Polls the MPIJob and, until it runs, its pods (through ``AsyncMPIJobClient``), reading each look with
``pgtrain.launch.mpijob.watch.watch_step`` (the operator's own loop uses the same function), until it is
done: succeeded, failed, cannot start (a missing Secret, a bad image name: no point waiting) or timed out.
A suspended job (waiting in a Kueue queue) is waited for without a startup timeout.
The operator resumes in ``execute_complete``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from functools import cached_property
from typing import Any

from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook
from airflow.triggers.base import BaseTrigger, TriggerEvent
from kubernetes_asyncio.client.exceptions import ApiException

from pgtrain.airflow.kubernetes.client import AsyncMPIJobClient
from pgtrain.airflow.kubernetes.errors import MPIOperatorMissing
from pgtrain.launch.mpijob import watch

MISSING_OPERATOR = "mpi_operator_missing"  # an error event's reason: MPIJobs are no longer served
STOPPED = "stopped"  # an error event's reason: on_poll gave a reason to stop, and the MPIJob was deleted


class MPIJobTrigger(BaseTrigger):
    """Fires once: ``status`` is a WatchVerdict outcome (succeeded | failed | cannot_start | timeout) or error,
    with ``name``, ``namespace``, ``message`` and ``reason``.

    :param startup_timeout: seconds the job may take to run, counted from its creation or from when it left its
        queue (``watch.startup_clock``)
    :param startup_deadline: what a trigger serialized by an earlier pgtrain 0.1.0 carries instead (an absolute time):
        it still loads after an upgrade, its remaining time taken as the timeout
    """

    def __init__(
        self,
        *,
        name: str,
        namespace: str,
        startup_timeout: float | None = None,
        startup_deadline: float | None = None,
        kubernetes_conn_id: str | None = None,
        connection_extras: dict | None = None,
        config_dict: dict | None = None,
        cluster_context: str | None = None,
        in_cluster: bool | None = None,
        poll_interval: float = 10,
        on_kill_action: str = "delete_pod",
    ) -> None:
        super().__init__()
        self.name = name
        self.namespace = namespace
        if startup_timeout is None:
            if startup_deadline is None:
                raise TypeError("MPIJobTrigger needs startup_timeout")
            startup_timeout = max(1.0, startup_deadline - time.time())
        self.startup_timeout = startup_timeout
        self.kubernetes_conn_id = kubernetes_conn_id
        self.connection_extras = connection_extras
        self.config_dict = config_dict
        self.cluster_context = cluster_context
        self.in_cluster = in_cluster
        self.poll_interval = poll_interval
        self.on_kill_action = on_kill_action
        self._fired = False
        self.running_at: float | None = None  # time.monotonic() when first seen running (on_poll may read it)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "name": self.name, "namespace": self.namespace, "startup_timeout": self.startup_timeout,
            "kubernetes_conn_id": self.kubernetes_conn_id, "connection_extras": self.connection_extras,
            "config_dict": self.config_dict, "cluster_context": self.cluster_context,
            "in_cluster": self.in_cluster, "poll_interval": self.poll_interval,
            "on_kill_action": self.on_kill_action,
        })

    @cached_property
    def hook(self) -> AsyncKubernetesHook:
        return AsyncKubernetesHook(
            conn_id=self.kubernetes_conn_id, in_cluster=self.in_cluster, config_dict=self.config_dict,
            cluster_context=self.cluster_context, connection_extras=self.connection_extras,
        )

    def _event(self, status: str, message: str, **extra: Any) -> TriggerEvent:
        self._fired = True
        return TriggerEvent({"status": status, "name": self.name, "namespace": self.namespace,
                             "message": message, **extra})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        verdict = watch.WatchVerdict("waiting")
        try:
            while True:
                stop = await self.on_poll()
                async with self.hook.get_conn() as api_client:
                    jobs = AsyncMPIJobClient(api_client, self.namespace)
                    if stop is not None:
                        try:
                            await jobs.delete(self.name)
                        except ApiException as exc:
                            if exc.status != 404:
                                stop += (f" (deleting MPIJob {self.namespace}/{self.name} failed: Kubernetes API "
                                         f"error {exc.status}: {exc.reason}; delete it by hand)")
                        yield self._event("error", stop, reason=STOPPED)
                        return
                    job = await jobs.get(self.name)
                    if job is None:
                        yield self._event("error", "the MPIJob no longer exists: it was deleted while the task "
                                                   "watched it (by hand, or by its ttlSecondsAfterFinished)")
                        return
                    started = verdict.state.started
                    pods, events = ([], []) if started else await jobs.pods_and_events(self.name)
                previous, verdict = verdict, watch.watch_step(job, pods, time.time(), self.startup_timeout,
                                                              verdict.state, events)
                if verdict.outcome == "running" and self.running_at is None:
                    self.running_at = time.monotonic()
                if verdict.done:
                    yield self._event(verdict.outcome, verdict.message, reason=verdict.reason)
                    return
                news = watch.queue_news(job, previous, verdict)
                if news:
                    self.log.info("%s", news)
                await asyncio.sleep(self.poll_interval)
        except MPIOperatorMissing as exc:
            yield self._event("error", str(exc), reason=MISSING_OPERATOR)
        except ApiException as exc:
            yield self._event("error", f"Kubernetes API error {exc.status}: {exc.reason}")

    async def on_poll(self) -> str | None:
        """Called before each look at the job: a subclass renews what it holds while the job runs. A reason to stop
        (a text) deletes the MPIJob and fires an error event with it."""
        return None

    async def on_kill(self) -> None:
        """The deferred task was killed (Airflow 3.3+ calls this): delete the MPIJob like the operator's on_kill."""
        if self._fired or self.on_kill_action == "keep_pod":
            return
        async with self.hook.get_conn() as api_client:
            try:
                await AsyncMPIJobClient(api_client, self.namespace).delete(self.name)
            except ApiException:
                self.log.exception("Unable to delete MPIJob %s/%s", self.namespace, self.name)
