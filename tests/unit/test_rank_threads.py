"""A rank's threads: passive waits set before torch loads its OpenMP runtime, and a count that fits its CPUs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from pgtrain.config.model_entries import load_entries
from pgtrain.config.params import PARAMETERS, TrainingConfig, unknown_keys
from pgtrain.config.settings import AuthorSettings, load_settings
from pgtrain.core.cpus import usable_cpus
from pgtrain.core.errors import ConfigError
from pgtrain.models.cost import multiply_adds_per_row
from pgtrain.models.network import build_model
from trainer.threads import (
    STEP_WORK_PER_THREAD,
    set_up_threads,
    thread_summary,
    threads_per_rank,
    threads_while,
    wait_passively,
)


def test_threads_per_rank_share_the_cpus_unless_omp_num_threads_says():
    cpus = usable_cpus()  # the affinity within the container's CPU limit (tests/unit/test_capacity.py)
    assert threads_per_rank({}, 1) == cpus
    assert threads_per_rank({}, cpus) == 1
    assert threads_per_rank({}, 4 * cpus) == 1
    assert threads_per_rank({"OMP_NUM_THREADS": "3"}, 2) == 3
    assert threads_per_rank({"OMP_NUM_THREADS": ""}, 1) == cpus
    # the author's intra_op_threads (the run's config) before either
    assert threads_per_rank({"OMP_NUM_THREADS": "3"}, 2, chosen=5) == 5
    assert threads_per_rank({}, cpus, chosen=4) == 4


def test_a_step_too_small_for_a_second_thread_gets_one():
    cpus = usable_cpus()
    assert threads_per_rank({}, 1, step_work=STEP_WORK_PER_THREAD - 1) == 1
    assert threads_per_rank({}, 1, step_work=0) == 1
    assert threads_per_rank({}, 1, step_work=2 * STEP_WORK_PER_THREAD) == min(2, cpus)
    assert threads_per_rank({}, 1, step_work=10**15) == cpus  # never more than the CPUs it gets
    assert threads_per_rank({}, 4 * cpus, step_work=10**15) == 1
    # whoever chose a count is followed whatever the work
    assert threads_per_rank({"OMP_NUM_THREADS": "3"}, 1, step_work=0) == 3
    assert threads_per_rank({}, 1, chosen=4, step_work=0) == 4


def test_a_step_s_work_counts_each_dense_weight_once_a_row_and_a_shared_weight_once_per_member():
    plain = build_model("mlp", 100, 10, {"hidden_sizes": [50]}, 0)
    assert multiply_adds_per_row(plain) == 100 * 50 + 50 * 10
    deep = build_model("mlp", 8, 3, {"hidden_sizes": [256, 256]}, 0)
    assert multiply_adds_per_row(deep) == 8 * 256 + 256 * 256 + 256 * 3
    ensemble = build_model("mlp", 100, 10, {"hidden_sizes": [50], "members": 4}, 0)
    assert multiply_adds_per_row(ensemble) == 4 * (100 * 50 + 50 * 10)


def recurrent(input_dim: int, output_dim: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Unflatten(1, (1, input_dim)), torch.nn.GRU(input_dim, 16, batch_first=True))


def test_a_layer_whose_cost_it_cannot_tell_leaves_the_threads_uncapped():
    assert multiply_adds_per_row(recurrent(8, 3)) is None
    weight_normed = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(8, 3))
    assert multiply_adds_per_row(torch.nn.Sequential(weight_normed)) is None
    assert multiply_adds_per_row(torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 2))) == 8


def test_the_author_chooses_intra_op_threads_in_the_settings_file_or_a_models_entry(tmp_path):
    settings = tmp_path / "pgtrain.yaml"
    settings.write_text("intra_op_threads: 3\n")
    base = load_settings(settings)
    assert base.intra_op_threads == 3 and AuthorSettings.from_dict(base.to_dict()) == base
    assert AuthorSettings().intra_op_threads is None  # unset: threads_per_rank's automatic count
    models = tmp_path / "models.yaml"
    models.write_text(textwrap.dedent("""\
        models:
          - {name: own, source: {table: public.samples, label_column: label}, schedule: {cron: '@daily'},
             intra_op_threads: 1}
          - {name: inherits, source: {table: public.samples, label_column: label}, schedule: {cron: '@daily'}}
        """))
    entries, errors = load_entries(models)
    assert errors == []
    assert [e.settings(base).intra_op_threads for e in entries] == [1, 3]
    settings.write_text("intra_op_threads: many\n")
    with pytest.raises(ConfigError, match="intra_op_threads: 'many' is not of type"):
        load_settings(settings)


def test_a_triggerer_cannot_choose_intra_op_threads():
    assert "intra_op_threads" not in PARAMETERS  # not in the trigger form
    assert unknown_keys({"intra_op_threads": 8}) == [
        "'intra_op_threads' is not a param of this DAG; the params are: " + ", ".join(PARAMETERS)]
    # the snapshot keeps it: the ranks read it from there
    config = TrainingConfig(intra_op_threads=2)
    assert TrainingConfig.from_mapping(config.to_dict()).intra_op_threads == 2


def test_a_rank_waits_passively_unless_told_otherwise():
    environ: dict[str, str] = {}
    wait_passively(environ)
    assert environ == {"OMP_WAIT_POLICY": "PASSIVE"}
    chosen = {"OMP_WAIT_POLICY": "ACTIVE"}
    wait_passively(chosen)
    assert chosen == {"OMP_WAIT_POLICY": "ACTIVE"}


def rank_openmp_settings(env: dict[str, str]) -> str:
    """What torch's OpenMP runtime (libgomp) reports at load in a real `python -m trainer` process: one with no
    training database, which loads torch and then refuses its run (its command line is read before torch loads)."""
    env = {k: v for k, v in env.items() if "DATABASE_URL" not in k and k != "AIRFLOW_CONN_PGTRAIN_DB"}
    done = subprocess.run([sys.executable, "-m", "trainer", "--run-id", "probe", "--attempt", "1"],
                          env={**env, "OMP_DISPLAY_ENV": "VERBOSE"}, capture_output=True, text=True, timeout=300)
    assert "no training database configured" in done.stderr and "OPENMP DISPLAY ENVIRONMENT" in done.stderr, \
        done.stderr
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
        assert thread_summary(1, {"OMP_WAIT_POLICY": "PASSIVE"}) == "1 threads per rank, passive waits"
        torch.set_num_threads(2)
        with threads_while(1):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        assert thread_summary(1, {"OMP_WAIT_POLICY": "PASSIVE"}) == (
            "1 threads per rank, passive waits (2 outside the training steps)")
    finally:
        torch.set_num_threads(threads)
        torch.set_flush_denormal(flushing)
