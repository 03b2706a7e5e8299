"""The MPI Operator's API as pgtrain uses it: the resource, the labels it puts on pods, the paths it mounts,
and the names and defaults of what pgtrain adds (the database Secret's volume, the trainer container)."""

from __future__ import annotations

import re

from pgtrain import __version__

API_GROUP = "kubeflow.org"
API_VERSION = "v2beta1"
KIND = "MPIJob"
PLURAL = "mpijobs"
MPI_OPERATOR_VERSION = "v0.6.0"  # first release with launcherCreationPolicy; see docs/kubernetes.md

# Labels the MPI Operator puts on the pods it creates.
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
# Kueue's label naming the LocalQueue a job waits in.
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"

GPU_RESOURCE = "nvidia.com/gpu"
CONTAINER_NAME = "trainer"
HOSTFILE = "/etc/mpi/hostfile"  # the MPI Operator mounts its <job>-config ConfigMap at /etc/mpi
SSH_AUTH_MOUNT_PATH = "/root/.ssh"
# The Secret with the database URL is mounted as a file here (never an env var: Horovod's Gloo launcher
# writes every env var into the ranks' `sh -c` command lines, where `ps` shows them).
DATABASE_VOLUME = "pgtrain-database"
DATABASE_MOUNT_PATH = "/var/run/secrets/pgtrain"
DATABASE_URL_FILE = f"{DATABASE_MOUNT_PATH}/url"
WORKER_COMMAND = ["/usr/sbin/sshd", "-De"]  # workers only serve SSH; the launcher starts ranks on them
RUN_ID_ANNOTATION = "pgtrain.io/training-run-id"
# The MPI Operator only accepts these (pkg/apis/kubeflow/validation); the launcher is a batch Job.
RESTART_POLICIES = ("Never", "OnFailure")

DEFAULT_IMAGE = f"pgtrain-trainer:{__version__}"
DEFAULT_SECRET_NAME = "pgtrain-db"
DEFAULT_SECRET_KEY = "url"

DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_LABEL_MAX = 63
