"""A rank's CPU threads: they wait passively, and as many as the CPUs the rank really gets and its work can use.

torch's OpenMP threads (libgomp in the Linux wheels) spin for a while after each parallel region, waiting for
the next. On a machine of its own that saves a wake-up; on a shared one (an Airflow worker, a node with other
pods, a rank beside its siblings) the spinning threads take the cores the work needs, and training ran 3-11x
slower than a plain loop (benchmarks/RESULTS.md, "Training"). libgomp reads ``OMP_WAIT_POLICY`` once, when
torch loads it: :func:`wait_passively` must run before ``import torch``, which is why ``python -m trainer``
calls it first.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

from pgtrain.core.cpus import usable_cpus

WAIT_POLICY = "OMP_WAIT_POLICY"


def wait_passively(environ: MutableMapping[str, str] = os.environ) -> None:
    """Threads that sleep while they wait, unless whoever started the rank chose another policy."""
    environ.setdefault(WAIT_POLICY, "PASSIVE")


# A passive thread is woken for every parallel region (each matrix product, each large elementwise op) and sleeps
# after it; below about this much work a step, a second thread costs more in wake-ups than it brings. Measured on
# real ranks at 2 threads against 1 (benchmarks/RESULTS.md, "Training"): 11M multiply-adds a step (the default mlp at
# batch 2048) trained 9-10% faster on one thread, 35M as fast on either, 49M and more 7-55% faster on two.
STEP_WORK_PER_THREAD = 16_000_000


def threads_per_rank(environ: Mapping[str, str], local_size: int, chosen: int | None = None,
                     step_work: int | None = None) -> int:
    """Torch's threads in each rank: ``chosen`` (the author's ``intra_op_threads``, from the run's config), else
    $OMP_NUM_THREADS when set (the author's ``env`` on Kubernetes, the worker's environment locally), else the CPUs
    this container may use (its affinity within its CPU limit) shared by the ranks on this node, and no more than
    one per ``STEP_WORK_PER_THREAD`` of ``step_work`` (a training step's multiply-adds, when known)."""
    if chosen is not None:
        return chosen
    explicit = environ.get("OMP_NUM_THREADS", "")
    if explicit.isdigit() and int(explicit) > 0:
        return int(explicit)
    share = max(1, usable_cpus() // max(1, local_size))
    return share if step_work is None else max(1, min(share, step_work // STEP_WORK_PER_THREAD))


def set_up_threads(environ: Mapping[str, str], local_size: int, chosen: int | None = None,
                   step_work: int | None = None) -> None:
    """This rank's threads (``threads_per_rank``), and subnormal floats flushed to zero: late in training gradients
    underflow into them, which x86 CPUs compute several times slower (benchmarks/RESULTS.md, "Training"). Values
    below 1.2e-38 change no result that matters; GPUs are not affected."""
    import torch

    torch.set_num_threads(threads_per_rank(environ, local_size, chosen, step_work))
    torch.set_flush_denormal(True)


def thread_summary(environ: Mapping[str, str] = os.environ) -> str:
    """What the rank's log says of its threads: "2 threads per rank, passive waits"."""
    import torch

    return f"{torch.get_num_threads()} threads per rank, {environ.get(WAIT_POLICY, 'default').lower()} waits"
