"""How the MPIJob operator and its trigger watch a job on the simulated cluster (a test double): a job waiting in a
Kueue queue (created suspended) is not timed out, a cluster without the MPI Operator fails the task for good, and
events are read only for pods that wait to be created.

No outcome hinges on timing luck: the queued job is admitted only after the watcher has looked at it later than its
startup timeout allows (the cluster's history of API reads says when), and the startup timeout then leaves the
simulated pods many times the second they take to start.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib
import os
import signal
import threading
from pathlib import Path

import psycopg
import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from pgtrain.airflow.kubernetes.errors import MPIJobStalled, MPIJobStartupTimeout
from pgtrain.airflow.kubernetes.operator import MPIJobOperator
from pgtrain.airflow.kubernetes.train import MPIJobTrainOperator
from pgtrain.launch.mpijob import api
from pgtrain.runs import record
from tests.integration.k8s.test_operator import DAG_ID, IMAGE, plan, staged
from tests.k8s_sim import SimulatedCluster
from tests.k8s_sim.airflow_context import FakeTaskStateStore, first_event, task_context
from tests.k8s_sim.validation import assert_cluster_accepted_every_manifest
from tests.support import planned_run, seed_samples

pytestmark = pytest.mark.horovod
STARTUP_TIMEOUT = 6
PULL_TIMEOUT = 8  # the sim stamps whole seconds: a launcher must have a few seconds to start on a busy machine
STALL_TIMEOUT = 10
QUEUE = {api.QUEUE_NAME_LABEL: "gpu-queue"}
EVENTS_OF_A_POD = "involvedObject.kind=Pod,involvedObject.name="


def _seconds(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _queued_job(k8s, ns: str) -> dict:
    def suspended():
        jobs = k8s.mpijobs(ns)
        conditions = jobs[0].get("status", {}).get("conditions", []) if jobs else []
        return jobs[0] if any(c["type"] == "Suspended" and c["status"] == "True" for c in conditions) else None

    return k8s.wait_for(suspended, 60, "the MPIJob to be created suspended")


def _admit_once_watched_past_the_timeout(k8s, ns: str, job: dict) -> None:
    """Admit the job (as Kueue would) once the watcher has read it later than the startup timeout after its
    creation; it must still exist and have no pods then."""
    name = job["metadata"]["name"]
    late = _seconds(job["metadata"]["creationTimestamp"]) + STARTUP_TIMEOUT + 1  # creationTimestamp has seconds

    def looked_late():
        return [h for h in k8s.history(ns, verb="get", resource="mpijobs", name=name) if _seconds(h["time"]) > late]

    k8s.wait_for(looked_late, 60, "the watcher to read the queued job past its startup timeout")
    assert not k8s.history(ns, verb="delete", resource="mpijobs")  # not timed out: it waits in its queue
    assert k8s.mpijobs(ns) and not k8s.pods(ns)
    assert not k8s.history(ns, verb="list", resource="events")  # no pods: no events to read
    k8s.admit(ns, name)


def _running_since(k8s, ns: str) -> float:
    (running,) = k8s.history(ns, verb="status", resource="mpijobs", condition="Running")
    return _seconds(running["time"])


def _assert_no_reads_of_pods_or_events_once_running(k8s, ns: str, name: str) -> None:
    """The second look at the job after it ran knew it was running: from then on neither pods nor events are
    listed (the first may still have listed the pods that look was about)."""
    later = [h for h in k8s.history(ns, verb="get", resource="mpijobs", name=name)
             if _seconds(h["time"]) > _running_since(k8s, ns)]
    assert len(later) >= 2, "the job ran for less than two polls"
    second = _seconds(later[1]["time"])
    assert not [h for h in k8s.history(ns, verb="list", resource="events") if _seconds(h["time"]) > second]
    assert not [h for h in k8s.history(ns, verb="list", resource="pods")
                if _seconds(h["time"]) > second and "job-role=launcher" not in h.get("labelSelector", "")]


def test_a_queued_job_outwaits_its_startup_timeout_and_runs_once_admitted(k8s, namespace, db_url, capfd):
    k8s.queue_jobs(namespace)
    run_id = plan(db_url, "queued", epochs=4)
    operator = MPIJobTrainOperator(task_id="train", namespace=namespace, image=IMAGE, training_run_id=run_id,
                                   startup_timeout_seconds=STARTUP_TIMEOUT, poll_interval=0.3, labels=QUEUE)
    failures: list[BaseException] = []

    def run() -> None:
        try:
            operator.execute(task_context(DAG_ID, "queued"))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            failures.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    job = _queued_job(k8s, namespace)
    _admit_once_watched_past_the_timeout(k8s, namespace, job)
    worker.join(180)
    task_log = "".join(capfd.readouterr())

    assert not worker.is_alive() and not failures, failures
    assert staged(db_url, run_id) > 0  # it trained
    queued = f"MPIJob {namespace}/{job['metadata']['name']} is suspended, waiting in Kueue queue 'gpu-queue'"
    assert task_log.count(queued) == 1  # logged once, not on each of the many polls
    assert task_log.count("left its queue") == 1
    assert task_log.index("left its queue") < task_log.index("[launcher]")  # said when it happened
    assert len(k8s.history(namespace, verb="create", resource="mpijobs")) == 1
    assert_cluster_accepted_every_manifest(k8s, namespace)


def test_a_queued_job_outwaits_its_startup_timeout_in_the_trigger_too(k8s, namespace, db_url, capfd):
    k8s.queue_jobs(namespace)
    run_id = plan(db_url, "queued-deferred", epochs=4)

    def operator() -> MPIJobTrainOperator:
        return MPIJobTrainOperator(task_id="train", namespace=namespace, image=IMAGE, training_run_id=run_id,
                                   startup_timeout_seconds=STARTUP_TIMEOUT, poll_interval=0.3, labels=QUEUE,
                                   deferrable=True)

    context = task_context(DAG_ID, "queued-deferred", state_store=FakeTaskStateStore())
    with pytest.raises(TaskDeferred) as deferred:
        operator().execute(context)
    classpath, kwargs = deferred.value.trigger.serialize()  # as the triggerer rebuilds it
    assert kwargs["startup_timeout"] == STARTUP_TIMEOUT and kwargs["poll_interval"] == 0.3
    module, _, name = classpath.rpartition(".")
    trigger = getattr(importlib.import_module(module), name)(**kwargs)

    admitted: list[BaseException] = []

    def admit() -> None:
        try:
            _admit_once_watched_past_the_timeout(k8s, namespace, _queued_job(k8s, namespace))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            admitted.append(exc)

    admitter = threading.Thread(target=admit, daemon=True)
    admitter.start()
    event = first_event(trigger, 180)
    admitter.join(10)
    assert not admitted, admitted
    assert event["status"] == "succeeded", event
    _assert_no_reads_of_pods_or_events_once_running(k8s, namespace, trigger.name)
    assert "is suspended, waiting in Kueue queue 'gpu-queue'" in "".join(capfd.readouterr())

    operator().execute_complete(context, event)
    assert staged(db_url, run_id) > 0
    k8s.wait_for(lambda: not k8s.mpijobs(namespace), 10, "the job to be deleted")


def test_a_sync_watch_lists_no_events_once_the_job_runs(k8s, namespace, db_url):
    run_id = plan(db_url, "quiet-poll", epochs=4)
    operator = MPIJobTrainOperator(task_id="train", namespace=namespace, image=IMAGE, training_run_id=run_id,
                                   startup_timeout_seconds=60, poll_interval=0.3, get_logs=False)
    operator.execute(task_context(DAG_ID, "quiet-poll"))  # get_logs=False: it polls while the job runs
    (create,) = k8s.history(namespace, verb="create", resource="mpijobs")
    _assert_no_reads_of_pods_or_events_once_running(k8s, namespace, create["name"])


def test_events_are_read_per_waiting_pod_and_a_missing_secret_still_fails_fast(k8s, db_url):
    ns = k8s.new_namespace()  # no Secret created here
    operator = MPIJobOperator(task_id="train", namespace=ns, image=IMAGE, training_run_id="x/y", world_size=2,
                              startup_timeout_seconds=300, poll_interval=0.3)
    with pytest.raises(MPIJobStartupTimeout, match=r'FailedMount: MountVolume.SetUp failed for volume '
                                                   r'"pgtrain-database" : secret "pgtrain-db" not found'):
        operator.execute(task_context(DAG_ID, "no-secret-events"))
    reads = k8s.history(ns, verb="list", resource="events")
    assert reads  # the FailedMount was found in the pods' events
    pods = {h["name"] for h in k8s.history(ns, verb="create", resource="pods")}
    for read in reads:  # never the namespace's every event: one pod's, a pod of this job
        assert read["fieldSelector"].startswith(EVENTS_OF_A_POD), read
        assert read["fieldSelector"].removeprefix(EVENTS_OF_A_POD) in pods, read


def test_a_cluster_without_the_mpi_operator_fails_the_task_for_good(tmp_path, namespace, db_url, monkeypatch):
    run_id = plan(db_url, "no-operator", shard=False)
    with psycopg.connect(db_url) as conn:
        attempt = record.get_run(conn, run_id).attempt
    with SimulatedCluster(tmp_path / "no-crd", mpijob_crd=False) as bare:
        for name, value in bare.connection_uri_env().items():
            monkeypatch.setenv(name, value)
        operator = MPIJobTrainOperator(task_id="train", namespace=namespace, image=IMAGE, training_run_id=run_id,
                                       poll_interval=0.3)
        with pytest.raises(AirflowFailException) as failure:  # Airflow never retries it
            operator.execute(task_context(DAG_ID, "no-operator"))
        message = str(failure.value)
        assert "does not serve kubeflow.org/v2beta1 mpijobs (the MPIJob CRD is not installed)" in message
        assert (f"install the MPI Operator {api.MPI_OPERATOR_VERSION} (kubectl apply --server-side -f "
                f"https://raw.githubusercontent.com/kubeflow/mpi-operator/{api.MPI_OPERATOR_VERSION}/deploy/"
                "v2beta1/mpi-operator.yaml; see docs/kubernetes.md)") in message
        assert "ApiException" not in message and "404" not in message

        # a retry that finds its job's name in the task state store reads it first: the same answer, not "gone"
        store = FakeTaskStateStore()
        store.set("pgtrain_mpijob", {"name": "earlier-job", "namespace": namespace})
        plain = MPIJobOperator(task_id="train", namespace=namespace, image=IMAGE, training_run_id=run_id,
                               world_size=2, poll_interval=0.3)
        with pytest.raises(AirflowFailException, match="the MPIJob CRD is not installed"):
            plain.execute(task_context(DAG_ID, "no-operator", state_store=store))
    with psycopg.connect(db_url) as conn:
        assert record.get_run(conn, run_id).attempt == attempt  # nothing was begun


@pytest.mark.parametrize("deferrable", [False, True])
def test_a_cold_node_pulling_the_image_outlasts_the_startup_timeout_and_the_job_runs(k8s, namespace, db_url, capfd,
                                                                                    deferrable):
    """The node pulls the image for twice the startup timeout: the clock stands still while it pulls and counts
    from the last sign of progress after (the launcher pod made once the workers are ready), so the job runs."""
    run_id = plan(db_url, f"cold-node-{deferrable}", epochs=2)
    k8s.set_pull_seconds(2 * PULL_TIMEOUT)
    try:
        operator = MPIJobTrainOperator(task_id="train", namespace=namespace, image=f"{IMAGE}-cold-{namespace}",
                                       training_run_id=run_id, startup_timeout_seconds=PULL_TIMEOUT,
                                       poll_interval=0.3, deferrable=deferrable)
        context = task_context(DAG_ID, f"cold-node-{deferrable}", state_store=FakeTaskStateStore())
        if deferrable:
            with pytest.raises(TaskDeferred) as deferred:
                operator.execute(context)
            event = first_event(deferred.value.trigger, 180)
            assert event["status"] == "succeeded", event
            operator.execute_complete(context, event)
        else:
            operator.execute(context)
    finally:
        k8s.set_pull_seconds(0)
    task_log = "".join(capfd.readouterr())
    assert staged(db_url, run_id) > 0  # it trained
    (pulled,) = [e for e in k8s.api("GET", f"/api/v1/namespaces/{namespace}/events")["items"]
                 if e["reason"] == "Pulled"]
    assert f"in {2 * PULL_TIMEOUT}" in pulled["message"]  # the pull took longer than the startup timeout
    assert task_log.count("the startup timeout counts from the last sign of progress") == 1


def _trainer_pids(run_id: str) -> list[int]:
    """This run's trainer ranks on this machine (the simulated cluster runs them as local processes)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if entry.name.isdigit() and b"trainer" in argv and run_id.encode() in argv:
            pids.append(int(entry.name))
    return pids


@pytest.mark.parametrize("deferrable", [False, True])
def test_a_job_whose_epochs_stop_is_deleted_and_the_task_fails_naming_the_stall(k8s, namespace, db_url, deferrable):
    """The ranks are stopped (SIGSTOP: a hung collective, as far as the watcher can tell) as soon as they exist: no
    epoch comes within the run's stall_timeout, so the watcher (the synchronous guard, or the trigger) deletes the
    running job and the task names the stall."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        if conn.execute("SELECT count(*) FROM public.samples").fetchone()[0] == 0:
            seed_samples(conn, 240, dim=8, classes=3)
        run_id = planned_run(conn, f"stalled-{deferrable}", world_size=2, epochs=10000, batch_size=16,
                             launcher="kubernetes", stall_timeout=STALL_TIMEOUT, early_stopping_patience=0).run_id
    operator = MPIJobTrainOperator(task_id="train", namespace=namespace, image=IMAGE, training_run_id=run_id,
                                   startup_timeout_seconds=60, poll_interval=0.3, deferrable=deferrable)
    context = task_context(DAG_ID, f"stalled-{deferrable}", state_store=FakeTaskStateStore())
    stopped: set[int] = set()
    watching = threading.Event()

    def stop_the_ranks() -> None:
        while not watching.wait(0.05):
            for pid in set(_trainer_pids(run_id)) - stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                    stopped.add(pid)

    stopper = threading.Thread(target=stop_the_ranks, daemon=True)
    stopper.start()
    try:
        with pytest.raises(MPIJobStalled) as stalled:
            if not deferrable:
                operator.execute(context)
            else:
                with pytest.raises(TaskDeferred) as deferred:
                    operator.execute(context)
                event = first_event(deferred.value.trigger, 180)
                assert event["status"] == "error" and event["reason"] == "stalled", event
                operator.execute_complete(context, event)
    finally:
        watching.set()
        stopper.join(10)
        for pid in stopped:  # the job's deletion ends them; never leave one stopped
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    message = str(stalled.value)
    assert stopped, "no trainer rank was seen"
    assert f"no epoch recorded for {STALL_TIMEOUT}" in message or "the job stalled: no epoch recorded for" in message
    assert f"stall_timeout {STALL_TIMEOUT} s" in message and "raise stall_timeout" in message
    assert [h for h in k8s.history(namespace, verb="delete", resource="mpijobs")]
    with psycopg.connect(db_url) as conn:
        status, reason = conn.execute("SELECT status, status_reason FROM pgtrain.training_runs WHERE run_id = %s",
                                      (run_id,)).fetchone()
    assert status == "failed" and "stalled" in reason  # the run's record names the stall
