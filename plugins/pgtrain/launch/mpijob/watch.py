"""Reading an MPIJob's state: what one look at the job, its pods and their events means. The operator's own
loop and its deferrable trigger share ``watch_step``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pgtrain.launch.mpijob.api import (
    DATABASE_VOLUME,
)


@dataclass(frozen=True)
class JobState:
    phase: str  # Pending, Running, Succeeded, Failed
    reason: str = ""
    message: str = ""

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


def job_state(job: Mapping[str, Any]) -> JobState:
    """The MPIJob's phase from its conditions (the last true one of Succeeded/Failed/Running wins)."""
    conditions = {c.get("type"): c for c in (job.get("status") or {}).get("conditions") or []
                  if c.get("status") == "True"}
    for phase in ("Failed", "Succeeded", "Running"):
        if phase in conditions:
            cond = conditions[phase]
            return JobState(phase, cond.get("reason") or "", cond.get("message") or "")
    return JobState("Pending")


def is_deleting(job: Mapping[str, Any]) -> bool:
    return bool((job.get("metadata") or {}).get("deletionTimestamp"))


def startup_problems(pods: Sequence[Mapping[str, Any]]) -> list[str]:
    """Why the job's pods are not running yet, one line per pod that is stuck (API-form pods)."""
    lines = []
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        status = pod.get("status") or {}
        phase = status.get("phase") or "Pending"
        if phase != "Pending":
            continue
        why = [f"{c.get('reason')}: {c.get('message')}" for c in status.get("conditions") or []
               if c.get("type") == "PodScheduled" and c.get("status") == "False"]
        for cs in status.get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting")
            if waiting and waiting.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
                why.append(f"{waiting.get('reason')}: {waiting.get('message') or ''}".rstrip(": "))
        lines.append(f"{pod['metadata']['name']} Pending" + (f" ({'; '.join(why)})" if why else ""))
    return lines


def fatal_start_problem(pods: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]] = ()) -> str | None:
    """A container that can never start (no Secret, bad image name): no point waiting for the timeout.

    ``events``: the pods' API-form events; a missing Secret shows there only (FailedMount), while the pod
    waits in ContainerCreating.
    """
    for pod in pods:
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in ("CreateContainerConfigError", "InvalidImageName", "ErrImageNeverPull"):
                return f"{pod['metadata']['name']}: {waiting['reason']}: {waiting.get('message') or ''}"
    names = {pod["metadata"]["name"] for pod in pods}
    for event in events:
        message = event.get("message") or ""
        if (event.get("reason") == "FailedMount" and (event.get("involvedObject") or {}).get("name") in names
                and f'"{DATABASE_VOLUME}"' in message and ("not found" in message or "non-existent" in message)):
            return f"{event['involvedObject']['name']}: FailedMount: {message}"
    return None


@dataclass(frozen=True)
class WatchVerdict:
    """What one look at an MPIJob and its pods says. ``outcome``: waiting (not started, still within the
    startup timeout), running, succeeded, failed, cannot_start (a pod can never start: no point waiting)
    or timeout (not started in time)."""

    outcome: str
    message: str = ""
    reason: str = ""

    @property
    def done(self) -> bool:
        return self.outcome not in ("waiting", "running")


def watch_step(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], now: float, startup_deadline: float,
               started: bool = False, events: Sequence[Mapping[str, Any]] = ()) -> WatchVerdict:
    """One step of watching a job (API-form job, pods and their events), the same for the operator's loop
    and its trigger.

    ``started``: the job was seen running before (a job that started is never timed out for startup).
    """
    state = job_state(job)
    if state.finished:
        return WatchVerdict("succeeded" if state.phase == "Succeeded" else "failed", state.message, state.reason)
    if started or state.phase == "Running":
        return WatchVerdict("running", state.message, state.reason)
    fatal = fatal_start_problem(pods, events)
    if fatal is not None:
        return WatchVerdict("cannot_start", fatal)
    if now >= startup_deadline:
        return WatchVerdict("timeout", "; ".join(startup_problems(pods)))
    return WatchVerdict("waiting")
