"""Where a run's weights start: its own checkpoint (a retried attempt) or a committed version (init_from)."""

from __future__ import annotations

import os
import signal

import numpy as np
import psutil
import psycopg
import pytest

from dev import examples
from pgtrain.core.errors import TrainingFailed, TrainingInputError
from pgtrain.runs import record
from pgtrain.store import tensors
from pgtrain.store.model_store import commit_run, load_tensors
from tests.support import (
    job_in_background,
    planned_run,
    run_job,
    seed_noise,
    seed_samples,
    wait_for_checkpoint,
)

pytestmark = pytest.mark.horovod


def trainer_rank(run_id: str, rank: int) -> psutil.Process | None:
    for process in psutil.process_iter(["cmdline"]):
        try:
            cmdline = process.info["cmdline"] or []
            environ = process.environ() if "trainer" in cmdline and run_id in cmdline else {}
            if str(rank) in (environ.get("HOROVOD_RANK"), environ.get("RANK")):  # horovod's ranks, torch's
                return process
            if rank == 0 and "--alone" in cmdline and run_id in cmdline:  # one rank, started without horovodrun
                return process
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


STOPS_AFTER_RESUMING = dict(source_table="public.noise", world_size=2, epochs=12, batch_size=8, hidden_sizes=[64],
                            learning_rate=0.02, lr_schedule="constant", early_stopping_patience=2, checkpoint_every=1)


ADAMW_COSINE = dict(world_size=2, epochs=4, batch_size=16, hidden_sizes=[8], learning_rate=0.05, checkpoint_every=1)
# The torch backend with a short collective timeout: the surviving rank fails within it, not hours later.
TORCH = dict(backend="torch", collective_timeout=30)


@pytest.mark.parametrize("params", [ADAMW_COSINE, STOPS_AFTER_RESUMING, {**ADAMW_COSINE, **TORCH}],
                         ids=["adamw-cosine", "stops-early-after-resuming", "torch-backend"])
def test_a_retried_run_resumes_from_its_checkpoint_and_ends_where_an_uninterrupted_run_does(autocommit, db_url,
                                                                                           params):
    """The defaults (AdamW, cosine schedule, early stopping): the optimizer's state, the schedule's position, the
    best epoch's parameters and the patience left all come back from the epoch-2 checkpoint. In the second case
    the best epoch is at most 2 and the run stops after resuming, staging the checkpoint's best parameters. On
    the torch backend the SIGKILLed rank fails the job too, and the retry resumes as bit-identically."""
    if params is STOPS_AFTER_RESUMING:
        seed_noise(autocommit, 160)
    else:
        seed_samples(autocommit, rows=200, dim=8, classes=4, seed=5)
    full = planned_run(autocommit, "full", **params)
    run_job(full, db_url)
    expected = tensors.read_staged(autocommit, full.run_id)
    expected_metrics = record.epoch_metrics(autocommit, full.run_id)
    trained = [m["epoch"] for m in expected_metrics]
    if params is STOPS_AFTER_RESUMING:  # the case this parameter is for: best before the checkpoint, stop after
        assert expected_metrics[-1]["best_epoch"] <= 2 and 3 <= len(trained) < params["epochs"], expected_metrics

    resumed = planned_run(autocommit, "resumed", **params)
    # Hold rank 0 at its epoch-3 metrics (an uncommitted row with that key makes its upsert wait): the
    # epoch-2 checkpoint is written by then, epoch 3's is not.
    with psycopg.connect(db_url) as blocker:
        blocker.execute("INSERT INTO pgtrain.run_metrics (run_id, epoch, train_loss, seconds) VALUES (%s, 3, 0, 0)",
                        (resumed.run_id,))
        first_lines: list[str] = []
        attempt, failure = job_in_background(resumed, db_url, first_lines)
        wait_for_checkpoint(db_url, resumed.run_id, 2)
        rank_1 = trainer_rank(resumed.run_id, 1)
        assert rank_1 is not None
        os.kill(rank_1.pid, signal.SIGKILL)
        attempt.join(timeout=240)
        assert not attempt.is_alive()
        blocker.rollback()
    assert len(failure) == 1 and isinstance(failure[0], TrainingFailed), failure
    assert not isinstance(failure[0], TrainingInputError)
    assert autocommit.execute("SELECT epoch FROM pgtrain.checkpoints WHERE run_id = %s",
                              (resumed.run_id,)).fetchone() == (2,)

    lines = run_job(resumed, db_url)  # the retry: a new attempt of the same run
    assert any("resuming from the checkpoint of epoch 2" in line for line in lines)
    assert not any(f"epoch 2/{params['epochs']}:" in line for line in lines)  # epochs 1 and 2 were not trained again
    actual = tensors.read_staged(autocommit, resumed.run_id)
    assert set(actual) == set(expected)
    for name in expected:
        np.testing.assert_allclose(actual[name], expected[name], atol=1e-5, rtol=0, err_msg=name)
    # Every epoch's metrics are there, the resumed ones kept in the checkpoint across the retry's cleanup.
    metrics = record.epoch_metrics(autocommit, resumed.run_id)
    assert [m["epoch"] for m in metrics] == trained
    for got, want in zip(metrics, expected_metrics, strict=True):
        assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-5)
        assert got["val_accuracy"] == pytest.approx(want["val_accuracy"], rel=1e-5)
        assert got.get("best_epoch") == want.get("best_epoch")
    # The staged parameters supersede the checkpoint.
    assert autocommit.execute("SELECT count(*) FROM pgtrain.checkpoints WHERE run_id = %s",
                              (resumed.run_id,)).fetchone() == (0,)


def test_warm_start_from_the_head(autocommit, db_url):
    seed_samples(autocommit, rows=240, dim=8, classes=4, seed=6)
    params = dict(world_size=2, epochs=2, batch_size=16, hidden_sizes=[10], learning_rate=0.05,
                  model_name="warm", init_from="head")
    # No head yet: "head" means scratch, and says so.
    first = planned_run(autocommit, "first", **params)
    lines = run_job(first, db_url)
    assert any("model 'warm' has no head yet; training from scratch" in line for line in lines)
    assert record.get_run(autocommit, first.run_id).config.init_from == "head"
    scratch_loss = record.epoch_metrics(autocommit, first.run_id)[0]["train_loss"]
    parent = commit_run(autocommit, first.run_id)
    _, parent_arrays = load_tensors(autocommit, "warm", parent.version)

    # More rows, shifted: new statistics would differ, the warm model keeps its parent's.
    features, labels = examples.synthetic(120, 8, 4, seed=6)
    examples.insert_samples(autocommit, features + 3.0, labels)
    second = planned_run(autocommit, "second", **params)
    lines = run_job(second, db_url)
    assert any(f"warm start from version {parent.version} of model 'warm'" in line for line in lines)
    init_version = autocommit.execute("SELECT init_version FROM pgtrain.training_runs WHERE run_id = %s",
                                      (second.run_id,)).fetchone()[0]
    assert init_version == parent.version
    assert record.epoch_metrics(autocommit, second.run_id)[0]["train_loss"] < scratch_loss
    staged = tensors.read_staged(autocommit, second.run_id)
    for name in ("normalizer.mean", "normalizer.std"):
        np.testing.assert_array_equal(staged[name], parent_arrays[name])


def test_a_warm_start_that_does_not_fit_is_refused_before_the_trainer_takes_any_rows(autocommit, db_url):
    seed_samples(autocommit, rows=80, dim=6, classes=3, seed=2)
    parent = planned_run(autocommit, "parent", world_size=1, epochs=1, hidden_sizes=[5], model_name="fit")
    run_job(parent, db_url)
    version = commit_run(autocommit, parent.run_id).version

    child = planned_run(autocommit, "child", world_size=1, epochs=1, hidden_sizes=[7], model_name="fit",
                        init_from=version)
    lines: list[str] = []
    with pytest.raises(TrainingInputError) as refused:
        run_job(child, db_url, lines)
    message = str(refused.value)
    assert f"init_from={version}: version {version} of model 'fit' does not fit this run's model 'mlp'" in message
    assert "net.0.weight has shape [5, 6], the model has [7, 6]" in message
    # the trainer took no rows (a rank alone begins reading them while it imports torch: that read is dropped)
    assert not any("rank 0/1:" in line for line in lines)

    missing = planned_run(autocommit, "missing", world_size=1, epochs=1, hidden_sizes=[5], model_name="fit",
                          init_from=9)
    with pytest.raises(TrainingInputError, match=r"init_from=9: model 'fit' has no version 9"):
        run_job(missing, db_url)
