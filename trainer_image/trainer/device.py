"""Where a rank computes and keeps its rows: its own GPU, selected before anything can create a CUDA context, or
the CPU; the rows on the GPU when they fit beside the model, else on the host with each batch copied over; a CUDA
out-of-memory error as a refusal that names what to change.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal, Protocol

import torch

from pgtrain.core.errors import ConfigError
from pgtrain.core.memory import TRAINING_BYTES_PER_PARAMETER

# What a GPU needs beside the rows and the model's training state: cuBLAS's workspace, NCCL's buffers, the caching
# allocator's slack and a batch's activations.
DEVICE_RESERVE_BYTES = 1 << 30

Placement = Literal["device", "host", "refuse"]


class Cuda(Protocol):
    """The part of ``torch.cuda`` a rank calls itself (tests hand a recording one to ``train``)."""

    def is_available(self) -> bool: ...

    def device_count(self) -> int: ...

    def set_device(self, device: int) -> None: ...

    def mem_get_info(self, device: int) -> tuple[int, int]: ...

    def synchronize(self, device: int) -> None: ...


def select_device(local_rank: int, cuda: Cuda) -> torch.device:
    """This rank's GPU (its Horovod local rank) made the current one, else the CPU. Called before anything that
    can create a CUDA context (a pinned allocation, a tensor on "cuda"): that context would be made on the current
    device, GPU 0 for every rank, and fail where GPUs are exclusive to one process."""
    if not cuda.is_available():
        return torch.device("cpu")
    count = cuda.device_count()
    if local_rank >= count:
        raise ConfigError(
            f"this rank is local rank {local_rank} but its node shows {count} GPU{'s' if count != 1 else ''}: "
            "give each worker as many GPUs as it runs ranks (gpus_per_worker), or run fewer ranks per node")
    cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


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
