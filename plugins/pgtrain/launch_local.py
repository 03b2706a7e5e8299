"""``launcher=local``: run the trainer under ``horovodrun --gloo`` on this machine, output streamed to a logger."""

from __future__ import annotations

import collections
import logging
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from pgtrain.errors import INPUT_ERROR_MARK, TrainingFailed, TrainingInputError
from pgtrain.trainer_command import DATABASE_URL_ENV, trainer_argv

TAIL_LINES = 40


def horovodrun_path() -> str:
    beside_python = Path(sys.executable).parent / "horovodrun"
    found = str(beside_python) if beside_python.exists() else shutil.which("horovodrun")
    if not found:
        raise TrainingFailed(
            "horovodrun is not installed in this environment; run `make install` (it builds Horovod) "
            "or use launcher=kubernetes"
        )
    return found


def local_command(run_id: str, world_size: int) -> list[str]:
    return [
        horovodrun_path(), "--gloo", "-np", str(world_size), "-H", f"localhost:{world_size}",
        *trainer_argv(run_id, python=sys.executable),
    ]


def run_local(run_id: str, world_size: int, database_url: str, log: logging.Logger,
              timeout_seconds: float | None = None) -> None:
    """Run the job; every output line goes to ``log`` as it comes. A failure raises with the output's tail.

    ``timeout_seconds``: past it the ranks are killed and TrainingFailed is raised.
    """
    command = local_command(run_id, world_size)
    log.info("starting %d Horovod ranks: %s", world_size, " ".join(command))
    env = {**os.environ, DATABASE_URL_ENV: database_url, "PYTHONUNBUFFERED": "1"}
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    timed_out = threading.Event()
    with subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
        start_new_session=True,
    ) as process:
        # Killing the group closes the pipe, which ends the read loop below.
        watchdog = threading.Timer(timeout_seconds or 0, lambda: (timed_out.set(), _kill_group(process)))
        if timeout_seconds:
            watchdog.start()
        try:
            assert process.stdout is not None
            for line in process.stdout:
                line = line.rstrip("\n")
                tail.append(line)
                log.info("%s", line)
            returncode = process.wait()
        except BaseException:
            _kill_group(process)
            raise
        finally:
            watchdog.cancel()
    if timed_out.is_set():
        raise TrainingFailed(
            f"the Horovod job of run {run_id} did not finish within {timeout_seconds:g} s and was stopped; "
            "last output lines:\n" + "\n".join(tail)
        )
    refusals = [line.split(INPUT_ERROR_MARK, 1)[1].strip() for line in tail if INPUT_ERROR_MARK in line]
    if returncode != 0 and refusals:
        raise TrainingInputError(f"run {run_id} cannot train on its planned input: {refusals[0]}")
    if returncode != 0:
        raise TrainingFailed(
            f"the Horovod job of run {run_id} exited with status {returncode}; last output lines:\n"
            + "\n".join(tail)
        )


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, 9)
    except ProcessLookupError:
        pass
