"""The trainer image built for real (`make image-cpu`: trainer_image/Dockerfile's CPU variant, buildah on a local
Debian base), then Horovod's build check, the operator's SSH modes and a 2-rank training inside it against the
test PostgreSQL, the run planned and its version committed from here."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest

from pgtrain.config.params import DEFAULT_ENSEMBLE_MEMBERS
from pgtrain.core.database_url import DATABASE_URL_FILE_ENV
from pgtrain.launch.attempt import start_attempt
from pgtrain.launch.mpijob.api import DATABASE_MOUNT_PATH, DATABASE_URL_FILE, NON_ROOT_WORKER_COMMAND, SSH_PORT
from pgtrain.launch.trainer_command import horovodrun_options, trainer_argv
from pgtrain.models.spec import ModelSpec
from pgtrain.runs import record
from pgtrain.store.model_store import commit_run, load_tensors
from tests.integration.image.buildah_support import build, output_of, run_in, working_container
from tests.support import planned_run, seed_samples

pytestmark = pytest.mark.image

BUILD_SECONDS = 1800  # cold (Debian base, apt, torch): 2.5 to 4.5 minutes on 2 busy cores; unchanged: seconds


@pytest.fixture(scope="module")
def image() -> str:
    return build("build_cpu_image.sh", sys.executable, timeout=BUILD_SECONDS)


@pytest.fixture(scope="module")
def container(image: str) -> Iterator[str]:
    with working_container(image) as name:
        yield name


def test_horovod_is_built_with_torch_and_gloo(container):
    result = run_in(container, "horovodrun", "--check-build")
    assert result.returncode == 0, output_of(result)
    assert "[X] PyTorch" in result.stdout and "[X] Gloo" in result.stdout
    torch = run_in(container, "python", "-c", "import torch; print(torch.__version__)")
    assert torch.stdout.strip() == "2.13.0+cpu", output_of(torch)  # the CPU build, not PyPI's CUDA one


def free_port() -> int:
    with contextlib.closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_ssh_on_port_2222_for_root_and_for_mpiuser(container):
    """Root mode: sshd and ssh on 2222. Non-root mode (runAsUser 1000, sshAuthMountPath /home/mpiuser/.ssh): the
    MPIJob's non-root worker command starts mpiuser's sshd with the mounted key and lets the launcher's key in."""
    root = run_in(container, "bash", "-c", "ssh -G worker | grep '^port '; /usr/sbin/sshd -T | grep '^port '")
    assert root.stdout.split() == ["port", "2222", "port", "2222"], output_of(root)
    keys = Path(tempfile.mkdtemp(prefix="pgtrain-image-ssh-"))
    try:
        os.chown(keys, 1000, 1000)  # as the operator's Secret, readable by the pod's user
        port = free_port()  # host network: 2222 may be taken on this machine (root's port is checked above)
        # The operator's Secret holds one key pair: the host key, the client key and the authorized key.
        # The MPIJob's non-root worker command, as rendered, on a free port of the host network.
        worker = " ".join(str(port) if part == str(SSH_PORT) else part for part in NON_ROOT_WORKER_COMMAND)
        script = ("set -e; cd /home/mpiuser; id -un; ssh-keygen -q -t rsa -N '' -f .ssh/id_rsa; "
                  "cp .ssh/id_rsa.pub .ssh/authorized_keys; "
                  f"{worker} & "
                  # sshd writes its pid file once it listens
                  "for i in $(seq 600); do [ -s sshd.pid ] && break; sleep 0.1; done; "
                  f"ssh -p {port} -o BatchMode=yes 127.0.0.1 'id -un; id -u'; kill $(cat sshd.pid)")
        result = run_in(container, "bash", "-c", script, user="mpiuser", volumes=(f"{keys}:/home/mpiuser/.ssh",))
    finally:
        shutil.rmtree(keys)
    assert result.returncode == 0, output_of(result)
    assert result.stdout.split() == ["mpiuser", "mpiuser", "1000"], output_of(result)


def database_volumes(db_url: str) -> list[str]:
    """The test database's unix socket directory, if the URL names one (a TCP host is reached over the host's
    network)."""
    query = parse_qs(urlsplit(db_url).query)
    hosts = query.get("host", []) + ([urlsplit(db_url).hostname] if urlsplit(db_url).hostname else [])
    return [f"{host}:{host}" for host in hosts if host and host.startswith("/")]


def test_two_ranks_train_inside_the_image_and_the_version_commits(container, autocommit, db_url):
    seed_samples(autocommit, rows=400, dim=16, classes=4)
    run = planned_run(autocommit, world_size=2, epochs=3, hidden_sizes=[12])
    attempt = start_attempt(autocommit, run.run_id)
    # The URL reaches the ranks as the MPIJob hands it: a file at DATABASE_URL_FILE, its path in the environment.
    secret = Path(tempfile.mkdtemp(prefix="pgtrain-image-secret-"))
    try:
        (secret / Path(DATABASE_URL_FILE).name).write_text(db_url)
        command = ["horovodrun", "--gloo", "-np", "2", "-H", "localhost:2", *horovodrun_options(),
                   *trainer_argv(run.run_id, attempt)]
        # /var/run is a link to /run in the image: buildah mounts a volume only at the link's target
        mount_path = DATABASE_MOUNT_PATH.replace("/var/run/", "/run/", 1)
        result = run_in(container, *command, volumes=(f"{secret}:{mount_path}:ro",
                                                      *database_volumes(db_url)),
                        env={DATABASE_URL_FILE_ENV: DATABASE_URL_FILE})
    finally:
        shutil.rmtree(secret)
    output = output_of(result)
    assert result.returncode == 0, output[-6000:]
    assert "rank 0/2" in output and "rank 1/2" in output and "epoch 3/3" in output
    assert db_url not in output
    assert record.get_run(autocommit, run.run_id).status == "trained"
    metrics = record.epoch_metrics(autocommit, run.run_id)
    assert [m["epoch"] for m in metrics] == [1, 2, 3] and metrics[-1]["train_loss"] < metrics[0]["train_loss"]

    committed = commit_run(autocommit, run.run_id, owner={"task_id": "test"})
    assert committed.created
    assert record.get_run(autocommit, run.run_id).status == "committed"
    parameters = load_tensors(autocommit, committed.model_name, committed.version)[1]
    spec = ModelSpec(16, (12,), 4, members=DEFAULT_ENSEMBLE_MEMBERS)  # the default layout
    assert {n: a.shape for n, a in parameters.items()} == spec.parameter_shapes()
    assert all(np.isfinite(a).all() for a in parameters.values())
