"""The MPI Operator's API as pgtrain uses it: the resource, the labels it puts on pods, the paths it mounts,
and the names and defaults of what pgtrain adds (the database Secret's volume, the trainer container)."""

from __future__ import annotations

import re

API_GROUP = "kubeflow.org"
API_VERSION = "v2beta1"
KIND = "MPIJob"
PLURAL = "mpijobs"
MPI_OPERATOR_VERSION = "v0.6.0"  # first release with launcherCreationPolicy; see docs/kubernetes.md

# Labels the MPI Operator puts on the pods it creates.
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"

GPU_RESOURCE = "nvidia.com/gpu"
CONTAINER_NAME = "trainer"
HOSTFILE = "/etc/mpi/hostfile"  # the MPI Operator mounts its <job>-config ConfigMap at /etc/mpi
SSH_AUTH_MOUNT_PATH = "/root/.ssh"
# The Secret with the database URL is mounted as a file here (never an env var: Horovod's Gloo launcher
# writes every env var into the ranks' `sh -c` command lines, where `ps` shows them).
DATABASE_VOLUME = "pgtrain-database"
DATABASE_MOUNT_PATH = "/var/run/secrets/pgtrain"
DATABASE_URL_FILE = f"{DATABASE_MOUNT_PATH}/url"
# The workers' sshd port in both modes (trainer_image/Dockerfile's SSH_PORT, as the MPI Operator's own images):
# unprivileged, so one image serves root and non-root pods; horovodrun --ssh-port reaches it.
SSH_PORT = 2222
WORKER_COMMAND = ["/usr/sbin/sshd", "-De", "-p", str(SSH_PORT)]  # workers only serve SSH; the launcher starts ranks
# Non-root mode (restricted Pod Security), as the MPI Operator's examples/v2beta1/pi: the image's user NON_ROOT_USER
# (uid/gid NON_ROOT_UID, home NON_ROOT_HOME; trainer_image/Dockerfile creates it) runs sshd on an unprivileged
# port (SSH_PORT) with the job's key (mounted at NON_ROOT_HOME/.ssh) as its host key.
NON_ROOT_USER = "mpiuser"
NON_ROOT_UID = 1000
NON_ROOT_HOME = f"/home/{NON_ROOT_USER}"
NON_ROOT_SSH_AUTH_MOUNT_PATH = f"{NON_ROOT_HOME}/.ssh"
# Options on the command line rather than an sshd_config of the image's: the image only needs the user.
# UsePAM=no as in the pi example's config (PAM's account checks need root); StrictModes=no because the key
# files are the Secret's (owned by root).
NON_ROOT_WORKER_COMMAND = [
    "/usr/sbin/sshd", "-De", "-p", str(SSH_PORT),
    "-o", f"HostKey={NON_ROOT_SSH_AUTH_MOUNT_PATH}/id_rsa", "-o", f"PidFile={NON_ROOT_HOME}/sshd.pid",
    "-o", "StrictModes=no", "-o", "UsePAM=no",
]
# A memory-backed emptyDir at /dev/shm on the workers: NCCL's shared-memory transport and torch's
# inter-process tensors live there, and a container's own /dev/shm is often 64 MiB.
SHM_VOLUME = "pgtrain-shm"
SHM_MOUNT_PATH = "/dev/shm"
# Kueue admits an MPIJob by this label on its metadata (its webhook suspends the job until admitted).
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
RUN_ID_ANNOTATION = "pgtrain.io/training-run-id"
# The GPUs each worker pod was given (its nvidia.com/gpu), in the trainer containers' environment: the launcher passes
# it to every rank, which refuses to train on the CPU while it holds GPUs (trainer.device.select_device).
GPUS_PER_WORKER_ENV = "PGTRAIN_GPUS_PER_WORKER"
# The MPI Operator only accepts these (pkg/apis/kubeflow/validation); the launcher is a batch Job.
RESTART_POLICIES = ("Never", "OnFailure")

DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_LABEL_MAX = 63
