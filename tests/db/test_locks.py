"""Leased locks and fenced head moves (``model_store.move_head``, what a commit and a promote write) on a real
PostgreSQL, with real processes."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import threading
import time
import traceback

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from pgtrain.core.errors import LockTimeout, StaleLockToken, TrainingFailed
from pgtrain.store.catalog import list_locks
from pgtrain.store.locks import Lease, LockManager, LockNotHeld, fenced, lock_holder
from pgtrain.store.model_store import head_version, model_lock_name, move_head

CTX = mp.get_context("fork")


def _versions(conn, model: str, count: int) -> None:
    """Versions 1..count of ``model`` for its head to point at (their rows only: the head's fencing is tested)."""
    with conn.transaction():
        conn.execute("INSERT INTO pgtrain.model_versions (model_name, version, fencing_token) "
                     "SELECT %s, v, 0 FROM generate_series(1, %s) AS v", (model, count))


def _moves(conn, model: str) -> list[tuple[int, int | None, int]]:
    """(version, previous version, fencing token) of every move of the model's head, oldest first."""
    with conn.transaction():
        return conn.execute("SELECT version, previous_version, fencing_token FROM pgtrain.model_head_history "
                            "WHERE model_name = %s ORDER BY id", (model,)).fetchall()


def _report_errors(fn):
    def wrapper(url, results, *args):
        try:
            fn(url, results, *args)
        except BaseException:  # the parent asserts on it
            results.put(("error", traceback.format_exc()))
    return wrapper


class _Pipe:
    """A one-writer channel whose put is synchronous (a Queue's feeder thread may not flush before a SIGSTOP)."""

    def __init__(self) -> None:
        self._read, self._write = CTX.Pipe(duplex=False)

    def put(self, item) -> None:
        self._write.send(item)

    def get(self, timeout: float):
        if not self._read.poll(timeout):
            raise TimeoutError(f"no message from the child within {timeout}s")
        return self._read.recv()


def _join_all(processes, timeout=60.0):
    deadline = time.monotonic() + timeout
    for p in processes:
        p.join(max(0.1, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


# -- 16 processes x 25 increments -------------------------------------------------------------------------
@_report_errors
def _incrementer(url, results, worker, increments):
    with psycopg.connect(url, autocommit=True) as conn, \
            LockManager(conn, ttl=5, owner={"task_id": f"worker-{worker}"}) as locks:
        for _ in range(increments):
            with locks.lock(model_lock_name("counter"), timeout=60) as lease:
                move_head(conn, "counter", (head_version(conn, "counter") or 0) + 1, lease)
    results.put(("done", worker))


def test_sixteen_processes_moving_one_head_forward_lose_no_move(db_url, conn):
    _versions(conn, "counter", 400)
    results = CTX.Queue()
    workers = [CTX.Process(target=_incrementer, args=(db_url, results, w, 25)) for w in range(16)]
    for w in workers:
        w.start()
    outcomes = [results.get(timeout=90) for _ in workers]
    _join_all(workers)

    assert [o for o in outcomes if o[0] == "error"] == []
    assert head_version(conn, "counter") == 400
    history = _moves(conn, "counter")
    assert [v for v, _, _ in history] == list(range(1, 401)), "each move went one version further"
    assert [previous for _, previous, _ in history] == [None, *range(1, 400)], "each move saw the previous one"
    tokens = [t for _, _, t in history]
    assert all(a < b for a, b in zip(tokens, tokens[1:], strict=False)), "fencing tokens strictly increase"
    assert list_locks(conn)[0]["owner"] is None


# -- a holder killed with SIGKILL inside its critical section ---------------------------------------------
@_report_errors
def _holder_killed_mid_write(url, results, ttl):
    conn = psycopg.connect(url, autocommit=True)
    locks = LockManager(conn, ttl=ttl, owner={"task_id": "doomed"})
    lease = locks.acquire_lock("model:m", timeout=5)
    time.sleep(ttl * 1.5)  # the heartbeat keeps the lease alive past one ttl
    with fenced(conn, lease):  # move_head's writes, stopped before its transaction commits
        conn.execute("UPDATE pgtrain.model_heads SET version = 2, fencing_token = %s WHERE model_name = 'm'",
                     (lease.token,))
        conn.execute("INSERT INTO pgtrain.model_head_history (model_name, version, previous_version, fencing_token, "
                     "action) VALUES ('m', 2, 1, %s, 'promote')", (lease.token,))
        results.put(("in critical section", lease.token))
        time.sleep(600)


def _start(target, db_url: str, ttl: float, expect: str):
    """Start a lock-holding process; wait for its first report (``expect``) and return (process, pipe, token)."""
    results = _Pipe()
    process = CTX.Process(target=target, args=(db_url, results, ttl))
    process.start()
    try:
        state, token = results.get(timeout=20)
        assert state == expect, token
    except BaseException:
        process.kill()
        raise
    return process, results, token


def test_holder_killed_with_sigkill_frees_the_lock_within_its_ttl_and_leaves_nothing_half_written(db_url, conn):
    ttl = 1.0
    _versions(conn, "m", 3)
    with LockManager(db_url, ttl=ttl) as setup, setup.lock("model:m") as lease:
        move_head(conn, "m", 1, lease)
    holder, results, token = _start(_holder_killed_mid_write, db_url, ttl, expect="in critical section")
    try:

        with LockManager(db_url, ttl=5) as locks:
            with pytest.raises(LockTimeout, match="task_id=doomed"):
                locks.acquire_lock("model:m", timeout=0.2)  # still alive: it holds the lock
            os.kill(holder.pid, signal.SIGKILL)
            killed_at = time.monotonic()
            lease = locks.acquire_lock("model:m", timeout=10)
            waited = time.monotonic() - killed_at

            assert waited < ttl + 1.0, f"lock free again {waited:.2f}s after SIGKILL (ttl {ttl}s)"
            assert lease.token > token
            assert head_version(conn, "m") == 1, "the killed holder's writes were rolled back"
            assert [v for v, _, _ in _moves(conn, "m")] == [1]
            assert move_head(conn, "m", 3, lease).previous_version == 1
    finally:
        holder.kill()
        holder.join()


# -- a stale holder: paused past its lease, then writes with its old token ---------------------------------
@_report_errors
def _paused_holder(url, results, ttl):
    with psycopg.connect(url, autocommit=True) as conn, \
            LockManager(conn, ttl=ttl, owner={"task_id": "sleepy"}) as locks:
        lease = locks.acquire_lock("params", timeout=5)
        move_head(conn, "lr", 1, lease)
        results.put(("holding", lease.token))
        os.kill(os.getpid(), signal.SIGSTOP)  # the parent lets it sleep past its lease, then SIGCONTs it
        try:
            move_head(conn, "lr", 3, lease)
            results.put(("written", None))
        except StaleLockToken as refused:
            results.put(("refused", str(refused)))
        results.put(("released", locks.release_lock("params")))


def test_stale_holder_writing_with_its_old_token_is_refused_and_changes_nothing(db_url, conn):
    ttl = 0.6
    _versions(conn, "lr", 3)
    stale, results, old_token = _start(_paused_holder, db_url, ttl, expect="holding")
    try:
        deadline = time.monotonic() + 10
        while open(f"/proc/{stale.pid}/stat").read().split(") ")[1][0] != "T":
            assert time.monotonic() < deadline, "holder did not stop"
            time.sleep(0.01)

        with LockManager(db_url, ttl=5) as locks:
            lease = locks.acquire_lock("params", timeout=5)  # taken over once the paused holder's lease expires
            assert lease.token > old_token
            assert move_head(conn, "lr", 2, lease).previous_version == 1
            os.kill(stale.pid, signal.SIGCONT)
            outcome = results.get(timeout=20)
            released = results.get(timeout=20)
            _join_all([stale])

            assert outcome[0] == "refused", outcome
            assert f"token {old_token} is no longer current" in outcome[1]
            assert released == ("released", False), "its release did not free the new holder's lock"
            assert head_version(conn, "lr") == 2
            assert [v for v, _, _ in _moves(conn, "lr")] == [1, 2]
            assert locks.holder("params")["token"] == lease.token
    finally:
        if stale.is_alive():
            stale.kill()
        stale.join()


def test_a_write_older_than_the_newest_token_seen_is_refused_even_under_a_live_lease(db_url, conn):
    _versions(conn, "shared", 2)
    with LockManager(db_url, ttl=5) as locks:
        older = locks.acquire_lock("lock-a")
        newer = locks.acquire_lock("lock-b")
        move_head(conn, "shared", 1, newer)
        with pytest.raises(StaleLockToken, match=rf"moved with a newer token than yours \({older.token}\)"):
            move_head(conn, "shared", 2, older)
    assert head_version(conn, "shared") == 1
    assert [(v, token) for v, _, token in _moves(conn, "shared")] == [(1, newer.token)]


def test_an_expired_lease_cannot_write_even_before_anyone_takes_it_over(db_url, conn):
    _versions(conn, "lr", 1)
    with LockManager(db_url, ttl=0.3, heartbeat=False) as locks:
        lease = locks.acquire_lock("params")
        time.sleep(0.4)
        with pytest.raises(StaleLockToken, match="expired at"):
            move_head(conn, "lr", 1, lease)
    assert head_version(conn, "lr") is None


# -- timeouts, non-holders, wake-up, heartbeat ------------------------------------------------------------
@_report_errors
def _holder(url, results, hold_seconds):
    with LockManager(url, ttl=5, owner={"dag_id": "train_dag", "run_id": "scheduled__1", "task_id": "commit"}) \
            as locks, locks.lock("model:x") as lease:
        results.put(("holding", lease.token))
        time.sleep(hold_seconds)
        results.put(("releasing", time.monotonic()))


def test_lock_timeout_names_the_holder_and_a_non_holder_cannot_release(db_url):
    results = CTX.Queue()
    holder = CTX.Process(target=_holder, args=(db_url, results, 3.0))
    holder.start()
    state, token = results.get(timeout=20)
    assert state == "holding", token
    try:
        with LockManager(db_url, ttl=5) as other:
            started = time.monotonic()
            with pytest.raises(LockTimeout) as timed_out:
                other.acquire_lock("model:x", timeout=0.5)
            elapsed = time.monotonic() - started
            message = str(timed_out.value)
            assert 0.45 < elapsed < 1.5
            for part in ("'model:x'", "dag_id=train_dag", "run_id=scheduled__1", "task_id=commit",
                         f"pid={holder.pid}", "since ", f"(token {token})"):
                assert part in message, message

            with pytest.raises(LockNotHeld, match="held by dag_id=train_dag"):
                other.release_lock("model:x")
            forged = Lease("model:x", token, {}, None, None, 5)
            with pytest.raises(LockNotHeld):
                other.release(forged)
            assert other.holder("model:x")["token"] == token, "the holder still holds it"
    finally:
        holder.kill()
        holder.join()


def test_a_waiter_wakes_on_release_not_on_a_poll(db_url):
    results = CTX.Queue()
    holder = CTX.Process(target=_holder, args=(db_url, results, 1.0))
    holder.start()
    assert results.get(timeout=20)[0] == "holding"
    with LockManager(db_url, ttl=5) as waiter:
        lease = waiter.acquire_lock("model:x", timeout=10)  # the holder's lease runs 5 s: only NOTIFY wakes us early
        acquired = time.monotonic()
    state, released = results.get(timeout=5)
    _join_all([holder])
    assert state == "releasing" and lease.token > 0
    assert acquired - released < 1.0, f"woke {acquired - released:.3f}s after the release"


def test_heartbeat_keeps_a_long_holder_s_lease_and_tokens_only_grow(db_url, conn):
    with LockManager(db_url, ttl=1.0) as holder, LockManager(db_url, ttl=1.0) as other:
        lease = holder.acquire_lock("long")
        first_expiry = lease.expires_at
        for _ in range(3):  # held for twice its ttl
            time.sleep(0.7)
            with pytest.raises(LockTimeout):
                other.acquire_lock("long", timeout=0)
        assert lease.expires_at > first_expiry and lease.lost is None
        _versions(conn, "x", 1)
        assert move_head(conn, "x", 1, lease).fencing_token == lease.token
        assert holder.release_lock("long") is True
        with pytest.raises(LockNotHeld):
            holder.release_lock("long")
        tokens = [lease.token]
        for _ in range(3):
            with other.lock("long") as again:
                tokens.append(again.token)
    assert tokens == sorted(set(tokens))


def test_release_after_a_zero_timeout_acquire_waits_out_a_brief_row_lock(db_url):
    """acquire_lock's lock_timeout covers its own attempt only: a later release may wait for the row."""
    row_locked, holding = threading.Event(), 0.2
    errors: list[BaseException] = []

    def lock_the_row_briefly() -> None:
        try:
            with psycopg.connect(db_url) as other, other.transaction():
                other.execute("SELECT FROM pgtrain.locks WHERE name = 'model:x' FOR UPDATE")
                row_locked.set()
                time.sleep(holding)
        except BaseException as exc:  # the test asserts on it
            errors.append(exc)
            row_locked.set()

    with LockManager(db_url, ttl=5, heartbeat=False) as locks:
        lease = locks.acquire_lock("model:x", timeout=0)
        toucher = threading.Thread(target=lock_the_row_briefly)
        toucher.start()
        assert row_locked.wait(10)
        started = time.monotonic()
        try:
            assert locks.renew(lease) is False, "the row is busy: a renewal skips it instead of failing"
            assert locks.release_lock("model:x") is True
        finally:
            toucher.join()
        assert errors == []
        assert time.monotonic() - started >= holding * 0.5, "the release waited for the row lock"
        assert locks.holder("model:x") is None, "the lock is free after the release"
        assert locks.acquire_lock("model:x", timeout=0).token > lease.token


# -- a lost control connection (issue 30 finding 2) ---------------------------------------------------------
def _lock_backends(admin_url: str, db_url: str) -> list[int]:
    """The backend pids of the lock connections (application_name pgtrain-locks) to the test's database."""
    with psycopg.connect(admin_url, autocommit=True) as admin:
        return [row[0] for row in admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND application_name = 'pgtrain-locks'",
            (conninfo_to_dict(db_url)["dbname"],))]


def _terminate(admin_url: str, db_url: str, pids: list[int] | None = None) -> None:
    """pg_terminate_backend, waiting until they are gone, on ``pids``, else on every lock connection."""
    pids = pids or _lock_backends(admin_url, db_url)
    assert pids, "no lock connection to terminate"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        assert all(admin.execute("SELECT pg_terminate_backend(%s, 10000)", (p,)).fetchone()[0] for p in pids)


@pytest.mark.parametrize("point", ["acquire", "renew", "release"])
def test_acquire_renewal_and_release_reconnect_after_the_control_connection_is_terminated(db_url, pg_admin_url,
                                                                                          point):
    with LockManager(db_url, ttl=5, heartbeat=False) as locks:
        if point == "acquire":
            _terminate(pg_admin_url, db_url)
        lease = locks.acquire_lock("model:x", timeout=5)
        first = lease.expires_at
        if point == "renew":
            _terminate(pg_admin_url, db_url)
        assert locks.renew(lease) is True and lease.expires_at > first
        if point == "release":
            _terminate(pg_admin_url, db_url)
        assert locks.release(lease) is True
        assert locks.holder("model:x") is None
        assert locks.acquire_lock("model:x", timeout=0).token > lease.token


def test_a_waiter_whose_connection_is_terminated_still_takes_the_lock_when_it_is_released(db_url, pg_admin_url):
    taken: list = []
    with LockManager(db_url, heartbeat=False) as waiter:
        waiting = _lock_backends(pg_admin_url, db_url)  # the waiter's alone, before the holder connects

        def wait() -> None:
            try:
                taken.append(waiter.acquire_lock("model:x", timeout=60))
            except BaseException as error:  # the test asserts on it
                taken.append(error)

        with LockManager(db_url, ttl=30, heartbeat=False) as holder:
            held = holder.acquire_lock("model:x", timeout=0)
            thread = threading.Thread(target=wait)
            thread.start()
            _terminate(pg_admin_url, db_url, waiting)
            assert holder.release(held) is True  # the lease ran 30 s more: only this release lets the waiter in
            thread.join(60)
    assert len(taken) == 1 and isinstance(taken[0], Lease), taken
    assert taken[0].token > held.token


def test_a_token_older_than_the_newest_is_still_refused_after_a_reconnect(db_url, pg_admin_url, conn):
    _versions(conn, "lr", 2)
    with LockManager(db_url, ttl=30, heartbeat=False, owner={"task_id": "stale"}) as stale:
        old = stale.acquire_lock("params", timeout=0)
        _terminate(pg_admin_url, db_url)
        with LockManager(db_url, ttl=30, heartbeat=False) as newer:
            lease = newer.acquire_lock("params", timeout=0, take_over={"task_id": "stale"})
            assert lease.token > old.token
            with pytest.raises(StaleLockToken, match=f"token {old.token} has ended"):
                stale.renew(old)
            assert old.lost is not None and old.lost_event.is_set()
            with pytest.raises(StaleLockToken, match=f"token {old.token} is no longer current"):
                move_head(conn, "lr", 1, old)
            assert stale.release(old) is False, "the stale holder's release frees nothing"
            assert newer.holder("params")["token"] == lease.token
            assert move_head(conn, "lr", 2, lease).previous_version is None
    assert head_version(conn, "lr") == 2


def test_a_commit_whose_lock_connection_is_terminated_while_it_holds_the_lock_commits_and_frees_it(
        db_url, pg_admin_url, aconn, monkeypatch):
    from pgtrain.store import model_store
    from tests.db.test_model_store import MODEL, OWNER, prepare_run

    head_for_update = model_store._head_for_update

    def terminated_first(conn, model_name):  # inside the fenced transaction, under the model's lock
        _terminate(pg_admin_url, db_url)
        return head_for_update(conn, model_name)

    monkeypatch.setattr(model_store, "_head_for_update", terminated_first)
    result = model_store.commit_run(aconn, prepare_run(db_url, "r1"), owner=OWNER, lock_timeout=5)
    assert (result.version, result.created, result.head_moved) == (1, True, True)
    assert lock_holder(aconn, f"model:{MODEL}") is None, "released at once, not left to expire"


@pytest.mark.parametrize("failing", [False, True])
def test_a_training_claim_whose_connection_is_terminated_is_released_and_the_job_s_outcome_stands(
        db_url, pg_admin_url, aconn, failing):
    from pgtrain.launch.attempt import claim_name, training_claim
    from pgtrain.runs.record import get_run
    from tests.db.test_model_store import MODEL, prepare_run

    run = get_run(aconn, prepare_run(db_url, "r1"))
    with pytest.raises(TrainingFailed, match="the job failed") if failing else contextlib.nullcontext():
        with training_claim(db_url, run):
            _terminate(pg_admin_url, db_url)
            if failing:
                raise TrainingFailed("the job failed")
    assert lock_holder(aconn, claim_name(MODEL)) is None


@pytest.mark.parametrize("failing", [False, True])
def test_a_release_that_cannot_complete_fails_no_job_and_hides_no_error(db_url, pg_admin_url, aconn, monkeypatch,
                                                                          caplog, failing):
    from pgtrain.launch.attempt import claim_name, training_claim
    from pgtrain.runs.record import get_run
    from pgtrain.store import control
    from tests.db.test_model_store import MODEL, prepare_run

    monkeypatch.setattr(control, "RECONNECT_DELAYS", (0.0, 0.05))
    run = get_run(aconn, prepare_run(db_url, "r1"))
    database = sql.Identifier(conninfo_to_dict(db_url)["dbname"])
    expected = pytest.raises(TrainingFailed, match="the job failed") if failing else contextlib.nullcontext()
    try:
        with expected as raised, training_claim(db_url, run) as claim:
            with psycopg.connect(pg_admin_url, autocommit=True) as admin:
                admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(database))
            _terminate(pg_admin_url, db_url)
            if failing:
                raise TrainingFailed("the job failed")
    finally:
        with psycopg.connect(pg_admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(database))
    warning = f"could not release lock '{claim_name(MODEL)}' (token {claim.lease.token})"
    assert any(warning in r.message and "ends by itself at" in r.message for r in caplog.records), caplog.text
    if failing:
        assert any(warning in note for note in raised.value.__notes__)
    assert lock_holder(aconn, claim_name(MODEL))["token"] == claim.lease.token, "left to its lease, not released"


def test_an_expired_lease_of_a_family_ends_when_another_group_takes_the_family(db_url):
    """A trial's lease ran out (its heartbeat stalled) and a plain run of the model took the family: the trial's late
    renewal and fenced write are refused, so never do two groups hold the model's training at once."""
    family = "training:m"
    with LockManager(db_url, ttl=1, heartbeat=False, owner={"task_id": "stalled trial"}) as stalled, \
            psycopg.connect(db_url, autocommit=True) as conn:
        lease = stalled.acquire_lock(f"{family}#s/trial-1", timeout=0, family=(family, "s"))
        while not conn.execute("SELECT expires_at <= clock_timestamp() FROM pgtrain.locks WHERE name = %s",
                               (lease.name,)).fetchone()[0]:
            time.sleep(0.1)
        with LockManager(db_url, ttl=30, heartbeat=False, owner={"task_id": "plain run"}) as plain:
            plain.acquire_lock(family, timeout=0, family=(family, "plain"))
            with pytest.raises(StaleLockToken):
                stalled.renew(lease)
            with pytest.raises(StaleLockToken), fenced(conn, lease):
                pytest.fail("a fenced write of the ended lease went ahead")
            live = conn.execute("SELECT array_agg(lock_group) FROM pgtrain.locks WHERE family = %s AND owner IS NOT "
                                "NULL AND expires_at > clock_timestamp()", (family,)).fetchone()[0]
            assert live == ["plain"]
