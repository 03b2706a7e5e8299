"""``python -m pgtrain.launch.ranks N COMMAND...``: N local ranks of the ``torch`` backend, without horovodrun.

Each rank is ``COMMAND`` with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and the rendezvous
(``MASTER_ADDR`` 127.0.0.1, ``MASTER_PORT`` a free port) in its environment, its output on this process's. Once a
rank fails (an exit status other than 0, a signal), the others are stopped (SIGTERM, then SIGKILL after
``GRACE_SECONDS``) and this process exits with that rank's status; a signal to this process stops them all. Like
``pgtrain.launch.horovodrun`` it holds the ranks' passfile (the local launcher's inherited descriptor), and the ranks
die with it (PR_SET_PDEATHSIG), as it dies with the local launcher.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from pgtrain.launch.horovodrun import name_passfile
from pgtrain.launch.lifetime import preexec_die_with_this_process

GRACE_SECONDS = 5.0
POLL_SECONDS = 0.1


def free_port() -> int:
    """A TCP port free on the loopback now (rank 0 binds it a moment later)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rank_environment(environ: Mapping[str, str], rank: int, world_size: int, port: int) -> dict[str, str]:
    return {**environ, "RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def exit_status(returncode: int) -> int:
    """A rank's status as this process's exit status (a signal as the shell says it: 128 + its number)."""
    return 128 - returncode if returncode < 0 else returncode


def run_ranks(world_size: int, command: Sequence[str], environ: Mapping[str, str] | None = None) -> int:
    """Start ``world_size`` ranks of ``command`` and wait for all of them; the first failure's status, else 0."""
    environ = os.environ if environ is None else environ
    port = free_port()
    preexec = preexec_die_with_this_process()
    ranks = [subprocess.Popen(list(command), env=rank_environment(environ, rank, world_size, port),
                              preexec_fn=preexec) for rank in range(world_size)]
    stopped = []

    def stop(signum: int, _frame: object) -> None:
        stopped.append(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    failed: int | None = None
    while None in [p.poll() for p in ranks]:  # every rank polled: its status is read once it has exited
        codes = [p.returncode for p in ranks if p.returncode not in (None, 0)]
        if codes or stopped:
            failed = exit_status(codes[0]) if codes else 128 + stopped[0]
            break
        time.sleep(POLL_SECONDS)
    if failed is not None:
        for p in ranks:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + GRACE_SECONDS
        for p in ranks:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return failed
    codes = [p.returncode for p in ranks if p.returncode != 0]
    return exit_status(codes[0]) if codes else 0


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if len(arguments) < 2 or not arguments[0].isdigit() or int(arguments[0]) < 1:
        print("usage: python -m pgtrain.launch.ranks N COMMAND...", file=sys.stderr)
        return 2
    name_passfile()
    return run_ranks(int(arguments[0]), arguments[1:])


if __name__ == "__main__":
    sys.exit(main())
