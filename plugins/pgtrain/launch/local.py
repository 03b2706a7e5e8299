"""``launcher=local``: run the trainer's ranks on this machine, output streamed to a logger: under
``horovodrun --gloo`` for the ``horovod`` backend, under ``pgtrain.launch.ranks`` for ``torch``
(``pgtrain.launch.backends`` resolves the author's ``auto``).

What reaches the ranks: an allow-listed environment (no secret of the worker's), the database URL
without its password, and the password in a 0600 passfile (PGPASSFILE) that exists only as long as the
job: on Linux a memfd (nothing on disk, gone with the task however it dies), elsewhere a file in a private
directory removed when the job ends. Horovod's Gloo launcher writes every exported variable into a
``sh -c`` command line that any user can read with ``ps``, so nothing secret may be exported.

The ranks die with their launcher: horovodrun (or pgtrain.launch.ranks) gets SIGKILL when the process that
started it dies (PR_SET_PDEATHSIG), and then stops the ranks it started; each rank also sets its own.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import psycopg

from pgtrain.config.params import TrainingConfig
from pgtrain.core.database_url import DATABASE_URL_ENV
from pgtrain.core.db import connect, split_password
from pgtrain.core.errors import ClaimLost, ConfigError, TrainingFailed, TrainingInputError
from pgtrain.launch import backends
from pgtrain.launch.attempt import claim_lost, start_attempt
from pgtrain.launch.horovodrun import PASSFILE_ENV, PASSFILE_FD_ENV
from pgtrain.launch.lifetime import memory_file, preexec_die_with_this_process
from pgtrain.launch.trainer_command import horovodrun_options, trainer_argv
from pgtrain.runs import record

if TYPE_CHECKING:
    from pgtrain.store.locks import Lease

TAIL_LINES = 40
WATCH_INTERVAL = 0.5  # seconds between the watchdog's looks at the job's timeout and claim
# The worker's environment the ranks may see: what Python, horovodrun, Gloo/NCCL, the BLAS libraries
# and libpq need to behave as they do here. Anything else (credentials, tokens, PGPASSWORD) stays out.
PASSED_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "PYTHONPATH", "PYTHONUNBUFFERED",
    "PYTHONHASHSEED", "VIRTUAL_ENV", "LD_LIBRARY_PATH",
    # libpq settings that are not secrets (PGPASSWORD is, and PGPASSFILE is ours)
    "PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGSSLMODE", "PGSSLROOTCERT", "PGSSLCERT",
    "PGSSLKEY", "PGSSLCRL", "PGSSLNEGOTIATION", "PGGSSENCMODE", "PGREQUIRESSL", "PGSERVICE", "PGSERVICEFILE",
    "PGSYSCONFDIR", "PGCONNECT_TIMEOUT", "PGTARGETSESSIONATTRS", "PGCLIENTENCODING", "PGTZ", "PGKRBSRVNAME",
})
PASSED_PREFIXES = ("LC_", "OMP_", "GOMP_", "MKL_", "KMP_", "OPENBLAS_", "HOROVOD_", "NCCL_", "GLOO_", "CUDA_",
                   "NVIDIA_")
_SECRET_DIR_PREFIX = "pgtrain-secret-"


def horovodrun_path() -> str:
    beside_python = Path(sys.executable).parent / "horovodrun"
    found = str(beside_python) if beside_python.exists() else shutil.which("horovodrun")
    if not found:
        raise TrainingFailed(
            "horovodrun is not installed in this environment; run `make install` (it builds Horovod) "
            "or use launcher=kubernetes"
        )
    return found


def local_command(run_id: str, world_size: int, attempt: int, backend: str = "horovod",
                  collective_timeout: int = TrainingConfig.collective_timeout) -> list[str]:
    """``horovod``: horovodrun through ``pgtrain.launch.horovodrun`` (the same launcher, without the import of torch
    it makes to probe the build: seconds of every train task on a small worker). ``torch``: ``world_size`` ranks
    under ``pgtrain.launch.ranks``. One rank of either: the trainer itself, ``--alone`` (no launcher process, no
    rendezvous: half a second and more of a small run's start; it trains exactly as one rank of the backend)."""
    if world_size == 1:
        return [*trainer_argv(run_id, attempt, sys.executable, backend, collective_timeout), "--alone"]
    if backend == "torch":
        return [sys.executable, "-m", "pgtrain.launch.ranks", str(world_size),
                *trainer_argv(run_id, attempt, sys.executable, backend, collective_timeout)]
    horovodrun_path()  # installed, or the clear error
    return [
        sys.executable, "-m", "pgtrain.launch.horovodrun", "--gloo", "-np", str(world_size),
        "-H", f"localhost:{world_size}",
        *horovodrun_options(), *trainer_argv(run_id, attempt, python=sys.executable),
    ]


class Passfile(NamedTuple):
    """Where the ranks find the password: ``environment`` names it to horovodrun, which must inherit ``fds``."""

    environment: dict[str, str]
    fds: tuple[int, ...] = ()


def rank_environment(environ: Mapping[str, str], database_url: str, passfile: Passfile | None) -> dict[str, str]:
    """The ranks' environment: the allow-listed part of ``environ``, the URL, the passfile (if any)."""
    env = {k: v for k, v in environ.items() if k in PASSED_NAMES or k.startswith(PASSED_PREFIXES)}
    env[DATABASE_URL_ENV] = database_url
    env["PYTHONUNBUFFERED"] = "1"
    if passfile is not None:
        env.update(passfile.environment)
    elif environ.get(PASSFILE_ENV):  # the worker's own passfile: a path, not a secret
        env[PASSFILE_ENV] = environ[PASSFILE_ENV]
    return env


@contextlib.contextmanager
def private_passfile(password: str | None) -> Iterator[Passfile | None]:
    """A libpq passfile holding ``password`` (mode 0600) for horovodrun's ranks, gone when the job is; None if no
    password. On Linux a memfd that only this process and horovodrun hold (horovodrun inherits it and names it to
    the ranks: pgtrain.launch.horovodrun), so a SIGKILLed task, whose horovodrun dies with it, leaves nothing.
    Elsewhere a file in a 0700 directory, removed on exit or, after a SIGKILL, by the next launch."""
    if password is None:
        yield None
        return
    if "\n" in password or "\r" in password:
        raise ConfigError("the training database password contains a line break, which a libpq passfile "
                          "cannot hold; choose another password")
    escaped = password.replace("\\", "\\\\").replace(":", "\\:")
    content = f"*:*:*:*:{escaped}\n".encode()  # only this run's ranks read it: any host, port, db, user
    with memory_file("pgtrain-pgpass", content) as fd:
        if fd is not None:
            yield Passfile({PASSFILE_FD_ENV: str(fd)}, (fd,))
            return
    _remove_stale_secret_dirs()
    directory = tempfile.mkdtemp(prefix=f"{_SECRET_DIR_PREFIX}{os.getpid()}-")  # mode 0700
    try:
        path = os.path.join(directory, "pgpass")
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as file:
            file.write(content)
        yield Passfile({PASSFILE_ENV: path})
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _remove_stale_secret_dirs() -> None:
    """Passfile directories of launchers that were killed (SIGKILL runs no cleanup): their pid is gone."""
    pattern = re.compile(rf"^{_SECRET_DIR_PREFIX}(\d+)-")
    for entry in Path(tempfile.gettempdir()).glob(f"{_SECRET_DIR_PREFIX}*"):
        match = pattern.match(entry.name)
        with contextlib.suppress(OSError):
            if match and entry.stat().st_uid == os.getuid() and not Path(f"/proc/{match.group(1)}").exists():
                shutil.rmtree(entry, ignore_errors=True)


def run_local(run_id: str, world_size: int, database_url: str, log: logging.Logger,
              timeout_seconds: float | None = None, claim: Lease | None = None) -> None:
    """Start a new attempt of the run and its job; every output line goes to ``log`` as it comes.

    A refused input (the trainer's recorded verdict) raises TrainingInputError with the trainer's
    reason; any other failure TrainingFailed with the reason, if any, and the output's tail.
    ``timeout_seconds``: past it the ranks are killed and TrainingFailed is raised. ``claim``: the model's training
    claim the job runs under; once its heartbeat finds it lost (another run may now train the model), the ranks are
    killed and TrainingFailed is raised, so that two jobs never go on training one model.
    """
    rank_url, password = split_password(database_url)
    password = password or os.environ.get("PGPASSWORD") or None  # the worker's libpq password reaches them too
    with connect(database_url) as conn:
        attempt = start_attempt(conn, run_id)
        config = record.get_run(conn, run_id).config
    with private_passfile(password) as passfile:
        environment = rank_environment(os.environ, rank_url, passfile)
        backend, why = backends.resolve(config.backend, sys.executable, environment)
        log.info("%s", why)
        command = local_command(run_id, world_size, attempt, backend, config.collective_timeout)
        log.info("starting %d %s ranks (attempt %d): %s", world_size, backend, attempt, " ".join(command))
        returncode, tail, stopped = _run(command, environment, log, timeout_seconds, passfile.fds if passfile else (),
                                         claim.lost_event if claim is not None else None)
    if stopped == "timeout":
        raise TrainingFailed(
            f"the {backend} job of run {run_id} did not finish within {timeout_seconds:g} s and was stopped; "
            "last output lines:\n" + "\n".join(tail)
        )
    if stopped == "claim lost":
        raise _claim_lost(database_url, run_id, claim, tail)
    if returncode == 0:
        return
    with connect(database_url) as conn:
        verdict = record.trainer_verdict(conn, run_id, attempt)
    if verdict is not None and verdict[0] == "refused":
        raise TrainingInputError(f"run {run_id} cannot train on its planned input: {verdict[1]}")
    raise TrainingFailed(
        f"the {backend} job of run {run_id} exited with status {returncode}"
        + (f": {verdict[1]}" if verdict else "") + "; last output lines:\n" + "\n".join(tail)
    )


def _claim_lost(database_url: str, run_id: str, claim: Lease, tail: list[str]) -> ClaimLost:
    """The error of a job stopped because its claim was lost, naming who took it (``attempt.claim_lost``)."""
    try:
        with connect(database_url) as conn:
            lost = claim_lost(conn, claim.name, run_id)
    except psycopg.Error as error:
        return ClaimLost(f"the training claim {claim.name} of run {run_id} was lost ({claim.lost}; who holds it now "
                         f"could not be read: {str(error).strip()}), so its job was stopped")
    if lost.superseded:  # its new try runs a job of its own
        return ClaimLost(f"{lost}; this try's job was stopped", superseded=True)
    return ClaimLost(f"{lost}; last output lines:\n" + "\n".join(tail))


def _run(command: list[str], env: dict[str, str], log: logging.Logger, timeout_seconds: float | None,
         pass_fds: tuple[int, ...], lost: threading.Event | None = None) -> tuple[int, list[str], str | None]:
    """(exit status, the last output lines, what stopped it: "timeout", "claim lost" or None)."""
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    stopped: list[str] = []
    ended = threading.Event()
    with subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
        # Between fork and exec the child only calls prctl and getppid: no lock another thread may hold.
        start_new_session=True, preexec_fn=preexec_die_with_this_process(), pass_fds=pass_fds,
    ) as process:
        # Killing the group closes the pipe, which ends the read loop below.
        watchdog = threading.Thread(target=_watch, args=(process, ended, timeout_seconds, lost, stopped),
                                    name="pgtrain-job-watchdog", daemon=True)
        if timeout_seconds or lost is not None:
            watchdog.start()
        try:
            assert process.stdout is not None
            for line in process.stdout:
                line = line.rstrip("\n")
                tail.append(line)
                log.info("%s", line)
        except BaseException:
            _kill_group(process)
            raise
        finally:
            ended.set()
            if watchdog.is_alive():
                watchdog.join()  # before the process is reaped: the watchdog never kills a reused pid's group
        returncode = process.wait()
    return returncode, list(tail), stopped[0] if stopped else None


def _watch(process: subprocess.Popen, ended: threading.Event, timeout_seconds: float | None,
           lost: threading.Event | None, stopped: list[str]) -> None:
    """Kill the job's process group once it runs past ``timeout_seconds`` or ``lost`` is set, noting why in
    ``stopped``; return when the job has ``ended``."""
    deadline = time.monotonic() + timeout_seconds if timeout_seconds else None
    while True:
        left = WATCH_INTERVAL if deadline is None else min(WATCH_INTERVAL, max(0.0, deadline - time.monotonic()))
        if ended.wait(left):
            return
        if lost is not None and lost.is_set():
            stopped.append("claim lost")
        elif deadline is not None and time.monotonic() >= deadline:
            stopped.append("timeout")
        else:
            continue
        _kill_group(process)
        return


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
