"""The collectives of a run's only rank, started without a launcher (``python -m trainer ... --alone``): no
horovodrun, no rendezvous, no ``import horovod.torch``. Every collective over one rank is that rank's own value,
so it trains exactly as under either backend with one rank; it records the backend it stands in for."""

from __future__ import annotations

from typing import Any

import torch


class SoloCollectives:
    def __init__(self, name: str) -> None:
        self.name = name

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1

    def local_rank(self) -> int:
        return 0

    def local_size(self) -> int:
        return 1

    def allreduce_sum(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        return tensor.clone()

    def allgather(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        return tensor.clone()

    def broadcast_object(self, obj: Any, name: str) -> Any:
        return obj

    def broadcast_parameters(self, state: dict[str, torch.Tensor]) -> None:
        return None

    def distributed_optimizer(self, optimizer: torch.optim.Optimizer,
                              model: torch.nn.Module) -> torch.optim.Optimizer:
        return optimizer

    def shutdown(self) -> None:
        return None
