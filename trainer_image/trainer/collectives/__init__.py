"""The collectives a rank trains with, behind one small interface: Horovod or torch.distributed.

``init(backend, timeout_seconds)`` starts one (``horovod``: ``horovod.torch`` under horovodrun; ``torch``:
``torch.distributed`` with NCCL for CUDA tensors and Gloo for host ones) and makes it this process's; the trainer
then calls the module's functions, as it called Horovod's before. Every collective is called by every rank in the
same order, with the same names; a rank that is gone fails the others' next collective (torch: within
``timeout_seconds``).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from pgtrain.config.params import BACKENDS


class Collectives(Protocol):
    name: str

    def rank(self) -> int: ...

    def size(self) -> int: ...

    def local_rank(self) -> int: ...

    def local_size(self) -> int: ...

    def allreduce_sum(self, tensor: torch.Tensor, name: str) -> torch.Tensor: ...

    def allgather(self, tensor: torch.Tensor, name: str) -> torch.Tensor: ...

    def broadcast_object(self, obj: Any, name: str) -> Any: ...

    def broadcast_parameters(self, state: dict[str, torch.Tensor]) -> None: ...

    def distributed_optimizer(self, optimizer: torch.optim.Optimizer,
                              model: torch.nn.Module) -> torch.optim.Optimizer: ...

    def shutdown(self) -> None: ...


_active: list[Collectives] = []


def init(backend: str, timeout_seconds: float, *, alone: bool = False) -> Collectives:
    """Start ``backend``'s collectives (one of pgtrain.config.params.BACKENDS but ``auto``, which the launcher
    resolves: it chose how the ranks were started) and make them this process's. ``alone``: the run's only rank,
    started without a launcher (``trainer.collectives.solo``: nothing to start)."""
    if backend not in BACKENDS or backend == "auto":
        raise ValueError(f"backend {backend!r} is not one of {', '.join(b for b in BACKENDS if b != 'auto')}")
    if alone:
        from trainer.collectives.solo import SoloCollectives

        chosen: Collectives = SoloCollectives(backend)
    elif backend == "horovod":
        from trainer.collectives.horovod import HorovodCollectives

        chosen = HorovodCollectives()
    else:
        from trainer.collectives.torch_distributed import TorchCollectives

        chosen = TorchCollectives(timeout_seconds)
    _active[:] = [chosen]
    return chosen


def active() -> Collectives:
    if not _active:
        raise RuntimeError("no collectives yet: trainer.collectives.init() starts them")
    return _active[0]


def rank() -> int:
    return active().rank()


def size() -> int:
    return active().size()


def allreduce_sum(tensor: torch.Tensor, name: str) -> torch.Tensor:
    """The sum of every rank's ``tensor`` (a new tensor; ``tensor`` is left as it was)."""
    return active().allreduce_sum(tensor, name)


def allgather(tensor: torch.Tensor, name: str) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along the first dimension, in rank order (first dimensions may differ)."""
    return active().allgather(tensor, name)


def broadcast_object(obj: Any, name: str) -> Any:
    """Rank 0's ``obj`` (picklable) on every rank."""
    return active().broadcast_object(obj, name)


def broadcast_parameters(state: dict[str, torch.Tensor]) -> None:
    """Rank 0's tensors of a state dict, in place on every rank."""
    active().broadcast_parameters(state)


def distributed_optimizer(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> torch.optim.Optimizer:
    """``optimizer`` whose step first averages each parameter's gradient over the ranks."""
    return active().distributed_optimizer(optimizer, model)


def shutdown() -> None:
    if _active:
        _active.pop().shutdown()
