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
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager

from pgtrain.core.cpus import usable_cpus

WAIT_POLICY = "OMP_WAIT_POLICY"


def wait_passively(environ: MutableMapping[str, str] = os.environ) -> None:
    """Threads that sleep while they wait, unless whoever started the rank chose another policy."""
    environ.setdefault(WAIT_POLICY, "PASSIVE")


# A passive thread is woken for every parallel region (each matrix product, each large elementwise op) and sleeps
# after it; below about this much work a training step, a second thread costs more in wake-ups than it brings.
# Measured on real ranks, 2 threads against 1 on 2 cores (benchmarks/RESULTS.md, "Training"): 11M multiply-adds a
# step (the default mlp, 100 inputs, 10 classes, batch 2048) trained 9-10% faster on one thread, 35M 3-7% faster
# on one, 49M and more 7-55% faster on two. Beyond 2 threads the same rate is an extrapolation.
STEP_WORK_PER_THREAD = 20_000_000


def threads_per_rank(environ: Mapping[str, str], local_size: int, chosen: int | None = None,
                     step_work: int | None = None) -> int:
    """Torch's threads in each rank: ``chosen`` (the author's ``intra_op_threads``, from the run's config), else
    $OMP_NUM_THREADS when set (the author's ``env`` on Kubernetes, the worker's environment locally), else the CPUs
    this container may use (its affinity within its CPU limit) shared by the ranks on this node, and, given
    ``step_work`` (the multiply-adds of a training step's forward pass on the CPU), no more than one per
    ``STEP_WORK_PER_THREAD`` of it."""
    if chosen is not None:
        return chosen
    explicit = environ.get("OMP_NUM_THREADS", "")
    if explicit.isdigit() and int(explicit) > 0:
        return int(explicit)
    share = max(1, usable_cpus() // max(1, local_size))
    return share if step_work is None else max(1, min(share, step_work // STEP_WORK_PER_THREAD))


def set_up_threads(environ: Mapping[str, str], local_size: int, chosen: int | None = None) -> None:
    """This rank's threads (``threads_per_rank``), and subnormal floats flushed to zero: late in training gradients
    underflow into them, which x86 CPUs compute several times slower (benchmarks/RESULTS.md, "Training"). Values
    below 1.2e-38 change no result that matters; GPUs are not affected."""
    import torch

    torch.set_num_threads(threads_per_rank(environ, local_size, chosen))
    torch.set_flush_denormal(True)


@contextmanager
def threads_while(count: int) -> Iterator[None]:
    """torch's threads set to ``count`` for the block (the training steps'), then back to what they were (the
    evaluation's and the statistics', whose chunks of rows are work enough for every thread)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def thread_summary(training: int, environ: Mapping[str, str] = os.environ) -> str:
    """What the rank's log says of its threads: "1 threads per rank, passive waits (2 outside the training
    steps)"."""
    import torch

    others = torch.get_num_threads()
    return (f"{training} threads per rank, {environ.get(WAIT_POLICY, 'default').lower()} waits"
            + (f" ({others} outside the training steps)" if others != training else ""))
