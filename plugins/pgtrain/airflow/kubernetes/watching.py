"""How MPIJobOperator watches its job to the end, synchronously: poll the job until ``watch_step`` says it is done
(logging when it enters or leaves a Kueue queue), follow the launcher's log into the task log, and act on the
verdict (success, a job that cannot start or started too late, a failure with the launcher's last lines).

A mixin of the operator (``pgtrain.airflow.kubernetes.operator``), which submits, re-attaches, defers and cleans
up; the deferrable path's trigger reads the job with the same ``watch_step``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from kubernetes.client import V1Pod
from kubernetes.client.exceptions import ApiException

from pgtrain.airflow.kubernetes import errors
from pgtrain.airflow.kubernetes.client import container_started
from pgtrain.launch.mpijob import watch

if TYPE_CHECKING:
    from airflow.sdk import Context


class MPIJobWatch:
    """The operator's synchronous watch (its attributes: ``jobs``, ``job_name``, ``job_namespace``,
    ``poll_interval``, ``startup_timeout_seconds``, ``get_logs``, ``pod_manager``, ``_tail``)."""

    def _wait(self) -> watch.WatchVerdict:
        """Poll the job until ``watch_step`` says it is done; follow each launcher pod's log while it runs."""
        verdict = watch.WatchVerdict("waiting")
        followed: set[str] = set()
        self.running_at: float | None = None  # time.monotonic() when first seen running (a stall guard reads it)
        while True:
            if self.watch_abandoned():
                return verdict
            job = self.read_mpijob()
            launcher = self.jobs.launcher_pod(self.job_name)
            state = verdict.state
            if launcher is not None and container_started(launcher):
                state = dataclasses.replace(state, started=True)
            pods = [] if state.started else self.jobs.pod_dicts(self.job_name)
            previous, verdict = verdict, watch.watch_step(job, pods, time.time(), self.startup_timeout_seconds,
                                                          state, self.jobs.pod_events(pods))
            news = watch.queue_news(job, previous, verdict)
            if news:
                self.log.info("%s", news)
            if verdict.outcome == "running" and self.running_at is None:
                self.running_at = time.monotonic()
            if verdict.done:
                if launcher is not None and self.get_logs and container_started(launcher) \
                        and launcher.metadata.name not in followed:  # it ran and ended between two looks
                    self._stream_launcher_log(launcher, follow=False)
                return verdict
            if verdict.outcome == "running" and launcher is not None and self.get_logs \
                    and container_started(launcher) and launcher.metadata.name not in followed:
                followed.add(launcher.metadata.name)
                self._stream_launcher_log(launcher, follow=True)
                continue  # the launcher ended: read the job's verdict right away
            time.sleep(self.poll_interval)

    def watch_abandoned(self) -> bool:
        """Whether to stop watching (a subclass: someone else watches the job now); ``_finish`` then says why."""
        return False

    def _finish(self, verdict: watch.WatchVerdict, context: Context) -> None:
        """Act on a finished watch: log success, or delete a job that cannot start and raise, or raise the failure."""
        if verdict.outcome == "succeeded":
            self.log.info("MPIJob %s/%s succeeded: %s", self.job_namespace, self.job_name, verdict.message)
            return
        if verdict.outcome in ("cannot_start", "timeout"):
            self.delete_mpijob("it did not start")
            if verdict.outcome == "cannot_start":
                raise errors.cannot_start(self.job_namespace, self.job_name, verdict.message,
                                            self.job_settings["database_secret"],
                                            self.job_settings["database_secret_key"])
            raise errors.not_started(self.job_namespace, self.job_name, self.startup_timeout_seconds, verdict)
        self._raise_if_failed(verdict, context)

    def _stream_launcher_log(self, pod: V1Pod, *, follow: bool) -> None:
        try:
            self.pod_manager.fetch_container_logs(
                pod=pod, container_name=self.base_container_name, follow=follow,
                container_name_log_prefix_enabled=False, log_formatter=self._tee_log_line)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.log.warning("Launcher pod %s disappeared while its log was read.", pod.metadata.name)

    def _tee_log_line(self, container_name: str, message: str) -> str:
        self._tail.extend(message.splitlines() or [""])
        if self.log_formatter is not None:
            return self.log_formatter(container_name, message)
        return f"[launcher] {message}"

    def trainer_verdict(self, context: Context) -> tuple[str, str] | None:
        """(status, reason) the trainer recorded for its run when it stopped ('refused' or 'failed'), if known.

        The trainer records it in its database; this operator cannot read it (TrainingRunMPIJobOperator does).
        """
        return None

    def _raise_if_failed(self, verdict: watch.WatchVerdict, context: Context) -> None:
        exit_status = ""
        launcher = self.jobs.launcher_pod(self.job_name) if self.job_name else None
        for status in (launcher.status.container_statuses or []) if launcher and launcher.status else []:
            terminated = status.state.terminated if status.state else None
            if terminated is not None:
                exit_status = f"\nlauncher container exited with code {terminated.exit_code} ({terminated.reason})"
        raise errors.job_failed(self.job_namespace, self.job_name, verdict, self.trainer_verdict(context),
                                  exit_status, list(self._tail))

