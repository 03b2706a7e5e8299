"""The GPU trainer image built for real (`make image-gpu`: trainer_image/Dockerfile.gpu, buildah on a Debian 13
base, torch's CUDA wheels and Horovod compiled with NCCL), then checked inside it without a GPU: Horovod's build
lists NCCL and PyTorch, torch has NCCL and the CUDA version the pins select, one NCCL library serves both, and
the final stage ships the run-time only."""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterator

import pytest

from tests.conftest import REPO
from tests.integration.image.buildah_support import build, output_of, run_in, working_container

# Cold: Debian base, apt, 3 GB of CUDA wheels, Horovod's CUDA build (about 25 minutes on 2 busy cores);
# unchanged inputs: seconds. The fixture's build runs in the first test's time.
BUILD_SECONDS = 3600
pytestmark = [pytest.mark.image_gpu, pytest.mark.timeout(BUILD_SECONDS + 600)]


@pytest.fixture(scope="module")
def container() -> Iterator[str]:
    with working_container(build("build_gpu_image.sh", timeout=BUILD_SECONDS)) as name:
        yield name


def pinned_cuda() -> str:
    """The CUDA version of PyPI's torch wheel at constraints.txt's pin, as torch_builds.toml records it."""
    torch_version = re.search(r"^torch==([\d.]+)$", (REPO / "constraints.txt").read_text(), re.MULTILINE).group(1)
    builds = tomllib.loads((REPO / "trainer_image" / "torch_builds.toml").read_text())
    return builds[torch_version]["variants"]["cu130"]["cuda"]


def test_horovod_has_nccl_and_torch_shares_its_one_nccl_library(container):
    result = run_in(container, "python", "/opt/pgtrain/trainer_image/check_gpu_image.py",
                    "/opt/pgtrain/trainer_image/torch_builds.toml", "cu130")
    assert result.returncode == 0, output_of(result)
    found = json.loads(result.stdout.splitlines()[-1])
    assert {"PyTorch", "NCCL", "Gloo", "MPI"} <= set(found["horovod_built_with"]), found
    assert found["torch_cuda"] == pinned_cuda() == "13.0", found
    assert found["nccl_available"] is True
    # one libnccl.so*, the NCCL wheel's, and it is the one both torch and Horovod's extension map
    assert len(found["nccl_files"]) == 1 and "/nvidia/" in found["nccl_files"][0], found
    assert found["nccl_loaded"] == found["nccl_files"], found


def test_horovod_torch_imports_and_was_compiled_against_the_nccl_torch_loads(container):
    """horovod.torch imports, and the NCCL headers Horovod was compiled with are the version of torch's NCCL."""
    probe = ("import horovod.torch as hvd, torch; major, minor, patch = torch.cuda.nccl.version(); "
             "print(hvd.nccl_built(), major * 10000 + minor * 100 + patch)")
    imported = run_in(container, "python", "-c", probe)
    assert imported.returncode == 0, output_of(imported)
    horovods, torchs = imported.stdout.split()[-2:]
    assert horovods == torchs and int(torchs) >= 22000, output_of(imported)  # NCCL 2.20 or newer, the same one
    check = run_in(container, "horovodrun", "--check-build")
    assert "[X] NCCL" in check.stdout and "[X] PyTorch" in check.stdout, output_of(check)


def test_the_final_stage_ships_no_compiler_nvcc_or_headers(container):
    """No nvcc, compiler or -dev package, and none of the CUDA wheels' or torch's headers (triton keeps its own:
    its run-time compiles launchers with them, for torch.compile)."""
    script = ("command -v gcc cc nvcc || true; "
              "find /opt/venv -path '*/bin/nvcc' -o -name '*.h' -path '*/site-packages/nvidia/*' "
              "-o -path '*/torch/include' "
              "| head -n5; dpkg -l | awk '/^ii/ && $2 ~ /-dev(:|$)/ {print $2}'")
    result = run_in(container, "bash", "-c", script)
    assert result.returncode == 0, output_of(result)
    assert result.stdout.split() == [], result.stdout
