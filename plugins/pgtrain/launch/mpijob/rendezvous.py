"""``python -m pgtrain.launch.mpijob.rendezvous COMMAND...``: the torch backend's MPIJob launcher.

torch.distributed's ranks meet at rank 0's address. ``mpirun`` puts rank 0 on the first host of the MPI Operator's
hostfile, but the operator mounts that hostfile in the launcher pod only: a rank on a worker pod cannot read it.
So the launcher reads it, puts its first host in ``MASTER_ADDR`` (unless the author's environment set one) and
execs ``COMMAND`` (``mpirun ... -x MASTER_ADDR ...``), which hands it to every rank.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pgtrain.launch.mpijob.api import HOSTFILE

MASTER_ADDR = "MASTER_ADDR"
# The MPI Operator sets it in the launcher for Open MPI (to HOSTFILE)
HOSTFILE_ENV = "OMPI_MCA_orte_default_hostfile"


def first_host(hostfile: str) -> str | None:
    """The first host of an MPI hostfile (``host slots=N`` lines), None when it cannot be read or is empty."""
    try:
        lines = Path(hostfile).read_text().splitlines()
    except OSError:
        return None
    hosts = [line.split()[0] for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return hosts[0] if hosts else None


def main(argv: list[str] | None = None) -> int:
    command = sys.argv[1:] if argv is None else argv
    if not command:
        print("usage: python -m pgtrain.launch.mpijob.rendezvous COMMAND...", file=sys.stderr)
        return 2
    if not os.environ.get(MASTER_ADDR):
        hostfile = os.environ.get(HOSTFILE_ENV) or HOSTFILE
        host = first_host(hostfile)
        if host is None:
            print(f"the torch backend's launcher found no host in {hostfile} (the MPI Operator's hostfile, mounted "
                  "in the launcher pod): is this pod an MPIJob's launcher?", file=sys.stderr, flush=True)
            return 2
        os.environ[MASTER_ADDR] = host
    os.execvp(command[0], command)


if __name__ == "__main__":
    sys.exit(main())
