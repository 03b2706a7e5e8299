"""Reading an MPIJob's state: what one look at the job, its pods and their events means. The operator's own
loop and its deferrable trigger share ``watch_step``."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pgtrain.launch.mpijob.api import (
    DATABASE_VOLUME,
    QUEUE_NAME_LABEL,
)

# The MPI Operator's condition while ``runPolicy.suspend`` is true (pkg/apis/kubeflow/v2beta1: JobSuspended):
# True with reason MPIJobSuspended, then False with reason MPIJobResumed once the job is let go. Kueue suspends a
# job while it waits in its queue and unsuspends it on admission.
SUSPENDED = "Suspended"
RESUMED_REASON = "MPIJobResumed"


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


def _condition(job: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    return next((c for c in (job.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


def _timestamp(stamp: str | None) -> float | None:
    """An API timestamp (RFC 3339, ``...Z``) as seconds since the epoch."""
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp else None


def is_suspended(job: Mapping[str, Any]) -> bool:
    """The job waits in a queue: ``runPolicy.suspend`` is set (Kueue sets it until it admits the job), or the MPI
    Operator has not yet seen the job let go (its Suspended condition is still True): no pods exist meanwhile."""
    suspended = _condition(job, SUSPENDED)
    return (bool(((job.get("spec") or {}).get("runPolicy") or {}).get("suspend"))
            or (suspended is not None and suspended.get("status") == "True"))


def queue_name(job: Mapping[str, Any]) -> str | None:
    """The Kueue queue the job waits in (its ``kueue.x-k8s.io/queue-name`` label), if it names one."""
    return ((job.get("metadata") or {}).get("labels") or {}).get(QUEUE_NAME_LABEL)


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


def pods_to_explain(pods: Sequence[Mapping[str, Any]]) -> list[str]:
    """The pods whose events may say why they do not start: scheduled but still creating their container (a
    missing Secret volume shows only in a FailedMount event). A running or unscheduled pod's status says it all."""
    names = []
    for pod in pods:
        status = pod.get("status") or {}
        if (status.get("phase") or "Pending") != "Pending" or not (pod.get("spec") or {}).get("nodeName"):
            continue
        for cs in status.get("containerStatuses") or [{}]:
            if ((cs.get("state") or {}).get("waiting") or {}).get("reason", "ContainerCreating") == "ContainerCreating":
                names.append(pod["metadata"]["name"])
                break
    return sorted(names)


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
class WatchState:
    """What the watcher remembers between looks at a job."""

    started: bool = False  # seen running: a job that started is never timed out for startup
    queued: bool = False  # seen suspended (waiting in a queue)
    resumed_at: float | None = None  # when it was first seen let go after that (if the job's conditions don't say)
    looked: bool = False  # looked at while it starts (the log says once how the startup timeout counts)


@dataclass(frozen=True)
class WatchVerdict:
    """What one look at an MPIJob and its pods says. ``outcome``: queued (suspended, waiting in a queue: no
    startup timeout applies), waiting (not started, still within the startup timeout), running, succeeded,
    failed, cannot_start (a pod can never start: no point waiting) or timeout (not started in time; ``reason``
    is MPIJobResumed when the job had waited in a queue). ``state``: what the next look starts from."""

    outcome: str
    message: str = ""
    reason: str = ""
    state: WatchState = field(default_factory=WatchState, compare=False)

    @property
    def done(self) -> bool:
        return self.outcome not in ("queued", "waiting", "running")


def startup_clock(job: Mapping[str, Any], state: WatchState, pods: Sequence[Mapping[str, Any]] = (),
                  events: Sequence[Mapping[str, Any]] = ()) -> float:
    """When the startup timeout began counting: the last sign of progress. The job's creation or, for a job that
    waited in a queue, when it was let go (the Suspended condition's turn to False, or when the watcher first saw it
    unsuspended); then each pod's creation and each change of its conditions (scheduled to a node, initialized,
    ready: WaitForWorkersReady creates the launcher only once the workers are ready), and each image a kubelet
    finished pulling (``Pulled`` events). A cold node pulling a large image, or pods made one after the other,
    therefore never run out the clock while they get on."""
    suspended = _condition(job, SUSPENDED)
    resumed = _timestamp(suspended.get("lastTransitionTime")) if suspended and suspended.get("status") == "False" \
        else None
    created = _timestamp((job.get("metadata") or {}).get("creationTimestamp"))
    signs = [created, resumed, state.resumed_at, 0.0]
    for pod in pods:
        signs.append(_timestamp((pod.get("metadata") or {}).get("creationTimestamp")))
        signs += [_timestamp(c.get("lastTransitionTime")) for c in (pod.get("status") or {}).get("conditions") or []
                  if c.get("status") == "True"]
    signs += [_timestamp(e.get("lastTimestamp") or e.get("eventTime")) for e in events if e.get("reason") == "Pulled"]
    return max(t for t in signs if t is not None)


def pulling(pods: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]]) -> list[str]:
    """The pods whose kubelet is pulling an image now: more ``Pulling`` events than ``Pulled`` or ``Failed`` ones
    while their containers are still being created (a pull in back-off waits in ErrImagePull or ImagePullBackOff
    instead, and is no progress)."""
    creating = set(pods_to_explain(pods))
    counts: dict[str, int] = {}
    for event in events:
        name = (event.get("involvedObject") or {}).get("name")
        step = {"Pulling": 1, "Pulled": -1, "Failed": -1}.get(event.get("reason") or "", 0)
        if name in creating and step:
            counts[name] = counts.get(name, 0) + step * int(event.get("count") or 1)
    return sorted(name for name, pulls in counts.items() if pulls > 0)


def watch_step(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], now: float, startup_timeout: float,
               state: WatchState = WatchState(), events: Sequence[Mapping[str, Any]] = ()) -> WatchVerdict:
    """One step of watching a job (API-form job, pods and their events), the same for the operator's loop
    and its trigger. ``state``: the previous verdict's (a fresh one on the first look).

    A suspended job waits in a queue (Kueue): its startup timeout counts from when it is let go, never from its
    creation; how long it may queue is bounded only by the task's ``execution_timeout``. Then it counts from the
    last sign of progress of the job's pods (``startup_clock``), and not at all while an image is being pulled.
    """
    phase = job_state(job)
    if phase.finished:
        return WatchVerdict("succeeded" if phase.phase == "Succeeded" else "failed", phase.message, phase.reason)
    suspended = _condition(job, SUSPENDED) or {}
    if is_suspended(job):
        return WatchVerdict("queued", suspended.get("message") or "runPolicy.suspend is true",
                            suspended.get("reason") or "", WatchState(queued=True))
    if state.queued:  # let go since the last look
        state = replace(state, queued=False, resumed_at=now)
    if state.started or phase.phase == "Running":
        return WatchVerdict("running", phase.message, phase.reason, replace(state, started=True))
    state = replace(state, looked=True)
    fatal = fatal_start_problem(pods, events)
    if fatal is not None:
        return WatchVerdict("cannot_start", fatal, state=state)
    if not pulling(pods, events) and now >= startup_clock(job, state, pods, events) + startup_timeout:
        was_queued = state.resumed_at is not None or suspended.get("status") == "False"
        return WatchVerdict("timeout", "; ".join(startup_problems(pods)), RESUMED_REASON if was_queued else "",
                            state)
    return WatchVerdict("waiting", state=state)


STARTUP_CLOCK_NOTE = ("the startup timeout counts from the last sign of progress (the job's creation or admission, a "
                      "pod created, scheduled or ready, an image pulled) and stands still while an image is pulled")


def queue_news(job: Mapping[str, Any], previous: WatchVerdict, verdict: WatchVerdict) -> str | None:
    """A line for the task log when the job enters or leaves its queue (not on every look while it waits)."""
    meta = job.get("metadata") or {}
    name = f"MPIJob {meta.get('namespace')}/{meta.get('name')}"
    if verdict.outcome == "queued" and previous.outcome != "queued":
        queue = queue_name(job)
        where = f"in Kueue queue {queue!r}" if queue else "in a queue"
        said = f" ({verdict.reason}: {verdict.message})" if verdict.reason else ""
        return (f"{name} is suspended, waiting {where}{said}; the startup timeout counts from when it is "
                "admitted.")
    if previous.outcome == "queued" and verdict.outcome != "queued":
        return f"{name} left its queue; the startup timeout counts from now."
    if not previous.state.looked and verdict.state.looked and verdict.outcome == "waiting":
        return f"{name} is starting; {STARTUP_CLOCK_NOTE}."
    return None
