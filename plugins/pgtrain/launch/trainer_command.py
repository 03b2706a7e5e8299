"""The trainer's command line, shared by the local launcher and the MPIJob launcher.

Everything else the trainer needs is in the run record (config snapshot, manifest); the database
URL comes from the environment (``PGTRAIN_DATABASE_URL``) or, in pods, from a file mounted from a Secret
(``PGTRAIN_DATABASE_URL_FILE``), never from the command line.
"""

from __future__ import annotations

from pgtrain.config.params import DEFAULT_COLLECTIVE_TIMEOUT

# horovodrun's own timeouts default to 30 s: a rank importing torch on a busy machine, or rank 0 writing a
# large checkpoint while the others wait in the next allreduce, takes longer than that and is not a failure.
HOROVODRUN_TIMEOUT_SECONDS = 600


def horovodrun_options() -> list[str]:
    """Options both launchers pass to horovodrun (before the trainer's command)."""
    seconds = str(HOROVODRUN_TIMEOUT_SECONDS)
    return ["--start-timeout", seconds, "--gloo-timeout-seconds", seconds]


def trainer_argv(run_id: str, attempt: int, python: str = "python", backend: str = "horovod",
                 collective_timeout: int = DEFAULT_COLLECTIVE_TIMEOUT) -> list[str]:
    """``attempt``: the run's train attempt (pgtrain.runs.record.begin_attempt); its writes are fenced by it.
    ``backend``: ``horovod`` (the trainer's default: no option) or ``torch``, resolved (pgtrain.launch.backends)."""
    options = [] if backend == "horovod" else ["--backend", backend,
                                               "--collective-timeout", str(int(collective_timeout))]
    return [python, "-m", "trainer", *options, "--run-id", run_id, "--attempt", str(int(attempt))]
