"""Where a rank computes and keeps its rows: its own GPU, selected before anything can create a CUDA context, or
the CPU; the rows on the GPU when they fit beside the model, else on the host with each batch copied over; a CUDA
out-of-memory error as a refusal that names what to change.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Literal, Protocol

import torch

from pgtrain.core.errors import ConfigError
from pgtrain.core.memory import TRAINING_BYTES_PER_PARAMETER
from pgtrain.launch.mpijob.api import GPUS_PER_WORKER_ENV

# What a GPU needs beside the rows and the model's training state: cuBLAS's workspace, NCCL's buffers, the caching
# allocator's slack and a batch's activations.
DEVICE_RESERVE_BYTES = 1 << 30

Placement = Literal["device", "host", "refuse"]

# The oldest NVIDIA driver branch each CUDA major version runs on (CUDA's minor version compatibility: any driver of
# the branch runs every minor release of that major version).
DRIVER_FLOORS = {13: "R580", 12: "R525", 11: "R450"}
# The torch build for nodes whose driver is older than the default build's floor (trainer_image's torch pins).
OLDER_DRIVER_BUILD = "cu126"
NVIDIA_DRIVER_FILE = Path("/proc/driver/nvidia/version")


class Cuda(Protocol):
    """The part of ``torch.cuda`` a rank calls itself (tests hand a recording one to ``train``)."""

    def is_available(self) -> bool: ...

    def device_count(self) -> int: ...

    def set_device(self, device: int) -> None: ...

    def mem_get_info(self, device: int) -> tuple[int, int]: ...

    def synchronize(self, device: int) -> None: ...

    def get_device_name(self, device: int) -> str: ...


def gpus_requested(environ: Mapping[str, str]) -> int:
    """The GPUs this rank's worker pod was given (GPUS_PER_WORKER_ENV, set by the MPIJob); 0 when none were."""
    value = environ.get(GPUS_PER_WORKER_ENV, "").strip()
    return int(value) if value.isdigit() else 0


def driver_floor(cuda_version: str | None) -> str:
    """The oldest driver branch torch's CUDA build (``torch.version.cuda``, e.g. "13.0") runs on."""
    major = int(cuda_version.split(".")[0]) if cuda_version else 0
    return DRIVER_FLOORS.get(major, f"the one CUDA {cuda_version} needs")


def no_cuda_refusal(gpus: int, cuda_version: str | None) -> ConfigError:
    """Why a rank that holds GPUs does not train on the CPU, and what to change."""
    held = f"this rank's worker holds {gpus} GPU{'s' if gpus != 1 else ''} (gpus_per_worker) but"
    if cuda_version is None:
        return ConfigError(f"{held} its torch {torch.__version__} is a CPU build: run the GPU image (make image-gpu, "
                           "docs/kubernetes.md, \"First GPU run\") as kubernetes.image")
    return ConfigError(
        f"{held} CUDA is unavailable to its torch {torch.__version__} (CUDA {cuda_version}): the node's NVIDIA driver "
        f"must be {driver_floor(cuda_version)} or newer for this CUDA {cuda_version.split('.')[0]} build (nvidia-smi "
        f"on the node shows it), and the GPUs visible to the container (the NVIDIA device plugin); on nodes with an "
        f"older driver, build the image with torch's {OLDER_DRIVER_BUILD} wheels (CUDA 12.6, driver "
        f"{DRIVER_FLOORS[12]} or newer)")


def select_device(local_rank: int, cuda: Cuda, gpus: int = 0) -> torch.device:
    """This rank's GPU (its Horovod local rank) made the current one, else the CPU. Called before anything that
    can create a CUDA context (a pinned allocation, a tensor on "cuda"): that context would be made on the current
    device, GPU 0 for every rank, and fail where GPUs are exclusive to one process.

    ``gpus``: the GPUs the rank's pod was given (gpus_requested); with any, no CUDA is a refusal, not the CPU: a
    driver older than the build's floor makes CUDA unavailable, and a run would hold GPUs while it trains on CPUs.
    """
    if not cuda.is_available():
        if gpus:
            raise no_cuda_refusal(gpus, torch.version.cuda)
        return torch.device("cpu")
    count = cuda.device_count()
    if local_rank >= count:
        raise ConfigError(
            f"this rank is local rank {local_rank} but its node shows {count} GPU{'s' if count != 1 else ''}: "
            "give each worker as many GPUs as it runs ranks (gpus_per_worker), or run fewer ranks per node")
    cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def use_tf32(device: torch.device) -> None:
    """On a GPU, float32 matmuls and convolutions in TF32 (Ampere and newer: several times the float32 rate, 10
    mantissa bits in the products, float32 sums): what a training step wants; a CPU rank keeps full float32."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.allow_tf32 = True


def forward_precision(device: torch.device, precision: str) -> AbstractContextManager[None]:
    """Where a training step's forward pass and loss run: autocast to bfloat16 for the author's ``precision: bf16``
    (weights, gradients and the optimizer's state stay float32), else as they are."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def driver_version(version_file: Path = NVIDIA_DRIVER_FILE) -> str:
    """The node's NVIDIA kernel driver version (e.g. "580.65.06"), "unknown" where it cannot be read."""
    try:
        words = version_file.read_text().split("Kernel Module")[1].split()
    except (OSError, IndexError):
        return "unknown"
    return next((w for w in words if w[:1].isdigit()), "unknown")


def nccl_version() -> str:
    """The version of the NCCL torch loaded, "none" where it has none."""
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return "none"
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def device_line(rank: int, device: torch.device, cuda: Cuda, driver: str, nccl: str) -> str:
    """What a rank says about where it computes: on a GPU, torch's CUDA, the driver, the GPU and NCCL."""
    if device.type != "cuda":
        return f"rank {rank}: CPU (torch {torch.__version__})"
    return (f"rank {rank}: GPU {device.index} {cuda.get_device_name(device.index)}, torch {torch.__version__} "
            f"CUDA {torch.version.cuda}, driver {driver}, NCCL {nccl}")


def training_state_bytes(model: torch.nn.Module) -> int:
    """The model's memory while it trains: each parameter with its gradient, the optimizer's state, Horovod's
    fusion copy and the best epoch's copy (TRAINING_BYTES_PER_PARAMETER), and its buffers."""
    parameters = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return parameters * TRAINING_BYTES_PER_PARAMETER + buffers


def placement(rows_bytes: int, model_bytes: int, batch_bytes: int, free_bytes: int,
              reserve_bytes: int = DEVICE_RESERVE_BYTES) -> Placement:
    """Where a rank's rows go: "device" when they fit on the GPU beside the model, a batch and the reserve;
    else "host" (each batch copied over) when the model and a batch fit; else "refuse"."""
    beside = model_bytes + batch_bytes + reserve_bytes
    if rows_bytes + beside <= free_bytes:
        return "device"
    return "host" if beside <= free_bytes else "refuse"


def place_rows(device: torch.device, cuda: Cuda, rows_bytes: int, model_bytes: int, batch_bytes: int,
               batch_size: int, world_size: int) -> bool:
    """True when the rows go to ``device`` (always on the CPU); False: they stay on the host and each batch is
    copied over; ConfigError when not even the model and a batch fit in the GPU's free memory."""
    if device.type != "cuda":
        return True
    free, total = cuda.mem_get_info(device.index)
    verdict = placement(rows_bytes, model_bytes, batch_bytes, free)
    if verdict == "refuse":
        raise ConfigError(
            f"GPU {device.index} has {_size(free)} free of {_size(total)}, and training needs about "
            f"{_size(model_bytes)} for the model's state, {_size(batch_bytes)} for a batch of {batch_size} rows and "
            f"{_size(DEVICE_RESERVE_BYTES)} beside them (its rows would stay in host memory); use a smaller "
            f"batch_size or model, or a GPU no other process holds memory on")
    if verdict == "host":
        print(f"GPU {device.index}: this rank's {_size(rows_bytes)} of rows do not fit in its {_size(free)} free "
              f"beside the model; they stay in host memory and each batch is copied over (slower: more ranks "
              f"(world_size {world_size} now) spread the rows over more GPUs)", flush=True)
    return verdict == "device"


@contextmanager
def out_of_memory_refused(device: torch.device, batch_size: int, world_size: int) -> Iterator[None]:
    """A GPU out of memory is the run's settings, not bad luck: a retry would meet it again, so it becomes a
    ConfigError (the rank's verdict "refused") that says what to change."""
    try:
        yield
    except torch.cuda.OutOfMemoryError as error:
        first = str(error).split(". ")[0].splitlines()[0] if str(error) else "CUDA out of memory"
        raise ConfigError(
            f"device {device} ran out of memory training batches of {batch_size} rows per rank on {world_size} "
            f"rank{'s' if world_size != 1 else ''} ({first}); use a smaller batch_size, a smaller model, or more "
            "ranks (world_size: fewer rows per GPU)") from error


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:,.1f} GiB" if nbytes >= 2**30 else f"{-(-nbytes // 2**20):,} MiB"
