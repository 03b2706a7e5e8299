"""``python -m pgtrain.launch.horovodrun --gloo ...``: horovodrun as the local launcher runs it, minus one probe.

``horovodrun --gloo`` first asks whether Horovod was built with Gloo by importing each framework's Horovod
extension in a forked process (``horovod.common.util.gloo_built``); for PyTorch that is a whole
``import torch`` (seconds on a small machine) before any rank starts, and the
ranks then import torch again. `make install` checked the build (``horovodrun --check-build``), and a rank
whose Horovod lacks Gloo still fails at ``hvd.init()`` with Horovod's own message, so this entry point
answers that probe without the import and otherwise is horovodrun itself (same arguments, same code).

It also holds the ranks' passfile when the local launcher hands it one as an inherited descriptor
(``PGTRAIN_PASSFILE_FD``): the ranks open it as ``/proc/<this pid>/fd/N``, so it exists exactly as long as
this process, which dies with the task. (This process, not the task, names it: Airflow makes the task's
process non-dumpable, and then no other process may open its ``/proc/PID/fd``.)
"""

from __future__ import annotations

import os
import sys

PASSFILE_FD_ENV = "PGTRAIN_PASSFILE_FD"
PASSFILE_ENV = "PGPASSFILE"


def name_passfile() -> None:
    """Point the ranks' PGPASSFILE at the inherited descriptor the local launcher names (PASSFILE_FD_ENV), if any:
    a path through this process, which must outlive the ranks (pgtrain.launch.ranks does the same)."""
    passfile_fd = os.environ.pop(PASSFILE_FD_ENV, None)
    if passfile_fd is not None:
        os.environ[PASSFILE_ENV] = f"/proc/{os.getpid()}/fd/{int(passfile_fd)}"


def main(argv: list[str] | None = None) -> int:
    from horovod.runner import launch

    arguments = sys.argv[1:] if argv is None else argv
    name_passfile()
    if "--gloo" in arguments:
        launch.gloo_built = lambda verbose=False: True  # the probe run_controller makes before gloo_run
    sys.argv = ["horovodrun", *arguments]
    launch.run_commandline()
    return 0


if __name__ == "__main__":
    sys.exit(main())
