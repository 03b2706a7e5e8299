"""The MPIJob launcher's command: ``horovodrun`` for the horovod backend, ``mpirun`` for torch (behind the
rendezvous launcher, pgtrain.launch.mpijob.rendezvous); the manifest around it is pgtrain.launch.mpijob.spec.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pgtrain.config.params import DEFAULT_COLLECTIVE_TIMEOUT
from pgtrain.core.database_url import DATABASE_URL_FILE_ENV
from pgtrain.launch.mpijob.api import GPUS_PER_WORKER_ENV, HOSTFILE, SSH_PORT
from pgtrain.launch.mpijob.rendezvous import MASTER_ADDR
from pgtrain.launch.trainer_command import horovodrun_options, trainer_argv


def launcher_command(run_id: str, world_size: int, attempt: int, backend: str = "horovod",
                     collective_timeout: int = DEFAULT_COLLECTIVE_TIMEOUT, env_names: Sequence[str] = (),
                     as_root: bool = True, socket_ifname: str | None = None) -> list[str]:
    """``horovodrun`` over the MPI Operator's hostfile: MPI (+NCCL) in the GPU image, Gloo where MPI is absent.

    horovodrun passes the launcher's environment to every rank (``mpirun -x NAME``, or ``env K=V`` on
    the ranks' command lines with Gloo); the database URL is not in it, only the path of the file the
    Secret is mounted as on every pod. horovodrun hands ``--ssh-port`` (the workers' sshd, SSH_PORT) to its SSH
    check, to mpirun (``plm_rsh_args``) and to Gloo's remote commands.

    ``torch``: ``mpirun`` itself (torch.distributed needs only the processes): it passes the pod's environment the
    ranks need by name (``-x``: the URL file's path, the author's ``env_names``; their values are the same on every
    pod), and each rank finds its place in ``OMPI_COMM_WORLD_*`` and its rendezvous in ``MASTER_ADDR``: the
    hostfile's first host, which the launcher reads (pgtrain.launch.mpijob.rendezvous: the workers have no hostfile).

    ``socket_ifname``: the author's NCCL_SOCKET_IFNAME. horovodrun sets NCCL_SOCKET_IFNAME on the ranks itself (the
    interfaces common to all hosts, or its ``--network-interfaces``), over the environment's; exact interface names
    become its ``--network-interfaces``, so that its choice is the author's (NCCL's prefix and ``^``/``=`` forms
    name no interface horovodrun knows, and are left to it).
    """
    if backend == "torch":
        passed = [DATABASE_URL_FILE_ENV, "PYTHONUNBUFFERED", GPUS_PER_WORKER_ENV, "PATH", MASTER_ADDR, *env_names]
        return ["python", "-m", "pgtrain.launch.mpijob.rendezvous",
                "mpirun", *(["--allow-run-as-root"] if as_root else []), "-np", str(world_size),
                "--hostfile", HOSTFILE, "--bind-to", "none", "--map-by", "slot",
                "--mca", "plm_rsh_args", f"-p {SSH_PORT}",
                *(option for name in dict.fromkeys(passed) for option in ("-x", name)),
                *trainer_argv(run_id, attempt, backend=backend, collective_timeout=collective_timeout)]
    interfaces = ["--network-interfaces", socket_ifname] if socket_ifname and _EXACT_IFNAMES.match(socket_ifname) \
        else []
    return ["horovodrun", "-np", str(world_size), "--hostfile", HOSTFILE, "--ssh-port", str(SSH_PORT),
            *horovodrun_options(), *interfaces,
            *trainer_argv(run_id, attempt)]


# NCCL_SOCKET_IFNAME as exact interface names (eth0, or ib0,eth0), not NCCL's prefixes or ^/= forms.
_EXACT_IFNAMES = re.compile(r"^[A-Za-z0-9_.:@-]+[0-9](,[A-Za-z0-9_.:@-]+[0-9])*$")
