"""Watching an MPIJob in a queued cluster (Kueue), which pods' events are read, and what a 404 means: pure
functions driven with explicit ``now`` values (seconds since the epoch; the jobs below were created at 0)."""

from __future__ import annotations

import json

import pytest

from pgtrain.airflow.kubernetes import errors
from pgtrain.airflow.kubernetes.client import events_of, names_an_object
from pgtrain.launch.mpijob import api, watch

CREATED = "1970-01-01T00:00:00Z"


def stamp(seconds: int) -> str:
    return f"1970-01-01T{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}Z"


def job(*, suspend: bool | None = None, suspended: tuple[str, int] | None = None, running: bool = False,
        queue: str | None = "gpu-queue") -> dict:
    """An MPIJob as the MPI Operator reports it; ``suspended``: the Suspended condition's status and when it
    last changed."""
    conditions = [{"type": "Created", "status": "True", "reason": "MPIJobCreated", "lastTransitionTime": CREATED}]
    if suspended is not None:
        status, at = suspended
        reason, message = ("MPIJobSuspended", "MPIJob suspended") if status == "True" else ("MPIJobResumed",
                                                                                           "MPIJob resumed")
        conditions.append({"type": "Suspended", "status": status, "reason": reason, "message": message,
                           "lastTransitionTime": stamp(at)})
    if running:
        conditions.append({"type": "Running", "status": "True", "reason": "MPIJobRunning", "message": "running"})
    labels = {api.QUEUE_NAME_LABEL: queue} if queue else {}
    return {"metadata": {"namespace": "ml", "name": "train-1", "creationTimestamp": CREATED, "labels": labels},
            "spec": {"runPolicy": {} if suspend is None else {"suspend": suspend}},
            "status": {"conditions": conditions}}


def looks(*steps: tuple[dict, float], timeout: float = 60) -> list[watch.WatchVerdict]:
    """Successive looks of one watcher (each starts from the previous verdict's state)."""
    verdicts, state = [], watch.WatchState()
    for observed, now in steps:
        verdict = watch.watch_step(observed, [], now, timeout, state)
        verdicts.append(verdict)
        state = verdict.state
    return verdicts


def test_a_suspended_job_waits_in_its_queue_past_the_startup_timeout():
    queued = job(suspend=True, suspended=("True", 1))
    verdicts = looks((queued, 10), (queued, 600), (queued, 86_400))
    assert [v.outcome for v in verdicts] == ["queued"] * 3
    assert not any(v.done for v in verdicts)
    assert verdicts[0].reason == "MPIJobSuspended"


def test_the_startup_timeout_counts_from_the_resume_the_condition_records():
    resumed = job(suspend=False, suspended=("False", 900))  # admitted 900 s after its creation
    assert watch.startup_clock(resumed, watch.WatchState()) == 900
    assert looks((resumed, 950))[0].outcome == "waiting"  # 950 s old, but only 50 s out of its queue
    timeout = looks((resumed, 960))[0]
    assert (timeout.outcome, timeout.reason) == ("timeout", watch.RESUMED_REASON)


def test_without_a_resume_time_the_clock_starts_when_the_watcher_first_sees_it_unsuspended():
    # Kueue let it go, the MPI Operator has not reported it yet (no condition): the watcher's own sighting counts
    verdicts = looks((job(suspend=True), 30), (job(suspend=False), 700), (job(suspend=False), 759),
                     (job(suspend=False), 760))
    assert [v.outcome for v in verdicts] == ["queued", "waiting", "waiting", "timeout"]
    assert verdicts[1].state.resumed_at == 700 and verdicts[3].reason == watch.RESUMED_REASON


def test_the_job_is_queued_until_the_mpi_operator_has_seen_the_resume():
    # spec unsuspended, condition still True: no pods yet, not late
    lagging = job(suspend=False, suspended=("True", 1))
    assert looks((lagging, 5000))[0].outcome == "queued"


def test_a_job_never_queued_still_times_out_from_its_creation():
    verdicts = looks((job(queue=None), 59), (job(queue=None), 60))
    assert [v.outcome for v in verdicts] == ["waiting", "timeout"] and verdicts[1].reason == ""


def test_a_started_job_suspended_again_is_queued_and_restarts_its_clock():
    verdicts = looks((job(running=True), 10), (job(suspend=True, suspended=("True", 20)), 20),
                     (job(suspend=False, suspended=("False", 500)), 520))
    assert [v.outcome for v in verdicts] == ["running", "queued", "waiting"]
    assert not verdicts[2].state.started


def test_the_queue_is_logged_when_entered_and_left_not_on_every_look():
    queued = job(suspend=True, suspended=("True", 1))
    resumed = job(suspend=False, suspended=("False", 100))
    steps = [(queued, 1), (queued, 2), (queued, 3), (resumed, 101), (resumed, 102)]
    verdicts = looks(*steps)
    previous = [watch.WatchVerdict("waiting"), *verdicts[:-1]]
    news = [watch.queue_news(observed, before, now)
            for (observed, _), before, now in zip(steps, previous, verdicts, strict=True)]
    assert news[0] == ("MPIJob ml/train-1 is suspended, waiting in Kueue queue 'gpu-queue' (MPIJobSuspended: "
                       "MPIJob suspended); the startup timeout counts from when it is admitted.")
    assert news[1:3] == [None, None] and news[4] is None
    assert news[3] == "MPIJob ml/train-1 left its queue; the startup timeout counts from now."


def test_the_timeout_of_a_job_that_was_queued_does_not_blame_a_missing_mpi_operator():
    resumed = errors.not_started("ml", "train-1", 60, watch.WatchVerdict("timeout", "", watch.RESUMED_REASON))
    never_queued = errors.not_started("ml", "train-1", 60, watch.WatchVerdict("timeout", ""))
    assert "is the MPI Operator" not in str(resumed)
    assert "counted from when it left its queue" in str(resumed) and "no pods were created" in str(resumed)
    assert "is the MPI Operator v0.6.0 running" in str(never_queued)


def _pod(name: str, phase: str = "Pending", node: str | None = "node-1", waiting: str | None = "ContainerCreating"):
    status: dict = {"phase": phase}
    if waiting:
        status["containerStatuses"] = [{"state": {"waiting": {"reason": waiting}}}]
    return {"metadata": {"name": name}, "spec": {"nodeName": node} if node else {}, "status": status}


def test_events_are_read_only_for_pods_scheduled_but_not_yet_created():
    pods = [_pod("j-worker-1"), _pod("j-worker-0"), _pod("j-launcher", phase="Running", waiting=None),
            _pod("j-worker-2", node=None, waiting=None), _pod("j-worker-3", waiting="ImagePullBackOff")]
    assert watch.pods_to_explain(pods) == ["j-worker-0", "j-worker-1"]
    assert watch.pods_to_explain([_pod("j-launcher", phase="Running", waiting=None)]) == []
    assert events_of("j-worker-0") == "involvedObject.kind=Pod,involvedObject.name=j-worker-0"


def test_a_404_naming_an_object_is_a_gone_job_one_naming_none_a_missing_crd():
    gone = {"kind": "Status", "code": 404, "reason": "NotFound", "message": 'mpijobs.kubeflow.org "j" not found',
            "details": {"name": "j", "group": "kubeflow.org", "kind": "mpijobs"}}
    no_crd = {"kind": "Status", "code": 404, "reason": "NotFound",
              "message": "the server could not find the requested resource", "details": {}}
    assert names_an_object(json.dumps(gone)) and names_an_object(json.dumps(gone).encode())
    assert not names_an_object(json.dumps(no_crd))
    assert not names_an_object("404 page not found")  # not JSON at all: no object named either
    message = str(errors.mpi_operator_missing())
    assert f"install the MPI Operator {api.MPI_OPERATOR_VERSION}" in message
    assert f"kubeflow/mpi-operator/{api.MPI_OPERATOR_VERSION}/deploy/v2beta1/mpi-operator.yaml" in message


def test_a_trigger_serialized_before_the_queue_aware_watch_still_loads():
    """Triggers of deferred tasks survive an upgrade: the old kwargs (an absolute startup_deadline) load, the
    remaining time becoming the timeout; new triggers serialize startup_timeout."""
    import time

    from pgtrain.airflow.kubernetes.trigger import MPIJobTrigger

    old = MPIJobTrigger(name="job", namespace="ml", startup_deadline=time.time() + 300)
    assert 290 < old.startup_timeout <= 300
    assert MPIJobTrigger(name="job", namespace="ml", startup_deadline=time.time() - 5).startup_timeout == 1.0
    _, kwargs = MPIJobTrigger(name="job", namespace="ml", startup_timeout=600).serialize()
    assert kwargs["startup_timeout"] == 600 and "startup_deadline" not in kwargs
    with pytest.raises(TypeError, match="needs startup_timeout"):
        MPIJobTrigger(name="job", namespace="ml")


def _event(pod: str, reason: str, at: int, count: int = 1) -> dict:
    return {"involvedObject": {"kind": "Pod", "name": pod}, "reason": reason, "count": count,
            "lastTimestamp": stamp(at)}


def _scheduled(name: str, at: int, waiting: str = "ContainerCreating") -> dict:
    pod = _pod(name, waiting=waiting)
    pod["metadata"]["creationTimestamp"] = CREATED
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp(at)}]
    return pod


def test_the_startup_timeout_stands_still_while_an_image_is_pulled():
    pods = [_scheduled("j-worker-0", 5)]
    pulling = [_event("j-worker-0", "Pulling", 6)]
    verdict = watch.watch_step(job(queue=None), pods, 3600, 60, watch.WatchState(), pulling)
    assert verdict.outcome == "waiting"  # an hour after its creation: the cold node is still pulling
    assert watch.pulling(pods, pulling) == ["j-worker-0"]
    pulled = [*pulling, _event("j-worker-0", "Pulled", 3000)]
    assert watch.startup_clock(job(queue=None), watch.WatchState(), pods, pulled) == 3000  # counts from the pull
    assert watch.watch_step(job(queue=None), pods, 3059, 60, watch.WatchState(), pulled).outcome == "waiting"
    assert watch.watch_step(job(queue=None), pods, 3060, 60, watch.WatchState(), pulled).outcome == "timeout"


def test_the_startup_timeout_counts_from_the_pods_last_sign_of_progress():
    # workers scheduled at 500 (they waited for a node), the launcher created at 900 once they were ready
    launcher = _scheduled("j-launcher", 900)
    launcher["metadata"]["creationTimestamp"] = stamp(900)
    pods = [_scheduled("j-worker-0", 500, waiting=None), launcher]
    assert watch.startup_clock(job(queue=None), watch.WatchState(), pods) == 900
    assert watch.watch_step(job(queue=None), pods, 959, 60).outcome == "waiting"
    assert watch.watch_step(job(queue=None), pods, 960, 60).outcome == "timeout"


def test_a_pull_in_back_off_is_no_progress():
    pods = [_scheduled("j-worker-0", 5, waiting="ImagePullBackOff")]
    backing_off = [_event("j-worker-0", "Pulling", 50, count=4), _event("j-worker-0", "Failed", 51, count=4)]
    assert watch.pulling(pods, backing_off) == []
    verdict = watch.watch_step(job(queue=None), pods, 65, 60, watch.WatchState(), backing_off)
    assert verdict.outcome == "timeout" and "ImagePullBackOff" in verdict.message


def test_how_the_startup_timeout_counts_is_logged_once():
    steps = [(job(queue=None), 1), (job(queue=None), 2), (job(queue=None, running=True), 3)]
    verdicts = looks(*steps)
    previous = [watch.WatchVerdict("waiting"), *verdicts[:-1]]
    news = [watch.queue_news(observed, before, now)
            for (observed, _), before, now in zip(steps, previous, verdicts, strict=True)]
    assert news[0] == (f"MPIJob ml/train-1 is starting; {watch.STARTUP_CLOCK_NOTE}.")
    assert "counts from the last sign of progress" in news[0] and news[1:] == [None, None]


def test_the_deferred_watch_keeps_the_run_s_stall_timeout_across_a_triggerer_restart():
    from pgtrain.airflow.kubernetes.training_trigger import TrainingRunMPIJobTrigger

    claim = {"name": "model:m", "token": 3, "ttl": 60, "training_run": "dag/run"}
    trigger = TrainingRunMPIJobTrigger(name="job", namespace="ml", startup_timeout=600, claim=claim,
                                       stall_timeout=900, training_run_id="dag/run")
    _, kwargs = trigger.serialize()
    assert kwargs["stall_timeout"] == 900 and kwargs["training_run_id"] == "dag/run"
    assert TrainingRunMPIJobTrigger(**kwargs).stall_timeout == 900
