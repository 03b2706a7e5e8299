"""The ``horovod`` backend: ``horovod.torch`` under horovodrun (Gloo on CPU, MPI and NCCL in the GPU image)."""

from __future__ import annotations

from typing import Any

import horovod.torch as hvd
import torch


class HorovodCollectives:
    name = "horovod"

    def __init__(self) -> None:
        hvd.init()

    def rank(self) -> int:
        return hvd.rank()

    def size(self) -> int:
        return hvd.size()

    def local_rank(self) -> int:
        return hvd.local_rank()

    def local_size(self) -> int:
        return hvd.local_size()

    def allreduce_sum(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        return hvd.allreduce(tensor, op=hvd.Sum, name=name)

    def allgather(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        return hvd.allgather(tensor, name=name)

    def broadcast_object(self, obj: Any, name: str) -> Any:
        return hvd.broadcast_object(obj, 0, name=name)

    def broadcast_parameters(self, state: dict[str, torch.Tensor]) -> None:
        hvd.broadcast_parameters(state, root_rank=0)

    def distributed_optimizer(self, optimizer: torch.optim.Optimizer,
                              model: torch.nn.Module) -> torch.optim.Optimizer:
        return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    def shutdown(self) -> None:
        hvd.shutdown()
