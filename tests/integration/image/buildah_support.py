"""Build a trainer image with its script and run commands in a working container of it (buildah, no daemon)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import REPO

# The build scripts' cache (PGTRAIN_IMAGE_CACHE, default ~/.cache/pgtrain): a second run reuses the image.
CACHE = Path(os.environ.get("PGTRAIN_IMAGE_CACHE") or Path.home() / ".cache" / "pgtrain")
# A pod's hostname resolves (the kubelet writes it into /etc/hosts); Horovod's Gloo process sets look it up
# (a name that does not resolve crashes hvd.init), so the container gets one that does, as a pod has.
HOSTNAME = "trainer-pod"


def buildah(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "CONTAINERS_STORAGE_CONF": str(CACHE / "buildah" / "storage.conf")}
    return subprocess.run(["buildah", *args], env=env, capture_output=True, text=True, timeout=timeout)


def build(script: str, *args: str, timeout: float) -> str:
    """trainer_image/SCRIPT's image (built, or kept when built from the same inputs already); its name."""
    for tool in ("buildah", "mmdebstrap"):
        assert shutil.which(tool), f"{tool} is missing: `make image-tools` installs it (make test does)"
    result = subprocess.run(["bash", str(REPO / "trainer_image" / script), *args],
                            env={**os.environ, "PGTRAIN_IMAGE_CACHE": str(CACHE)},
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return result.stdout.splitlines()[-1]


@contextlib.contextmanager
def working_container(image: str) -> Iterator[str]:
    """One working container of the image (vfs copies the whole image for each); removed after."""
    created = buildah("from", "--pull=never", f"--add-host={HOSTNAME}:127.0.0.1", image)
    assert created.returncode == 0, created.stderr
    name = created.stdout.strip().splitlines()[-1]
    try:
        yield name
    finally:
        buildah("rm", name)


def run_in(container: str, *command: str, user: str | None = None, volumes: tuple[str, ...] = (),
           env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """``command`` in the container, on the host's network (the test PostgreSQL, a port on localhost)."""
    options = ["--isolation", "chroot", "--network", "host", "--hostname", HOSTNAME]
    options += ["--user", user] if user else []
    options += [f"--volume={volume}" for volume in volumes]
    options += [f"--env={name}={value}" for name, value in (env or {}).items()]
    return buildah("run", *options, container, "--", *command, timeout=timeout)


def output_of(result: subprocess.CompletedProcess) -> str:
    return result.stdout + result.stderr
