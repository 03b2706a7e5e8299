"""A deferred Kubernetes train task keeps its model's training claim while the triggerer watches the MPIJob
(docs/locks.md, "The training claim"), on the simulated cluster (a test double) with the real trigger.

No outcome hinges on timing luck: the first run's job waits in a Kueue queue until the test admits it, and its ranks
then wait on a row lock the test holds on their run's record (their first write), so the job is running for as
long as the test needs it to.
"""

from __future__ import annotations

import asyncio
import importlib
import threading

import psycopg
import pytest
from airflow.sdk.exceptions import TaskDeferred

from pgtrain.core.errors import ClaimLost, TrainingBusy
from pgtrain.launch.attempt import DEFERRED_TTL, claim_name, release_claim, training_claim
from pgtrain.launch.mpijob import api
from pgtrain.runs import record
from pgtrain.store.catalog import list_locks
from pgtrain.store.locks import LockManager
from tests.integration.k8s.test_operator import DAG_ID, launcher_running, plan, staged, train_operator
from tests.k8s_sim.airflow_context import FakeTaskStateStore, task_context
from tests.support import taken_by_another_run

pytestmark = pytest.mark.horovod
QUEUE = {api.QUEUE_NAME_LABEL: "gpu-queue"}
MODEL = "digits-mlp"  # the model tests.support.planned_run plans (TrainingConfig's default)
CLAIM = claim_name(MODEL)


def claim_row(db_url: str) -> dict:
    with psycopg.connect(db_url, autocommit=True) as conn:
        return {lock["name"]: lock for lock in list_locks(conn)}[CLAIM]


def deferred_try(namespace: str, run_id: str, dag_run_id: str, **context) -> TaskDeferred:
    with pytest.raises(TaskDeferred) as deferred:
        train_operator(namespace, training_run_id=run_id, deferrable=True, labels=QUEUE).execute(
            task_context(DAG_ID, dag_run_id, **context))
    return deferred.value


def rebuilt(trigger):
    """What the triggerer runs: the trigger rebuilt from its serialized form."""
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    return getattr(importlib.import_module(module), name)(**kwargs)


def test_a_deferred_run_keeps_its_model_claimed_until_it_resumes(k8s, namespace, db_url):
    k8s.queue_jobs(namespace)
    first, second = plan(db_url, "claim-first"), plan(db_url, "claim-second")
    context = task_context(DAG_ID, "claim-first", state_store=FakeTaskStateStore())
    with pytest.raises(TaskDeferred) as deferred:
        train_operator(namespace, training_run_id=first, deferrable=True, labels=QUEUE).execute(context)
    job_name = context["ti"].xcoms["mpijob_name"]

    handed = claim_row(db_url)  # not released when the task deferred: handed to the trigger
    assert handed["held"] and handed["owner"]["training_run"] == first
    assert handed["owner"]["held_by"] == "trigger" and handed["owner"]["mpijob"] == f"{namespace}/{job_name}"
    assert "pid" not in handed["owner"]  # the worker that deferred holds nothing now
    assert (handed["expires_at"] - handed["heartbeat_at"]).total_seconds() == pytest.approx(DEFERRED_TTL)

    trigger = rebuilt(deferred.value.trigger)
    events: list = []

    async def first_event():
        async for event in trigger.run():
            return event.payload

    watcher = threading.Thread(target=lambda: events.append(asyncio.run(asyncio.wait_for(first_event(), 300))),
                               daemon=True)
    watcher.start()
    renewed = k8s.wait_for(lambda: (row := claim_row(db_url))["heartbeat_at"] > handed["heartbeat_at"] and row,
                           60, "the trigger to renew the claim")
    assert renewed["token"] == handed["token"] and "pid" in renewed["owner"]  # the triggerer's process holds it

    with psycopg.connect(db_url) as hold:
        # the ranks' first write (mark_training) waits on this lock: the job runs until the test lets go
        hold.execute("SELECT FROM pgtrain.training_runs WHERE run_id = %s FOR UPDATE", (first,))
        k8s.admit(namespace, job_name)
        k8s.wait_for(launcher_running(k8s, namespace), 60, "the first run's job to run")

        second_context = task_context(DAG_ID, "claim-second")
        with pytest.raises(TrainingBusy, match=rf"model '{MODEL}' is being trained by run {first} \(.*"
                                               rf"run {second} launches no second job") as busy:
            train_operator(namespace, training_run_id=second, deferrable=True, labels=QUEUE).execute(second_context)
        assert "held_by=trigger" in str(busy.value) and f"mpijob={namespace}/{job_name}" in str(busy.value)
        assert launcher_running(k8s, namespace)()  # refused while the first run's job is running
        assert len(k8s.history(namespace, verb="create", resource="mpijobs")) == 1  # the second created none
        with psycopg.connect(db_url) as conn:
            refused = record.get_run(conn, second)
        assert (refused.status, refused.attempt) == ("refused", 0)
        assert second_context["ti"].xcoms["pgtrain_outcome"].startswith(
            f"{MODEL}: refused: model '{MODEL}' is being trained by run {first}")
        hold.rollback()

    watcher.join(300)
    assert events and events[0]["status"] == "succeeded", events
    assert events[0]["claim"]["token"] == handed["token"]
    assert claim_row(db_url)["held"]  # the job has ended, but the task has not resumed yet

    train_operator(namespace, training_run_id=first, deferrable=True).execute_complete(context, events[0])
    assert staged(db_url, first) > 0
    assert not claim_row(db_url)["held"]  # released when the task resumed
    with psycopg.connect(db_url) as conn, training_claim(db_url, record.get_run(conn, second), wait=0):
        pass  # the second run may train now


def test_a_retry_takes_over_its_own_runs_claim_from_the_trigger(k8s, namespace, db_url):
    """The first try's trigger died without an event (its claim was not released); the retry takes the claim over
    at once, re-attaches to the job, and the dead try's claim can no longer be renewed or released."""
    k8s.queue_jobs(namespace)  # the job stays queued: nothing trains
    run_id = plan(db_url, "claim-retried")
    store = FakeTaskStateStore()
    first = deferred_try(namespace, run_id, "claim-retried", try_number=1, state_store=store).trigger
    retry = deferred_try(namespace, run_id, "claim-retried", try_number=2, state_store=store).trigger

    assert retry.name == first.name and len(k8s.history(namespace, verb="create", resource="mpijobs")) == 1
    assert retry.claim["token"] > first.claim["token"]
    held = claim_row(db_url)
    assert (held["token"], held["owner"]["try_number"], held["owner"]["held_by"]) == (retry.claim["token"], 2,
                                                                                       "trigger")

    dead = rebuilt(first)
    # a renewal of the claim its own run's retry took over: lost and logged, and the job is left to the retry
    assert asyncio.run(dead.on_poll()) is None
    assert dead._claim_lost and dead._superseded and claim_row(db_url)["heartbeat_at"] == held["heartbeat_at"]
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert not release_claim(conn, first.claim)
    assert claim_row(db_url)["held"]

    asyncio.run(rebuilt(retry).on_kill())  # the deferred task is killed (mark failed): job deleted, model freed
    assert not claim_row(db_url)["held"]
    k8s.wait_for(lambda: not k8s.mpijobs(namespace), 10, "the job to be deleted")


def test_a_claim_lost_to_another_run_stops_the_deferred_job(k8s, namespace, db_url):
    k8s.queue_jobs(namespace)  # the job stays queued: nothing trains
    first, second = plan(db_url, "lost-deferred-first"), plan(db_url, "lost-deferred-second")
    store = FakeTaskStateStore()
    context = task_context(DAG_ID, "lost-deferred-first", state_store=store)
    trigger = rebuilt(deferred_try(namespace, first, "lost-deferred-first", state_store=store).trigger)
    assert trigger.claim["training_run"] == first
    taken_by_another_run(db_url, CLAIM, second)

    async def first_event():
        async for event in trigger.run():
            return event.payload

    event = asyncio.run(asyncio.wait_for(first_event(), 120))
    assert (event["status"], event["reason"]) == ("error", "stopped"), event
    assert f"and run {second} (host=elsewhere, pid=1) took it" in event["message"]
    k8s.wait_for(lambda: not k8s.mpijobs(namespace), 30, "the job to be deleted")
    with pytest.raises(ClaimLost, match=rf"training claim {CLAIM} of run {first} was lost"):
        train_operator(namespace, training_run_id=first, deferrable=True).execute_complete(context, event)
    assert claim_row(db_url)["owner"]["training_run"] == second  # the resumed task released nothing of the other's


@pytest.mark.parametrize("taken_by", ["another run", "a new try"])
def test_a_lost_claim_in_the_synchronous_watch(k8s, namespace, db_url, taken_by):
    """The synchronous watch: once the claim's heartbeat (every ttl / 3 = 10 s) finds it lost, the job is deleted
    when another run took the claim, and left running (this try stops watching it and records nothing) when a new
    try of the same run did: that try re-attached to it."""
    k8s.queue_jobs(namespace)
    first, second = plan(db_url, "lost-sync-first"), plan(db_url, "lost-sync-second")
    failures: list[BaseException] = []

    def train() -> None:
        try:
            train_operator(namespace, training_run_id=first, labels=QUEUE).execute(
                task_context(DAG_ID, "lost-sync-first"))
        except BaseException as error:
            failures.append(error)

    watcher = threading.Thread(target=train, daemon=True)
    watcher.start()
    k8s.wait_for(lambda: k8s.mpijobs(namespace), 60, "the job to be created")
    k8s.wait_for(lambda: claim_row(db_url)["held"], 60, "the claim to be held")
    with LockManager(db_url, heartbeat=False, owner={"training_run": first}) as retry:
        if taken_by == "another run":
            taken_by_another_run(db_url, CLAIM, second)
        else:
            retry.acquire_lock(CLAIM, timeout=5, take_over={"training_run": first})
        watcher.join(120)
        assert not watcher.is_alive(), "the job was watched on after its claim was lost"
        assert len(failures) == 1 and isinstance(failures[0], ClaimLost), failures
        with psycopg.connect(db_url) as conn:
            status = record.get_run(conn, first).status
        if taken_by == "another run":
            assert not failures[0].superseded
            assert f"and run {second} (host=elsewhere, pid=1) took it" in str(failures[0])
            k8s.wait_for(lambda: not k8s.mpijobs(namespace), 30, "the job to be deleted")
            assert claim_row(db_url)["owner"]["training_run"] == second
            assert status == "failed"
        else:
            assert failures[0].superseded and "taken over by a new try of the run" in str(failures[0])
            assert k8s.mpijobs(namespace) and not k8s.history(namespace, verb="delete", resource="mpijobs")
            assert status != "failed"  # the run's outcome is the new try's
