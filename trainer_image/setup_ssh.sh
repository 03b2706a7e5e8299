#!/usr/bin/env bash
# Run as root while building a trainer image (both Dockerfiles): SSH as the MPI Operator expects, and its user.
# usage: setup_ssh.sh SSH_PORT
#
# The operator mounts the job's SSH keys from a Secret at sshAuthMountPath (/root/.ssh, or /home/mpiuser/.ssh
# in non-root mode): no host-key prompts between pods, no permission checks on the mounted files, and everyone
# on SSH_PORT (mpiuser's sshd cannot bind port 22).
set -euo pipefail
port=${1:?usage: setup_ssh.sh SSH_PORT}
mkdir -p /var/run/sshd
sed -i 's/[ #]\(.*StrictHostKeyChecking \).*/ \1no/g' /etc/ssh/ssh_config
printf '    UserKnownHostsFile /dev/null\n    Port %s\n' "$port" >> /etc/ssh/ssh_config
sed -i 's/#\(StrictModes \).*/\1no/g' /etc/ssh/sshd_config
echo "Port $port" >> /etc/ssh/sshd_config
# Non-root mode (restricted Pod Security, runAsUser 1000): mpiuser runs sshd with the options the MPIJob's worker
# command gives (pgtrain.launch.mpijob.api.NON_ROOT_WORKER_COMMAND: the job's key as host key). Ubuntu bases hold
# a user `ubuntu` with uid 1000: mpiuser takes the uid the operator's examples use.
if id -u ubuntu >/dev/null 2>&1; then userdel --remove ubuntu; fi
useradd --create-home --uid 1000 --shell /bin/bash mpiuser
