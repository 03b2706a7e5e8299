"""Real Horovod ranks (horovodrun --gloo) training against a real PostgreSQL."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

import numpy as np
import psycopg
import pytest
import torch
import torch.nn.functional as F

from pgtrain.airflow.dag import train_run
from pgtrain.config.params import DEFAULT_ENSEMBLE_MEMBERS, TrainingConfig
from pgtrain.core.errors import ClaimLost, TrainingFailed, TrainingInputError
from pgtrain.data import loader, manifest
from pgtrain.data.source.rows import TRAIN
from pgtrain.launch import local as launch_local
from pgtrain.models.ensemble import member_loss
from pgtrain.models.network import ClampedUnstandardize, build_model
from pgtrain.models.spec import ModelSpec
from pgtrain.runs import record
from pgtrain.store import tensors
from tests.k8s_sim.airflow_context import task_context
from tests.support import (
    make_mixed_table,
    mixed_params,
    planned_run,
    run_job,
    seed_noise,
    seed_samples,
    taken_by_another_run,
)
from trainer.optim import Schedule, make_optimizer
from trainer.train import batch_and_rate, epoch_batches, parse_args, steps_per_epoch

pytestmark = pytest.mark.horovod


def seed_regression(conn: psycopg.Connection, rows: int, dim: int, seed: int = 0) -> np.ndarray:
    """public.houses (id, features real[], price double precision): a noisy linear target far from 0 and 1."""
    rng = np.random.default_rng(seed)
    features = rng.normal(0.0, 2.0, (rows, dim)).astype(np.float32)
    weights = rng.normal(0.0, 1.0, dim)
    price = 300.0 + 40.0 * features.astype(np.float64) @ weights + rng.normal(0.0, 5.0, rows)
    conn.execute("CREATE TABLE public.houses (id bigint PRIMARY KEY, features real[] NOT NULL, "
                 "price double precision NOT NULL)")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO public.houses VALUES (%s, %s, %s)",
                        [(i + 1, features[i].tolist(), float(price[i])) for i in range(rows)])
    return price


def reference_training(autocommit: psycopg.Connection, run: record.Run, loss_of,
                       snapshots: list[dict[str, torch.Tensor]] | None = None) -> tuple[torch.nn.Module, list]:
    """One process replaying the ranks' epochs: per step, the mean over ranks of each rank's batch loss
    (what averaging the ranks' gradients computes), on the same seeded batches and global statistics, with the
    run's optimizer and learning-rate schedule (every epoch: the runs compared with it stop no earlier)."""
    config = run.config
    shards = record.get_manifest(autocommit, run.run_id)
    source = manifest.source_for(autocommit, run)
    data = [loader.load_shard(autocommit, source, s, run.input_dim, config.validation_fraction, config.seed,
                              test_fraction=config.test_fraction) for s in shards]
    train = [np.flatnonzero(d.part == TRAIN) for d in data]
    model = build_model(config.model, run.input_dim, run.output_dim, config.model_options_for_build, config.seed,
                        run.encoding)
    everything = torch.from_numpy(np.concatenate([d.features[t] for d, t in zip(data, train, strict=True)])).double()
    everything = everything[:, :model.standardized_columns]  # categorical codes are one-hot encoded, not scaled
    std = everything.std(0, unbiased=False)
    model.normalizer.mean.copy_(everything.mean(0).float())
    model.normalizer.std.copy_(torch.where(std < 1e-6, torch.ones_like(std), std).float())
    if config.task == "regression":
        targets = torch.from_numpy(np.concatenate([d.labels[t] for d, t in zip(data, train, strict=True)]))
        targets = targets.double().reshape(len(targets), -1)
        model.target.mean.copy_(targets.mean(0).float())
        model.target.std.copy_(targets.std(0, unbiased=False).float())
        if isinstance(model.target, ClampedUnstandardize):  # the training targets' range
            model.target.low.copy_(targets.amin(0).float())
            model.target.high.copy_(targets.amax(0).float())
    batch_size, learning_rate = batch_and_rate(config, shards)  # the run's, or the auto ones
    optimizer = make_optimizer(config, model, learning_rate)
    steps = steps_per_epoch(shards, batch_size)
    schedule = Schedule(config, optimizer, learning_rate, steps)
    for epoch in range(1, config.epochs + 1):
        per_rank = [epoch_batches(train[r], steps, config.seed, epoch, r) for r in range(len(shards))]
        for step in range(steps):
            schedule.set((epoch - 1) * steps + step)
            optimizer.zero_grad()
            total = sum(loss_of(model, torch.from_numpy(data[r].features[per_rank[r][step]]),
                                torch.from_numpy(data[r].labels[per_rank[r][step]]))
                        for r in range(len(shards)) if len(per_rank[r][step]))
            (total / len(shards)).backward()
            optimizer.step()
        if snapshots is not None:  # the parameters at the end of each epoch
            snapshots.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    return model, data


def assert_same_parameters(distributed: dict[str, np.ndarray], model: torch.nn.Module, run: record.Run) -> None:
    reference = {name: t.detach().numpy() for name, t in model.state_dict().items()}
    assert set(reference) == set(distributed)
    for name in reference:
        np.testing.assert_allclose(distributed[name], reference[name], atol=1e-5, rtol=0, err_msg=name)
    # The comparison has teeth: training moved every layer far beyond the tolerance from where it started.
    config = run.config
    initial = build_model(config.model, run.input_dim, run.output_dim, config.model_options_for_build,
                          config.seed, run.encoding).state_dict()
    for name in (n for n in reference if n.startswith("net.")):
        assert np.abs(distributed[name] - initial[name].numpy()).max() > 1e-3, name


def test_two_ranks_train_and_stage_parameters(autocommit, db_url, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the automatic count, whatever this machine's says
    seed_samples(autocommit, rows=400, dim=16, classes=4)
    run = planned_run(autocommit, world_size=2, epochs=3, hidden_sizes=[12])
    output = run_job(run, db_url)

    assert any("rank 0/2" in line for line in output) and any("rank 1/2" in line for line in output)
    assert any("epoch 3/3" in line and "samples/s" in line for line in output)
    # a step this small is too little work for a second thread, and the thread sleeps while it waits
    assert any("1 threads per rank, passive waits" in line for line in output)
    metrics = record.epoch_metrics(autocommit, run.run_id)
    assert [m["epoch"] for m in metrics] == [1, 2, 3]
    assert metrics[-1]["train_loss"] < metrics[0]["train_loss"]
    assert all(m["samples_per_second"] > 0 and 0 <= m["val_accuracy"] <= 1 for m in metrics)
    staged = tensors.read_staged(autocommit, run.run_id)
    spec = ModelSpec(16, (12,), 4, members=DEFAULT_ENSEMBLE_MEMBERS)  # the default layout
    assert {name: arr.shape for name, arr in staged.items()} == spec.parameter_shapes()
    assert all(np.isfinite(arr).all() for arr in staged.values())
    layout, init_version = autocommit.execute(
        "SELECT model_layout, init_version FROM pgtrain.training_runs WHERE run_id = %s", (run.run_id,)).fetchone()
    assert layout == {name: {"shape": list(arr.shape), "dtype": "float32"} for name, arr in staged.items()}
    assert init_version is None
    assert record.get_run(autocommit, run.run_id).status == "trained"


@pytest.mark.parametrize("task, members", [("classification", 1), ("classification", 5), ("regression", 1),
                                           ("regression", 32)])
def test_model_state_dict_matches_the_spec(task, members):
    """The torch-free spec holds the built model's names and shapes: a plain MLP (every version from before the
    ensemble) or an ensemble, and a regression's clamp range."""
    options = TrainingConfig(task=task, hidden_sizes=(50, 20), ensemble_members=members).model_options_for_build
    spec = ModelSpec(64, (50, 20), 10, members=members, clamp_target=task == "regression")
    built = build_model("mlp", 64, 10, options, seed=0).state_dict()
    assert {name: tuple(t.shape) for name, t in built.items()} == spec.parameter_shapes()
    old = build_model("mlp", 64, 10, {"hidden_sizes": [50, 20]}, seed=0).state_dict()  # an old version's spec
    assert {name: tuple(t.shape) for name, t in old.items()} == ModelSpec(64, (50, 20), 10).parameter_shapes()


def test_the_trainer_is_always_told_its_attempt(capsys):
    # A trainer without an attempt would write unfenced over a newer attempt's output.
    with pytest.raises(SystemExit):
        parse_args(["--run-id", "d/r"])
    assert "the following arguments are required: --attempt" in capsys.readouterr().err
    assert parse_args(["--run-id", "d/r", "--attempt", "4"]).attempt == 4
    assert launch_local.local_command("d/r", 2, 4)[-7:] == [sys.executable, "-m", "trainer", "--run-id", "d/r",
                                                            "--attempt", "4"]


@pytest.mark.parametrize("backend", ["horovod", "torch"])
def test_two_rank_sgd_equals_single_process_on_the_same_global_batches(autocommit, db_url, backend):
    """One epoch of SGD on two ranks (either backend) == one process stepping on the concatenated per-rank
    batches; the run records the backend that trained it."""
    seed_samples(autocommit, rows=96, dim=6, classes=3, seed=7)
    run = planned_run(autocommit, world_size=2, epochs=1, batch_size=8, hidden_sizes=[5], backend=backend,
                      validation_fraction=0.0, test_fraction=0, allow_unvalidated=True, learning_rate=0.1,
                      seed=3)
    output = run_job(run, db_url)
    distributed = tensors.read_staged(autocommit, run.run_id)
    assert any(f"starting 2 {backend} ranks" in line for line in output)
    assert autocommit.execute("SELECT backend FROM pgtrain.training_runs WHERE run_id = %s",
                              (run.run_id,)).fetchone() == (backend,)

    shards = record.get_manifest(autocommit, run.run_id)
    assert [s.train_count for s in shards] == [48, 48]
    model, _ = reference_training(autocommit, run, lambda m, x, y: member_loss(F.cross_entropy, m(x), y))
    assert_same_parameters(distributed, model, run)


def test_the_auto_batch_and_learning_rate_train_as_the_reference_does(autocommit, db_url):
    """batch_size and learning_rate left empty: 2,000 training rows a rank -> 40 rows a step and AdamW's learning
    rate of 0.008 x sqrt(80 / 64), the same in the ranks as in the single-process reference."""
    seed_samples(autocommit, rows=4000, dim=6, classes=3, seed=5)
    run = planned_run(autocommit, world_size=2, epochs=1, hidden_sizes=[5], validation_fraction=0.0,
                      test_fraction=0, allow_unvalidated=True, seed=2)
    assert (run.config.batch_size, run.config.learning_rate) == (None, None)
    output = run_job(run, db_url)
    assert batch_and_rate(run.config, record.get_manifest(autocommit, run.run_id)) == (40, 0.008 * 1.25 ** 0.5)
    assert any("adamw at learning rate 0.00894427 (cosine schedule), batch 40 rows per rank (global 80), 50 steps "
               "per epoch" in line for line in output)
    assert any("early stopping is off: the run has no validation rows" in line for line in output)
    model, _ = reference_training(autocommit, run, lambda m, x, y: member_loss(F.cross_entropy, m(x), y))
    assert_same_parameters(tensors.read_staged(autocommit, run.run_id), model, run)


def test_two_rank_regression_equals_single_process_and_reports_its_metrics(autocommit, db_url):
    """Regression on a scalar target: the same equivalence (MSE on the standardized target, two epochs with
    momentum and a validation split), and val_rmse / val_mae / val_r2 in the target's units over all ranks."""
    price = seed_regression(autocommit, rows=120, dim=5, seed=2)
    run = planned_run(autocommit, world_size=2, epochs=2, batch_size=10, hidden_sizes=[6],
                      validation_fraction=0.25, test_fraction=0, learning_rate=0.05, seed=1,
                      source_table="public.houses",
                      early_stopping_patience=0, optimizer="sgd", lr_schedule="constant",
                      label_column="price", task="regression", model_name="houses")
    assert (run.output_dim, run.num_classes) == (1, None)
    output = run_job(run, db_url)
    distributed = tensors.read_staged(autocommit, run.run_id)

    def loss(m, x, y):
        return member_loss(F.mse_loss, m.standardized(x), m.target.scale(y.float().reshape(len(y), -1)))

    model, data = reference_training(autocommit, run, loss)
    assert_same_parameters(distributed, model, run)
    assert abs(float(model.target.mean[0]) - price.mean()) < 0.2 * price.std()  # in the target's units

    # The last epoch's validation metrics, recomputed from the staged model on every rank's validation rows.
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in distributed.items()})
    model.eval()  # the members' average, clamped: as the run's figures are read
    x = torch.from_numpy(np.concatenate([d.features[d.is_validation] for d in data]))
    y = np.concatenate([d.labels[d.is_validation] for d in data]).astype(np.float64).reshape(-1)
    with torch.no_grad():
        predicted = model(x).double().numpy().reshape(-1)
    error = predicted - y
    last = record.epoch_metrics(autocommit, run.run_id)[-1]
    # A regression records no accuracy: record.epoch_metrics leaves out the columns that do not apply.
    assert last["epoch"] == 2 and "train_accuracy" not in last and "val_accuracy" not in last
    assert last["val_rmse"] == pytest.approx(np.sqrt(np.mean(error ** 2)), rel=1e-4)
    assert last["val_mae"] == pytest.approx(np.mean(np.abs(error)), rel=1e-4)
    assert last["val_r2"] == pytest.approx(1 - np.sum(error ** 2) / np.sum((y - y.mean()) ** 2), abs=1e-4)
    # the target is learnt (32 members, 2 epochs: well above the mean): the check above is not comparing two failures
    assert last["val_r2"] > 0.1
    assert any("epoch 2/2" in line and "val rmse" in line and "samples/s" in line for line in output)


@pytest.mark.parametrize("numeric_bins", [0, 8])
def test_two_rank_sgd_on_scalar_feature_columns_equals_single_process(autocommit, db_url, numeric_bins):
    """Features from scalar columns of mixed types (in feature_columns order), an integer label; with numeric_bins,
    each value through its quantile bins (issue 31)."""
    rng = np.random.default_rng(8)
    rows = 90
    size = rng.normal(100.0, 30.0, rows)
    rooms = rng.integers(1, 6, rows)
    age = rng.normal(20.0, 10.0, rows).astype(np.float32)
    label = ((size > 100).astype(int) + (rooms > 3).astype(int))  # 0, 1 or 2
    autocommit.execute("CREATE TABLE public.flats (id bigint PRIMARY KEY, size double precision NOT NULL, "
                       "rooms integer NOT NULL, age real NOT NULL, kind integer NOT NULL)")
    with autocommit.cursor() as cur:
        cur.executemany("INSERT INTO public.flats VALUES (%s, %s, %s, %s, %s)",
                        [(i + 1, float(size[i]), int(rooms[i]), float(age[i]), int(label[i])) for i in range(rows)])
    run = planned_run(autocommit, world_size=2, epochs=2, batch_size=8, hidden_sizes=[6], validation_fraction=0.2,
                      learning_rate=0.1, seed=4, source_table="public.flats", features_column=None,
                      early_stopping_patience=0,
                      feature_columns=["rooms", "age", "size"], label_column="kind", model_name="flats",
                      numeric_bins=numeric_bins)
    assert (run.input_dim, run.output_dim) == (3, 3)
    assert [len(c.get("edges", ())) for c in run.encoding["columns"]] == ([5, 9, 9] if numeric_bins else [0, 0, 0])
    run_job(run, db_url)
    distributed = tensors.read_staged(autocommit, run.run_id)

    model, data = reference_training(autocommit, run, lambda m, x, y: member_loss(F.cross_entropy, m(x), y))
    assert_same_parameters(distributed, model, run)
    first = data[0].features[0]  # the first key's row, columns in feature_columns order
    np.testing.assert_allclose(first, [rooms[0], age[0], size[0]], rtol=1e-6)


def test_a_failing_rank_fails_the_job_with_its_output(autocommit, db_url):
    seed_samples(autocommit, rows=60)
    # launcher=kubernetes: 3 local ranks would be refused in planning on a 2-CPU worker; the job is started by hand
    run = planned_run(autocommit, world_size=3, epochs=1, launcher="kubernetes")
    with pytest.raises(TrainingInputError) as failure:
        launch_local.run_local(run.run_id, 2, db_url, logging.getLogger("test.fail"), timeout_seconds=120)
    message = str(failure.value)
    assert message.startswith(f"run {run.run_id} cannot train on its planned input:")
    assert "planned for 3 ranks but this job has 2; launch it with -np 3" in message


def test_a_job_past_its_timeout_is_stopped(autocommit, db_url, monkeypatch):
    seed_samples(autocommit, rows=60)
    run = planned_run(autocommit, world_size=2, epochs=1)
    slow = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"]
    monkeypatch.setattr(launch_local, "local_command", lambda run_id, world_size, attempt, *backend: slow)
    started = time.monotonic()
    with pytest.raises(TrainingFailed, match="did not finish within 1 s") as failure:
        launch_local.run_local(run.run_id, 2, db_url, logging.getLogger("test.timeout"), timeout_seconds=1)
    assert time.monotonic() - started < 10
    assert "started" in str(failure.value)


@pytest.mark.parametrize("taken_by", ["another run", "a new try"])
def test_a_job_whose_training_claim_is_lost_is_stopped(autocommit, db_url, monkeypatch, tmp_path, taken_by):
    """The claim's heartbeat (every ttl / 3 = 10 s) finds it taken: the job is killed at once rather than train beside
    another job of the model. Taken by another run (its holder's lease ran out), the run is marked failed, naming
    that run; by a new try of the same run, which runs its own job, this try leaves the run to it."""
    from pgtrain.launch.attempt import claim_name, training_claim
    from pgtrain.store.locks import LockManager

    seed_samples(autocommit, rows=60)
    run = planned_run(autocommit, world_size=2, epochs=1)
    pid_file = tmp_path / "pid"
    slow = [sys.executable, "-c", f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
                                  "print('started', flush=True); time.sleep(300)"]
    monkeypatch.setattr(launch_local, "local_command", lambda run_id, world_size, attempt, *backend: slow)
    outcome: list[BaseException] = []

    monkeypatch.setenv("AIRFLOW_CONN_PGTRAIN_DB", db_url)  # the train task's connection, as Airflow provides it
    ti = task_context("pgtrain_test", run.dag_run_id)["ti"]

    def job(lease) -> None:
        try:
            with train_run.failure_recorded("pgtrain_db", run.run_id, ti):  # as LocalTrainOperator runs it
                launch_local.run_local(run.run_id, 2, db_url, logging.getLogger("test.claim"), claim=lease)
        except BaseException as error:
            outcome.append(error)

    with training_claim(db_url, run) as claim, LockManager(db_url, heartbeat=False,
                                                           owner={"training_run": run.run_id}) as retry:
        watcher = threading.Thread(target=job, args=(claim.lease,), daemon=True)
        watcher.start()
        deadline = time.monotonic() + 60
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pid_file.exists(), "the job did not start"
        if taken_by == "another run":
            taken_by_another_run(db_url, claim_name(run.model_name), "pgtrain_test/other")
        else:
            retry.acquire_lock(claim_name(run.model_name), timeout=5, take_over={"training_run": run.run_id})
        watcher.join(120)
        assert not watcher.is_alive(), "the job went on after its claim was lost"
    assert len(outcome) == 1 and isinstance(outcome[0], ClaimLost), outcome
    pid = pid_file.read_text()
    assert not os.path.exists(f"/proc/{pid}/status") or "zombie" in open(f"/proc/{pid}/status").read().lower()
    after = record.get_run(autocommit, run.run_id)
    if taken_by == "another run":
        assert not outcome[0].superseded and "and run pgtrain_test/other (host=elsewhere, pid=1) took it" in str(
            outcome[0]) and "started" in str(outcome[0])  # the job's last lines
        assert after.status == "failed" and "pgtrain_test/other" in after.status_reason
    else:
        assert outcome[0].superseded and "taken over by a new try of the run" in str(outcome[0])
        assert after.status != "failed"  # the run's outcome is the new try's


def test_two_rank_training_on_categories_and_imputed_nulls_equals_single_process(autocommit, db_url):
    """Text, varchar, char(1), enum and boolean columns, a date, NULLs imputed, a text label: 2 ranks == 1 process."""
    make_mixed_table(autocommit, 240)
    run = planned_run(autocommit, world_size=2, epochs=2, batch_size=8, hidden_sizes=[6], validation_fraction=0.2,
                      learning_rate=0.1, seed=4, early_stopping_patience=0, **mixed_params())
    assert run.encoding["classes"] == ["Adelie", "Chinstrap", "Gentoo"]
    assert any(c["missing"] for c in run.encoding["columns"])  # body_mass: imputed, with its "was missing" input
    run_job(run, db_url)
    distributed = tensors.read_staged(autocommit, run.run_id)
    model, _ = reference_training(autocommit, run, lambda m, x, y: member_loss(F.cross_entropy, m(x), y))
    assert_same_parameters(distributed, model, run)
    assert distributed["net.0.weight"].shape[1] == 5 + 5 + 4 + 6 + 7  # numbers + missing, then one-hot levels


def balanced_weights(data: list, classes: int) -> torch.Tensor:
    """class_weight=balanced from every rank's training rows, computed here independently of the trainer."""
    labels = np.concatenate([d.labels[d.part == TRAIN] for d in data])
    counts = np.bincount(labels, minlength=classes).astype(np.float64)
    return torch.from_numpy(len(labels) / (classes * counts)).float()


@pytest.mark.parametrize("optimizer,schedule,backend", [("adamw", "cosine", "horovod"), ("sgd", "one_cycle", "horovod"),
                                                        ("adamw", "cosine", "torch"), ("sgd", "one_cycle", "torch")])
def test_two_ranks_with_each_optimizer_schedule_class_weights_and_early_stopping_equal_one_process(
        autocommit, db_url, optimizer, schedule, backend):
    """AdamW or SGD, a warm-up schedule, balanced class weights and early stopping: the staged parameters are the
    best epoch's (by val_loss) of a single process stepping on the same global batches, and the recorded metrics
    are that epoch's, computed here from the reference's snapshots."""
    seed_samples(autocommit, rows=240, dim=6, classes=3, seed=11)
    autocommit.execute("UPDATE public.samples SET label = 0 WHERE id % 5 <> 0 AND label <> 0")  # imbalanced
    run = planned_run(autocommit, world_size=2, epochs=6, batch_size=8, hidden_sizes=[6], validation_fraction=0.25,
                      seed=4, optimizer=optimizer, lr_schedule=schedule, warmup_epochs=1, class_weight="balanced",
                      early_stopping_patience=2, learning_rate=0.05 if optimizer == "sgd" else 0.01, backend=backend)
    output = run_job(run, db_url)
    distributed = tensors.read_staged(autocommit, run.run_id)
    metrics = record.epoch_metrics(autocommit, run.run_id)

    weights: list[torch.Tensor] = []

    def loss(m, x, y):
        return member_loss(lambda out, y: F.cross_entropy(out, y, weight=weights[0], reduction="sum") / len(y),
                           m(x), y)

    shards = record.get_manifest(autocommit, run.run_id)
    source = manifest.source_for(autocommit, run)
    data = [loader.load_shard(autocommit, source, s, run.input_dim, 0.25, 4, test_fraction=run.config.test_fraction)
            for s in shards]
    weights.append(balanced_weights(data, 3))
    snapshots: list[dict[str, torch.Tensor]] = []
    model, data = reference_training(autocommit, run, loss, snapshots)
    # The reference's validation log loss after each epoch: its best epoch is the run's.
    x = torch.from_numpy(np.concatenate([d.features[d.is_validation] for d in data]))
    y = torch.from_numpy(np.concatenate([d.labels[d.is_validation] for d in data]))
    losses = []
    model.eval()  # the members' average, as the run's validation figures are
    for state in snapshots:
        model.load_state_dict(state)
        with torch.no_grad():
            losses.append(float(F.cross_entropy(model(x), y)))
    trained = len(metrics)
    best = int(np.argmin(losses[:trained])) + 1
    assert [m["epoch"] for m in metrics] == list(range(1, trained + 1))
    assert metrics[-1]["best_epoch"] == best
    np.testing.assert_allclose([m["val_loss"] for m in metrics], losses[:trained], rtol=1e-4)
    if trained < 6:  # stopped early: patience epochs without a better val_loss
        assert trained - best == 2 and any("stopped early" in line for line in output)
    model.load_state_dict(snapshots[best - 1])
    assert_same_parameters(distributed, model, run)


def test_early_stopping_keeps_the_best_epoch_when_validation_worsens(autocommit, db_url):
    """Random labels: the validation loss rises once the model memorizes. The run stops after patience epochs
    without improvement, records best_epoch, and stages exactly what a run of best_epoch epochs stages."""
    seed_noise(autocommit, 160)
    params = dict(source_table="public.noise", world_size=2, batch_size=8, hidden_sizes=[64],
                  validation_fraction=0.3, seed=1, lr_schedule="constant", learning_rate=0.02)
    stopped = planned_run(autocommit, "stopped", epochs=40, early_stopping_patience=3, **params)
    output = run_job(stopped, db_url)
    metrics = record.epoch_metrics(autocommit, stopped.run_id)
    best = metrics[-1]["best_epoch"]
    losses = [m["val_loss"] for m in metrics]
    assert len(metrics) < 40 and len(metrics) == best + 3  # it stopped, patience epochs after its best
    assert losses[best - 1] == min(losses) and losses[-1] > losses[best - 1]
    assert any(f"the best epoch by val_loss is {best} of {len(metrics)}" in line for line in output)

    fixed = planned_run(autocommit, "fixed", epochs=best, early_stopping_patience=0, **params)
    run_job(fixed, db_url)
    expected = tensors.read_staged(autocommit, fixed.run_id)
    staged = tensors.read_staged(autocommit, stopped.run_id)
    for name in expected:
        np.testing.assert_array_equal(staged[name], expected[name], err_msg=name)


def test_the_recorded_classification_metrics_are_scikit_learn_s_on_every_rank_s_validation_rows(autocommit, db_url):
    """val_accuracy, val_loss, balanced accuracy, F1 / precision / recall (macro), ROC AUC (one-vs-rest) and the
    confusion matrix of the last epoch: over the validation rows of both ranks, as scikit-learn computes them from
    the staged model's predictions."""
    from sklearn import metrics as sk

    seed_samples(autocommit, rows=300, dim=6, classes=3, seed=21)
    run = planned_run(autocommit, world_size=2, epochs=2, batch_size=8, hidden_sizes=[6], validation_fraction=0.3,
                      seed=2, early_stopping_patience=0)
    run_job(run, db_url)
    last = record.epoch_metrics(autocommit, run.run_id)[-1]
    model = build_model(run.config.model, run.input_dim, run.output_dim, run.config.model_options_for_build, 0)
    staged = tensors.read_staged(autocommit, run.run_id)
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in staged.items()})
    model.eval()
    source = manifest.source_for(autocommit, run)
    data = [loader.load_shard(autocommit, source, s, run.input_dim, 0.3, 2)
            for s in record.get_manifest(autocommit, run.run_id)]
    x = torch.from_numpy(np.concatenate([d.features[d.is_validation] for d in data]))
    y = np.concatenate([d.labels[d.is_validation] for d in data])
    with torch.no_grad():
        probabilities = model(x).softmax(1).numpy()
    predicted = probabilities.argmax(1)
    assert len(y) > 50 and len(set(predicted)) > 1  # a real comparison: several classes predicted
    expected = {
        "val_accuracy": sk.accuracy_score(y, predicted),
        "val_loss": sk.log_loss(y, probabilities, labels=[0, 1, 2]),
        "val_balanced_accuracy": sk.balanced_accuracy_score(y, predicted),
        "val_f1_macro": sk.f1_score(y, predicted, average="macro", zero_division=0),
        "val_precision_macro": sk.precision_score(y, predicted, average="macro", zero_division=0),
        "val_recall_macro": sk.recall_score(y, predicted, average="macro", zero_division=0),
        "val_roc_auc": sk.roc_auc_score(y, probabilities, multi_class="ovr", average="macro"),
    }
    for name, value in expected.items():
        assert last[name] == pytest.approx(value, abs=1e-6), name
    assert last["confusion_matrix"]["counts"] == sk.confusion_matrix(y, predicted, labels=[0, 1, 2]).tolist()
