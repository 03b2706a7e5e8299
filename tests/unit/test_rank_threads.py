"""A rank's threads: passive waits set before torch loads its OpenMP runtime, and a count that fits its CPUs."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from pgtrain.core.cpus import usable_cpus
from trainer.threads import set_up_threads, thread_summary, threads_per_rank, wait_passively


def test_threads_per_rank_share_the_cpus_unless_omp_num_threads_says():
    cpus = usable_cpus()  # the affinity within the container's CPU limit (tests/unit/test_capacity.py)
    assert threads_per_rank({}, 1) == cpus
    assert threads_per_rank({}, cpus) == 1
    assert threads_per_rank({}, 4 * cpus) == 1
    assert threads_per_rank({"OMP_NUM_THREADS": "3"}, 2) == 3
    assert threads_per_rank({"OMP_NUM_THREADS": ""}, 1) == cpus


def test_a_rank_waits_passively_unless_told_otherwise():
    environ: dict[str, str] = {}
    wait_passively(environ)
    assert environ == {"OMP_WAIT_POLICY": "PASSIVE"}
    chosen = {"OMP_WAIT_POLICY": "ACTIVE"}
    wait_passively(chosen)
    assert chosen == {"OMP_WAIT_POLICY": "ACTIVE"}


def rank_openmp_settings(env: dict[str, str]) -> str:
    """What torch's OpenMP runtime (libgomp) reports at load in a real `python -m trainer` process."""
    done = subprocess.run([sys.executable, "-m", "trainer", "--help"], env={**env, "OMP_DISPLAY_ENV": "VERBOSE"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_a_rank_s_openmp_threads_do_not_spin_while_they_wait():
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    # libgomp spins 300,000 times before it sleeps by default; passive waits spin 0 times
    assert "GOMP_SPINCOUNT = '0'" in rank_openmp_settings(env)
    assert "GOMP_SPINCOUNT = '0'" not in rank_openmp_settings({**env, "OMP_WAIT_POLICY": "ACTIVE"})


def test_a_rank_flushes_subnormal_floats_to_zero():
    threads, flushing = torch.get_num_threads(), torch.tensor([1e-40]).item() == 0
    try:
        torch.set_flush_denormal(False)
        assert torch.tensor([1e-40]).item() > 0  # a subnormal float32, kept (and slow) by default
        set_up_threads({"OMP_NUM_THREADS": "1"}, 1)
        assert torch.get_num_threads() == 1
        assert torch.tensor([1e-40]).item() == 0 and torch.tensor([1e-37]).item() > 0
        assert thread_summary({"OMP_WAIT_POLICY": "PASSIVE"}) == "1 threads per rank, passive waits"
    finally:
        torch.set_num_threads(threads)
        torch.set_flush_denormal(flushing)
