"""A killed launcher takes its ranks and the ranks' passfile with it, and an older attempt can no longer write to
its run.

(The fencing of every table a trainer writes, without ranks: tests/db/test_attempt_fencing.py.)
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import psycopg
import pytest

from pgtrain.core.db import connect
from pgtrain.runs import record
from tests.conftest import REPO
from tests.db.test_attempt_fencing import assert_refused
from tests.integration.horovod.test_secrets_ranks import password_role
from tests.support import planned_run, seed_samples, wait_for, with_password

# Stands in for the Airflow task: the local launcher in a process of its own, killed without warning, and as
# Airflow's supervisor makes a task's process, non-dumpable (no other process may open its /proc/PID/fd).
LAUNCHER = """
import ctypes, logging, sys
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
from pgtrain.launch.local import run_local
logging.basicConfig(level=logging.INFO)
run_local(sys.argv[1], 2, sys.stdin.readline().strip(), logging.getLogger("launcher"))
"""


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def epochs_recorded(db_url: str, run_id: str) -> int:
    with psycopg.connect(db_url) as conn:
        return conn.execute("SELECT count(*) FROM pgtrain.run_metrics WHERE run_id = %s", (run_id,)).fetchone()[0]


def passfile_of(rank: psutil.Process) -> str:
    """The passfile a rank reads (its PGPASSFILE), opened as the rank could: its path and its 0600 mode."""
    path = rank.environ()["PGPASSFILE"]
    with open(path) as file:
        assert file.read().startswith("*:*:*:*:")
    assert os.stat(path).st_mode & 0o777 == 0o600
    return path


@pytest.mark.horovod
def test_a_killed_launcher_takes_its_ranks_and_passfile_with_it_and_its_attempt_is_fenced(
        db_url, pg_admin_url, sentinel, tmp_path):
    with psycopg.connect(db_url, autocommit=True) as conn:
        seed_samples(conn, rows=400, dim=8, classes=3)
        run = planned_run(conn, world_size=2, epochs=5000, batch_size=16, hidden_sizes=[8])
    with password_role(pg_admin_url, sentinel) as (role, _):  # the ranks need the password: a passfile is made
        url = with_password(db_url, sentinel).replace("://postgres:", f"://{role}:", 1)
        with open(tmp_path / "launcher.log", "w") as output:
            task = subprocess.Popen([sys.executable, "-c", LAUNCHER, run.run_id], cwd=REPO, stdin=subprocess.PIPE,
                                    stdout=output, stderr=subprocess.STDOUT, text=True)
            task.stdin.write(url + "\n")
            task.stdin.close()
        try:
            wait_for(lambda: epochs_recorded(db_url, run.run_id) >= 2 or task.poll() is not None, 180,
                     "the ranks to train")
            assert task.poll() is None, (tmp_path / "launcher.log").read_text()
            descendants = psutil.Process(task.pid).children(recursive=True)
            ranks = [p for p in descendants if p.cmdline()[1:3] == ["-m", "trainer"] and run.run_id in p.cmdline()]
            assert len(ranks) == 2, [p.cmdline() for p in descendants]
            passfiles = {passfile_of(rank) for rank in ranks}
        finally:
            task.send_signal(signal.SIGKILL)  # no on_kill, no finally: what an OOM kill or a lost worker does
            task.wait()

    # Generous: Horovod gives the ranks 5 s to stop after SIGTERM before it kills them.
    wait_for(lambda: not any(alive(p) for p in descendants), 30, "the ranks and horovodrun to stop")
    (passfile,) = passfiles
    wait_for(lambda: not os.path.exists(passfile), 10, f"the passfile {passfile} to be gone")
    assert not glob.glob(os.path.join(tempfile.gettempdir(), f"pgtrain-secret-{task.pid}-*"))
    recorded = epochs_recorded(db_url, run.run_id)
    time.sleep(1)
    assert epochs_recorded(db_url, run.run_id) == recorded  # nobody trains on

    with connect(db_url) as conn:
        killed = record.get_run(conn, run.run_id).attempt
        assert killed == 1
        assert record.begin_attempt(conn, run.run_id) == 2  # the retry
    with connect(db_url, attempt=killed) as stale:
        assert_refused(stale, lambda c: record.record_epoch(c, run.run_id, 99, {"train_loss": 1.0, "seconds": 1.0}),
                       killed, run.run_id)
        assert_refused(stale, lambda c: record.record_verdict(c, run.run_id, "failed", "late"), killed, run.run_id)
