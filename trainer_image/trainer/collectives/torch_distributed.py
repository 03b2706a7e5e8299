"""The ``torch`` backend: ``torch.distributed``, NCCL for CUDA tensors and Gloo for host ones, nothing compiled.

Where a rank learns its place: ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` (the local launcher, or
torchrun), else Open MPI's ``OMPI_COMM_WORLD_*`` (the MPIJob's launcher starts the ranks with ``mpirun``); the
rendezvous at ``MASTER_ADDR``:``MASTER_PORT`` (on an MPIJob the launcher sets it from its hostfile, which the MPI
Operator mounts in the launcher pod only: pgtrain.launch.mpijob.rendezvous), else at the first host of the hostfile
(``$PGTRAIN_HOSTFILE``, else the MPI Operator's, where ``mpirun`` puts rank 0) on ``DEFAULT_PORT``. Every collective
waits at most the run's ``collective_timeout``: a rank that hangs or is gone fails the job within it instead of
holding its GPUs.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from pgtrain.core.errors import ConfigError
from pgtrain.launch.mpijob.api import HOSTFILE
from pgtrain.launch.mpijob.rendezvous import first_host

HOSTFILE_ENV = "PGTRAIN_HOSTFILE"
DEFAULT_PORT = 29500  # torch.distributed's usual one; each MPIJob's rank 0 has its pod's address to itself


@dataclass(frozen=True)
class Place:
    rank: int
    size: int
    local_rank: int
    local_size: int
    address: str
    port: int


def _first(environ: Mapping[str, str], *names: str) -> str | None:
    return next((environ[name] for name in names if environ.get(name)), None)


def place(environ: Mapping[str, str]) -> Place:
    """This rank's place in the job and the rendezvous address, from its environment (see the module's doc)."""
    rank = _first(environ, "RANK", "OMPI_COMM_WORLD_RANK")
    size = _first(environ, "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE")
    if rank is None or size is None:
        raise ConfigError("the torch backend's rank does not know its place: start it with RANK and WORLD_SIZE set "
                          "(the local launcher does) or under mpirun (OMPI_COMM_WORLD_RANK and _SIZE), not by hand")
    local_rank = _first(environ, "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK") or "0"
    local_size = _first(environ, "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE") or size
    hostfile = environ.get(HOSTFILE_ENV) or HOSTFILE
    address = environ.get("MASTER_ADDR") or first_host(hostfile)
    if address is None:
        raise ConfigError(f"the torch backend's rank {rank} has no rendezvous address: neither MASTER_ADDR nor a "
                          f"host in {hostfile} (the MPI Operator's hostfile)")
    return Place(int(rank), int(size), int(local_rank), int(local_size), address,
                 int(environ.get("MASTER_PORT") or DEFAULT_PORT))


class TorchCollectives:
    name = "torch"

    def __init__(self, timeout_seconds: float, environ: Mapping[str, str] | None = None) -> None:
        where = place(os.environ if environ is None else environ)
        self._place = where
        # NCCL for CUDA tensors where there is a GPU; host tensors (the epoch's sums, validation probabilities,
        # pickled objects) always go through Gloo, which also honours the timeout on the CPU.
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://{_url_host(where.address)}:{where.port}",
                                rank=where.rank, world_size=where.size,
                                timeout=datetime.timedelta(seconds=timeout_seconds))

    def rank(self) -> int:
        return self._place.rank

    def size(self) -> int:
        return self._place.size

    def local_rank(self) -> int:
        return self._place.local_rank

    def local_size(self) -> int:
        return self._place.local_size

    def allreduce_sum(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        total = tensor.clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total

    def allgather(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        counts = [torch.zeros(1, dtype=torch.int64, device=tensor.device) for _ in range(self.size())]
        dist.all_gather(counts, torch.tensor([len(tensor)], dtype=torch.int64, device=tensor.device))
        rows = [int(c.item()) for c in counts]
        padded = tensor.new_zeros((max(rows), *tensor.shape[1:]))  # all_gather wants equal shapes
        padded[:len(tensor)] = tensor
        parts = [torch.empty_like(padded) for _ in rows]
        dist.all_gather(parts, padded)
        return torch.cat([part[:n] for part, n in zip(parts, rows, strict=True)])

    def broadcast_object(self, obj: Any, name: str) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def broadcast_parameters(self, state: dict[str, torch.Tensor]) -> None:
        for tensor in state.values():
            dist.broadcast(tensor, src=0)

    def distributed_optimizer(self, optimizer: torch.optim.Optimizer,
                              model: torch.nn.Module) -> torch.optim.Optimizer:
        """Each step first averages the gradients over the ranks, in one allreduce of them all (Horovod's fusion);
        a parameter without a gradient contributes zeros, as in Horovod, so every rank steps every parameter."""
        parameters = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
        size = self.size()
        step = optimizer.step

        def averaged_step(*args: Any, **kwargs: Any) -> Any:
            for p in parameters:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
            for p in parameters:
                groups.setdefault((p.grad.device, p.grad.dtype), []).append(p.grad)
            for grads in groups.values():  # the same order on every rank: the optimizer's parameter order
                flat = _flatten_dense_tensors(grads)
                dist.all_reduce(flat, op=dist.ReduceOp.SUM)
                flat.div_(size)
                for grad, averaged in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
                    grad.copy_(averaged)
            return step(*args, **kwargs)

        optimizer.step = averaged_step  # type: ignore[method-assign]
        return optimizer

    def shutdown(self) -> None:
        dist.destroy_process_group()


def _url_host(address: str) -> str:
    return f"[{address}]" if ":" in address and not address.startswith("[") else address
