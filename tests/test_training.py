"""Real Horovod ranks (horovodrun --gloo) training against a real PostgreSQL."""

from __future__ import annotations

import logging
import sys
import time

import numpy as np
import psycopg
import pytest
import torch
import torch.nn.functional as F

from pgtrain import launch_local, loader, manifest, runs, tensors
from pgtrain.errors import TrainingFailed, TrainingInputError
from pgtrain.model_spec import ModelSpec
from tests.support import planned_run, seed_samples
from trainer.model import MLP, build_model
from trainer.train import MOMENTUM, epoch_batches, steps_per_epoch

pytestmark = pytest.mark.horovod


@pytest.fixture
def autocommit(db_url):
    with psycopg.connect(db_url, autocommit=True) as connection:
        yield connection


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def run_job(run: runs.Run, db_url: str) -> list[str]:
    log = logging.getLogger(f"test.train.{run.run_id}")
    handler = Lines()
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    try:
        launch_local.run_local(run.run_id, run.config.world_size, db_url, log, timeout_seconds=300)
    finally:
        log.removeHandler(handler)
    return handler.lines


def test_two_ranks_train_and_stage_parameters(autocommit, db_url):
    seed_samples(autocommit, rows=400, dim=16, classes=4)
    run = planned_run(autocommit, world_size=2, epochs=3, hidden_sizes=[12])
    output = run_job(run, db_url)

    assert any("rank 0/2" in line for line in output) and any("rank 1/2" in line for line in output)
    metrics = runs.epoch_metrics(autocommit, run.run_id)
    assert [m["epoch"] for m in metrics] == [1, 2, 3]
    assert metrics[-1]["train_loss"] < metrics[0]["train_loss"]
    staged = tensors.read_staged(autocommit, run.run_id)
    spec = ModelSpec(16, (12,), 4)
    assert {name: arr.shape for name, arr in staged.items()} == spec.parameter_shapes()
    assert all(np.isfinite(arr).all() for arr in staged.values())
    assert runs.get_run(autocommit, run.run_id).status == "trained"


def test_model_state_dict_matches_the_spec():
    spec = ModelSpec(64, (50, 20), 10)
    state = MLP(spec).state_dict()
    assert {name: tuple(t.shape) for name, t in state.items()} == spec.parameter_shapes()


def test_two_rank_sgd_equals_single_process_on_the_same_global_batches(autocommit, db_url):
    """One epoch of Horovod SGD == one process stepping on the concatenated per-rank batches."""
    seed_samples(autocommit, rows=96, dim=6, classes=3, seed=7)
    run = planned_run(autocommit, world_size=2, epochs=1, batch_size=8, hidden_sizes=[5],
                      validation_fraction=0.0, learning_rate=0.1, seed=3)
    run_job(run, db_url)
    distributed = tensors.read_staged(autocommit, run.run_id)

    shards = runs.get_manifest(autocommit, run.run_id)
    assert [s.train_count for s in shards] == [48, 48]
    source = manifest.source_for(autocommit, run)
    data = [loader.load_shard(autocommit, source, s, run.input_dim, 0.0, run.config.seed) for s in shards]
    spec = ModelSpec(run.input_dim, run.config.hidden_sizes, run.num_classes)
    model = build_model(spec, run.config.seed)
    everything = torch.from_numpy(np.concatenate([d.features for d in data])).double()
    mean = everything.mean(0)
    std = everything.std(0, unbiased=False)
    model.normalizer.mean.copy_(mean.float())
    model.normalizer.std.copy_(torch.where(std < 1e-6, torch.ones_like(std), std).float())
    optimizer = torch.optim.SGD(model.parameters(), lr=run.config.learning_rate, momentum=MOMENTUM)
    steps = steps_per_epoch(shards, run.config.batch_size)
    per_rank = [epoch_batches(np.arange(48), steps, run.config.seed, 1, rank) for rank in range(2)]
    for step in range(steps):
        x = torch.cat([torch.from_numpy(data[r].features[per_rank[r][step]]) for r in range(2)])
        y = torch.cat([torch.from_numpy(data[r].labels[per_rank[r][step]]) for r in range(2)])
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    reference = {name: t.detach().numpy() for name, t in model.state_dict().items()}
    assert set(reference) == set(distributed)
    for name in reference:
        np.testing.assert_allclose(distributed[name], reference[name], atol=1e-5, rtol=0, err_msg=name)
    # The comparison has teeth: training moved every layer far beyond the tolerance from where it started.
    initial = build_model(spec, run.config.seed).state_dict()
    for name in (n for n in reference if n.startswith("layers.")):
        assert np.abs(distributed[name] - initial[name].numpy()).max() > 1e-3, name


def test_a_failing_rank_fails_the_job_with_its_output(autocommit, db_url):
    seed_samples(autocommit, rows=60)
    run = planned_run(autocommit, world_size=3, epochs=1)
    with pytest.raises(TrainingInputError) as failure:
        launch_local.run_local(run.run_id, 2, db_url, logging.getLogger("test.fail"), timeout_seconds=120)
    message = str(failure.value)
    assert message.startswith(f"run {run.run_id} cannot train on its planned input:")
    assert "planned for 3 ranks but this Horovod job has 2; launch it with -np 3" in message


def test_a_crashing_rank_fails_the_job_with_the_output_tail(autocommit, db_url, monkeypatch):
    seed_samples(autocommit, rows=60)
    run = planned_run(autocommit, world_size=2, epochs=1)
    crash = [sys.executable, "-c", "print('rank output before the crash', flush=True); raise SystemExit(3)"]
    monkeypatch.setattr(launch_local, "local_command", lambda run_id, world_size: crash)
    with pytest.raises(TrainingFailed) as failure:
        launch_local.run_local(run.run_id, 2, db_url, logging.getLogger("test.crash"), timeout_seconds=60)
    assert not isinstance(failure.value, TrainingInputError)
    assert "exited with status 3" in str(failure.value)
    assert "rank output before the crash" in str(failure.value)


def test_a_job_past_its_timeout_is_stopped(autocommit, db_url, monkeypatch):
    seed_samples(autocommit, rows=60)
    run = planned_run(autocommit, world_size=2, epochs=1)
    slow = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"]
    monkeypatch.setattr(launch_local, "local_command", lambda run_id, world_size: slow)
    started = time.monotonic()
    with pytest.raises(TrainingFailed, match="did not finish within 1 s") as failure:
        launch_local.run_local(run.run_id, 2, db_url, logging.getLogger("test.timeout"), timeout_seconds=1)
    assert time.monotonic() - started < 10
    assert "started" in str(failure.value)
