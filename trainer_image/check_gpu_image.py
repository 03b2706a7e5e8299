"""The GPU trainer image's own checks, none of which needs a GPU (trainer_image/Dockerfile.gpu runs them last;
tests/integration/image/test_gpu_image_build.py runs them in the built image and reads the report).

usage: python check_gpu_image.py TORCH_BUILDS_TOML TORCH_VARIANT
Prints one JSON object (the report); exits 1 naming each failed check.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path


def nccl_files() -> list[str]:
    """Every libnccl.so* under the Python installation and the system's library directories (links included)."""
    roots = [Path(sys.prefix), Path("/usr/lib"), Path("/usr/local/lib"), Path("/lib")]
    return sorted({str(path) for root in roots if root.exists() for path in root.rglob("libnccl.so*")})


def loaded_nccl() -> list[str]:
    """The NCCL libraries mapped into this process once torch and Horovod's torch extension are loaded."""
    import horovod.torch  # noqa: F401
    import torch  # noqa: F401

    return sorted({line.split()[-1] for line in open("/proc/self/maps") if "libnccl" in line})


def report(builds_file: Path, variant: str) -> dict:
    import torch
    import torch.distributed

    version = torch.__version__.split("+")[0]
    expected = tomllib.loads(builds_file.read_text())[version]["variants"][variant]["cuda"]
    check_build = subprocess.run(["horovodrun", "--check-build"], capture_output=True, text=True).stdout
    frameworks = [name for name in ("PyTorch", "NCCL", "Gloo", "MPI") if f"[X] {name}" in check_build]
    return {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "expected_cuda": expected,
            "nccl_available": torch.distributed.is_nccl_available(), "horovod_built_with": frameworks,
            "nccl_files": nccl_files(), "nccl_loaded": loaded_nccl()}


def failures(found: dict) -> list[str]:
    failed = []
    if found["torch_cuda"] != found["expected_cuda"]:
        failed.append(f"torch is built for CUDA {found['torch_cuda']}, the pins say {found['expected_cuda']}")
    if not found["nccl_available"]:
        failed.append("torch.distributed has no NCCL")
    if not {"PyTorch", "NCCL"} <= set(found["horovod_built_with"]):
        failed.append(f"Horovod is built with {found['horovod_built_with']}, not PyTorch and NCCL")
    if len(found["nccl_files"]) != 1 or found["nccl_loaded"] != found["nccl_files"]:
        failed.append(f"one NCCL library expected, shared by torch and Horovod: present {found['nccl_files']}, "
                      f"loaded {found['nccl_loaded']}")
    return failed


if __name__ == "__main__":
    found = report(Path(sys.argv[1]), sys.argv[2])
    print(json.dumps(found))
    failed = failures(found)
    for failure in failed:
        print(f"check_gpu_image: {failure}", file=sys.stderr)
    sys.exit(1 if failed else 0)
