"""MPIJobOperator / MPIJobTrainOperator (and LocalTrainOperator) on the simulated cluster, real PostgreSQL and trainer.

The simulated cluster (tests/k8s_sim, a test double) runs the launcher's rendered ``horovodrun``
command as local processes; the database URL reaches them only through a Kubernetes Secret whose
password is a sentinel that no log, XCom or API request may contain.
"""

from __future__ import annotations

import asyncio
import importlib
import multiprocessing
import os
import signal
import threading

import psycopg
import pytest
from airflow.sdk import RetryAction
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from pgtrain.airflow.kubernetes.errors import MPIJobInputRefused, MPIJobStartupTimeout
from pgtrain.airflow.kubernetes.operator import MPIJobOperator
from pgtrain.airflow.kubernetes.train import MPIJobTrainOperator
from pgtrain.airflow.local.operator import LocalTrainOperator
from tests.k8s_sim.airflow_context import FakeTaskStateStore, task_context
from tests.k8s_sim.validation import assert_cluster_accepted_every_manifest
from tests.support import ProcessWatch, planned_run, seed_samples

pytestmark = pytest.mark.horovod
DAG_ID = "pgtrain_test"  # tests.support.planned_run plans runs of this DAG
IMAGE = "pgtrain-trainer:test"


def plan(db_url: str, dag_run_id: str, *, rows: int = 240, epochs: int = 2, shard: bool = True) -> str:
    with psycopg.connect(db_url, autocommit=True) as conn:
        if conn.execute("SELECT count(*) FROM public.samples").fetchone()[0] == 0:
            seed_samples(conn, rows, dim=8, classes=3)
        if not shard:
            from pgtrain.config.params import TrainingConfig
            from pgtrain.runs import record

            config = TrainingConfig.from_mapping({"world_size": 2, "launcher": "kubernetes"})
            return record.plan_run(conn, DAG_ID, dag_run_id, config).run_id
        return planned_run(conn, dag_run_id, world_size=2, epochs=epochs, batch_size=16,
                           launcher="kubernetes").run_id


def train_operator(namespace: str | None = None, **kwargs) -> MPIJobTrainOperator:
    """The operator as a DAG author configures it: namespace, image and timeouts are its arguments."""
    cluster = {"namespace": namespace, "image": IMAGE, "startup_timeout_seconds": 60} if namespace else {}
    return MPIJobTrainOperator(task_id="train", poll_interval=0.3, **cluster, **kwargs)


def committed_versions(db_url: str) -> int:
    with psycopg.connect(db_url) as conn:
        return conn.execute("SELECT count(*) FROM pgtrain.model_versions").fetchone()[0]


def staged(db_url: str, run_id: str) -> int:
    with psycopg.connect(db_url) as conn:
        return conn.execute("SELECT count(*) FROM pgtrain.staged_parameters WHERE run_id = %s",
                            (run_id,)).fetchone()[0]


def assert_no_secret_leaked(k8s, ns: str, sentinel: str, *texts: str) -> None:
    for text in texts:
        assert sentinel not in text
    assert sentinel not in repr(k8s.history(ns, verb="create", resource="mpijobs"))


def launcher_running(k8s, ns: str):
    def check():
        pods = k8s.pods(ns, "training.kubeflow.org/job-role=launcher")
        return pods if pods and pods[0]["status"]["phase"] == "Running" else None

    return check


def test_failing_trainer_fails_the_task_with_reason_and_log_tail(k8s, namespace, db_url, password_sentinel,
                                                                 capfd):
    run_id = plan(db_url, "failing", shard=False)  # no manifest: every rank stops with a clear error
    operator = train_operator(namespace, training_run_id=run_id, on_finish_action="keep_pod")
    context = task_context(DAG_ID, "failing")
    with pytest.raises(MPIJobInputRefused) as failure:
        operator.execute(context)
    task_log = "".join(capfd.readouterr())

    assert operator.retry_policy.evaluate(failure.value, 1, 2).action == RetryAction.FAIL  # refused: no retry
    message = str(failure.value)
    assert "BackoffLimitExceeded" in message and "backoff limit" in message
    assert "launcher container exited with code 1" in message
    assert "has no shard manifest; compute_shards writes it" in message  # the trainer's own words, from the tail
    assert "[launcher]" in task_log  # streamed into the task log
    assert committed_versions(db_url) == 0 and staged(db_url, run_id) == 0
    with psycopg.connect(db_url) as conn:
        status, reason = conn.execute("SELECT status, status_reason FROM pgtrain.training_runs WHERE run_id = %s",
                                      (run_id,)).fetchone()
    assert status == "refused" and "has no shard manifest; compute_shards writes it" in reason  # the trainer's verdict
    assert f"trainer verdict: refused: {reason}" in message
    (job,) = k8s.mpijobs(namespace)  # keep_pod: kept, and marked so a retry does not re-attach to it
    assert job["metadata"]["labels"]["already_checked"] == "True"
    outcome = context["ti"].xcoms.pop("pgtrain_outcome")  # the DAG run's note (pgtrain.airflow.ui.run_notes)
    assert outcome.startswith("digits-mlp: refused: ") and "has no shard manifest" in outcome
    assert context["ti"].xcoms == {"mpijob_name": job["metadata"]["name"], "mpijob_namespace": namespace}
    assert_no_secret_leaked(k8s, namespace, password_sentinel, message, task_log, repr(context["ti"].xcoms))
    assert_cluster_accepted_every_manifest(k8s, namespace)


def test_workers_never_scheduled_time_out_and_the_job_is_deleted(k8s, namespace, db_url):
    run_id = plan(db_url, "no-gpus", shard=False)
    operator = MPIJobOperator(task_id="train", namespace=namespace, image=IMAGE, training_run_id=run_id,
                              world_size=16, gpus_per_worker=16, startup_timeout_seconds=2, poll_interval=0.3)
    with pytest.raises(MPIJobStartupTimeout) as failure:
        operator.execute(task_context(DAG_ID, "no-gpus"))

    message = str(failure.value)
    assert "was not running after 2s" in message
    assert "worker-0 Pending (Unschedulable: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu.)" in message
    assert "The MPIJob was deleted" in message
    (deletion,) = k8s.history(namespace, verb="delete", resource="mpijobs")
    assert deletion["propagationPolicy"] == "Foreground"
    k8s.wait_for(lambda: not k8s.mpijobs(namespace) and not k8s.pods(namespace), 10, "the job and its pods to go")
    assert not k8s.history(namespace, verb="exec")  # no launcher ever ran


def test_missing_secret_fails_fast_with_advice(k8s, db_url):
    ns = k8s.new_namespace()  # no Secret created here
    operator = MPIJobOperator(task_id="train", namespace=ns, image=IMAGE, training_run_id="x/y", world_size=2,
                              startup_timeout_seconds=300, poll_interval=0.3)
    with pytest.raises(MPIJobStartupTimeout, match=r'FailedMount: MountVolume.SetUp failed for volume '
                                                   r'"pgtrain-database" : secret "pgtrain-db" not found.*'
                                                   r"Create the Secret 'pgtrain-db'"):
        operator.execute(task_context(DAG_ID, "no-secret"))
    k8s.wait_for(lambda: not k8s.mpijobs(ns), 10, "the job to be deleted")


def test_on_kill_deletes_the_mpijob(k8s, namespace, db_url):
    run_id = plan(db_url, "killed", epochs=50)
    operator = train_operator(namespace, training_run_id=run_id)
    context = task_context(DAG_ID, "killed")
    errors: list[BaseException] = []

    def run() -> None:
        try:
            operator.execute(context)
        except BaseException as exc:  # noqa: BLE001 - the watcher ends once its job is gone
            errors.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    (launcher,) = k8s.wait_for(launcher_running(k8s, namespace), 60, "the launcher to run")
    operator.on_kill()

    (deletion,) = k8s.history(namespace, verb="delete", resource="mpijobs")
    assert deletion["propagationPolicy"] == "Foreground"
    k8s.wait_for(lambda: not k8s.mpijobs(namespace) and not k8s.pods(namespace), 20, "the job and pods to go")
    assert k8s.history(namespace, verb="kill", name=launcher["metadata"]["name"])  # its processes were stopped
    worker.join(30)
    assert not worker.is_alive() and errors
    assert len(k8s.history(namespace, verb="delete", resource="mpijobs")) == 1  # cleanup did not delete twice


def _first_attempt(namespace: str, run_id: str) -> None:
    """Child process: the first try, killed (SIGKILL, no on_kill) while its job runs."""
    operator = train_operator(namespace, training_run_id=run_id)
    operator.execute(task_context(DAG_ID, "retried", try_number=1))


def test_retry_reattaches_to_the_running_job(k8s, namespace, db_url, password_sentinel, capfd):
    run_id = plan(db_url, "retried", epochs=3)
    child = multiprocessing.get_context("fork").Process(target=_first_attempt, args=(namespace, run_id))
    child.start()
    try:
        k8s.wait_for(launcher_running(k8s, namespace), 60, "the first attempt's launcher to run")
    finally:
        os.kill(child.pid, signal.SIGKILL)  # the worker running the task dies
        child.join()

    capfd.readouterr()
    retry = train_operator(namespace, training_run_id=run_id)
    retry.execute(task_context(DAG_ID, "retried", try_number=2))
    task_log = "".join(capfd.readouterr())

    assert "Re-attaching to MPIJob" in task_log
    assert len(k8s.history(namespace, verb="create", resource="mpijobs")) == 1
    assert staged(db_url, run_id) > 0  # the one job trained and staged the parameters
    assert "[launcher]" in task_log
    k8s.wait_for(lambda: not k8s.mpijobs(namespace), 10, "on_finish_action=delete_pod to delete the job")
    assert_no_secret_leaked(k8s, namespace, password_sentinel, task_log)
    assert_cluster_accepted_every_manifest(k8s, namespace)


def test_the_password_is_on_no_command_line_or_environment_while_pods_train(k8s, namespace, db_url,
                                                                             password_sentinel):
    """The Secret is mounted as a file: Gloo's `sh -c env K=V ...` rank command lines carry only its path."""
    run_id = plan(db_url, "no-leak", epochs=4)
    watch = ProcessWatch(password_sentinel, run_id)
    errors = watch.during(lambda: train_operator(namespace, training_run_id=run_id).execute(
        task_context(DAG_ID, "no-leak")))
    assert not errors, errors
    assert not watch.leaks, watch.leaks
    assert watch.gloo_command_lines >= 1  # the ranks ran while we looked
    assert staged(db_url, run_id) > 0  # and they connected with the URL read from the mounted file


def test_deferrable_mode_hands_the_wait_to_the_trigger(k8s, namespace, db_url, capfd):
    run_id = plan(db_url, "deferred")
    store = FakeTaskStateStore()
    context = task_context(DAG_ID, "deferred", state_store=store)
    with pytest.raises(TaskDeferred) as deferred:
        train_operator(namespace, training_run_id=run_id, deferrable=True).execute(context)
    assert store.get("pgtrain_mpijob") == {"name": context["ti"].xcoms["mpijob_name"], "namespace": namespace}

    # What the triggerer does: rebuild the trigger from its serialized form and run it to its event.
    classpath, kwargs = deferred.value.trigger.serialize()
    module, _, name = classpath.rpartition(".")
    trigger = getattr(importlib.import_module(module), name)(**kwargs)

    async def first_event():
        async for event in trigger.run():
            return event

    event = asyncio.run(asyncio.wait_for(first_event(), 120)).payload
    assert event["status"] == "succeeded", event  # the job's own message says why not

    capfd.readouterr()
    resumed = train_operator(namespace, training_run_id=run_id, deferrable=True)  # a fresh instance, as on resume
    getattr(resumed, deferred.value.method_name)(context, event)
    task_log = "".join(capfd.readouterr())
    assert "[launcher]" in task_log and "succeeded" in task_log
    assert staged(db_url, run_id) > 0
    k8s.wait_for(lambda: not k8s.mpijobs(namespace), 10, "the job to be deleted")
    assert_cluster_accepted_every_manifest(k8s, namespace)


def test_deferred_startup_timeout_and_kill_delete_the_job(k8s, namespace, db_url):
    run_id = plan(db_url, "deferred-no-gpus", shard=False)

    def defer(dag_run_id: str):
        operator = MPIJobOperator(task_id="train", namespace=namespace, image=IMAGE, training_run_id=run_id,
                                  world_size=16, gpus_per_worker=16, startup_timeout_seconds=2,
                                  poll_interval=0.3, deferrable=True)
        context = task_context(DAG_ID, dag_run_id)
        with pytest.raises(TaskDeferred) as deferred:
            operator.execute(context)
        return context, deferred.value.trigger

    async def first_event(trigger):
        async for event in trigger.run():
            return event.payload

    context, trigger = defer("timeout")
    event = asyncio.run(asyncio.wait_for(first_event(trigger), 60))
    assert event["status"] == "timeout" and "Insufficient nvidia.com/gpu" in event["message"], event
    with pytest.raises(MPIJobStartupTimeout, match="Insufficient nvidia.com/gpu.*The MPIJob was deleted"):
        MPIJobOperator(task_id="train", namespace=namespace, deferrable=True).execute_complete(context, event)
    assert k8s.history(namespace, verb="delete", name=trigger.name)[0]["propagationPolicy"] == "Foreground"

    _, trigger = defer("killed-while-deferred")
    asyncio.run(trigger.on_kill())  # Airflow 3.3's triggerer calls this when the deferred task is killed
    assert k8s.history(namespace, verb="delete", name=trigger.name)[0]["propagationPolicy"] == "Foreground"
    k8s.wait_for(lambda: not k8s.mpijobs(namespace), 10, "both jobs to be gone")


def test_deferred_missing_secret_fails_fast_like_the_synchronous_path(k8s, db_url):
    ns = k8s.new_namespace()  # no Secret created here
    operator = MPIJobOperator(task_id="train", namespace=ns, image=IMAGE, training_run_id="x/y", world_size=2,
                              startup_timeout_seconds=3600, poll_interval=0.3, deferrable=True)
    context = task_context(DAG_ID, "deferred-no-secret")
    with pytest.raises(TaskDeferred) as deferred:
        operator.execute(context)

    async def first_event():
        async for event in deferred.value.trigger.run():
            return event.payload

    # Far below the hour of startup timeout: the trigger sees the container that can never start.
    event = asyncio.run(asyncio.wait_for(first_event(), 120))
    assert event["status"] == "cannot_start" and 'secret "pgtrain-db" not found' in event["message"], event
    with pytest.raises(MPIJobStartupTimeout, match=r'FailedMount: .*secret "pgtrain-db" not found.*'
                                                   r"Create the Secret 'pgtrain-db'"):
        MPIJobOperator(task_id="train", namespace=ns, deferrable=True).execute_complete(context, event)
    k8s.wait_for(lambda: not k8s.mpijobs(ns), 10, "the job to be deleted")


def test_local_launcher_runs_horovodrun_on_this_machine(namespace, db_url, capfd):
    with psycopg.connect(db_url, autocommit=True) as conn:
        seed_samples(conn, 200, dim=8, classes=3)
        run_id = planned_run(conn, "local", world_size=2, epochs=1, launcher="local").run_id
    LocalTrainOperator(task_id="train", training_run_id=run_id).execute(task_context(DAG_ID, "local"))
    assert staged(db_url, run_id) > 0
    assert "starting 2 horovod ranks" in "".join(capfd.readouterr())


def test_a_run_planned_for_another_launcher_fails_for_good(k8s, namespace, db_url):
    """The author switched the DAG's launcher between plan_run and train: nothing is launched, no retry."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        seed_samples(conn, 50, dim=8, classes=3)
        run_id = planned_run(conn, "switched", world_size=1, epochs=1, launcher="local").run_id
    with pytest.raises(AirflowFailException, match="planned for launcher='local'.*re-run the DAG run from plan_run"):
        train_operator(namespace, training_run_id=run_id).execute(task_context(DAG_ID, "switched"))
    assert not k8s.history(namespace, verb="create", resource="mpijobs")


def test_retry_finds_its_job_through_the_task_state_store(k8s, namespace, db_url):
    """Airflow 3.3 keeps the job's identity across tries; a retry uses it before any label search."""
    run_id = plan(db_url, "stored", shard=False)
    store = FakeTaskStateStore()

    def attempt(try_number: int):
        operator = MPIJobOperator(task_id="train", namespace=namespace, image=IMAGE, training_run_id=run_id,
                                  world_size=16, gpus_per_worker=16, deferrable=True,
                                  labels={"attempt": str(try_number)})
        with pytest.raises(TaskDeferred) as deferred:
            operator.execute(task_context(DAG_ID, "stored", try_number=try_number, state_store=store))
        return deferred.value.trigger

    first = attempt(1)
    second = attempt(2)  # its extra label would hide the first job from a label search
    assert second.name == first.name == store.get("pgtrain_mpijob")["name"]
    assert len(k8s.history(namespace, verb="create", resource="mpijobs")) == 1
    asyncio.run(second.on_kill())
    k8s.wait_for(lambda: not k8s.mpijobs(namespace), 10, "the job to be deleted")
