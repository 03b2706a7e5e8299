"""Models built by real ranks: a factory model trains end to end, a bad one fails the run before any data is read.
(Building and refusing models in this process: tests/unit/test_trainer_models.py, whose factories the ranks import.)"""

from __future__ import annotations

import pytest
import torch

from pgtrain.core.errors import TrainingFailed
from pgtrain.models.network import build_model, state_layout
from pgtrain.runs import record
from pgtrain.store import tensors
from tests.conftest import REPO
from tests.support import planned_run, run_job, seed_samples
from tests.unit.test_trainer_models import RESMLP


def job_output(run: record.Run, db_url: str) -> tuple[list[str], Exception | None]:
    lines: list[str] = []
    try:
        run_job(run, db_url, lines)
        return lines, None
    except TrainingFailed as failure:
        return lines, failure


@pytest.mark.horovod
def test_a_factory_model_trains_end_to_end(autocommit, db_url):
    seed_samples(autocommit, rows=240, dim=10, classes=3, seed=4)
    options = {"width": 16, "blocks": 2}
    run = planned_run(autocommit, world_size=2, epochs=3, batch_size=16, learning_rate=0.02, model=RESMLP,
                      model_options=options)
    lines, failure = job_output(run, db_url)
    assert failure is None, lines[-20:]

    metrics = record.epoch_metrics(autocommit, run.run_id)
    assert [m["epoch"] for m in metrics] == [1, 2, 3]
    assert metrics[-1]["train_loss"] < metrics[0]["train_loss"]
    assert metrics[-1]["val_accuracy"] > 0.6  # three separable clusters: far above chance (1/3)
    staged = tensors.read_staged(autocommit, run.run_id)
    expected = build_model(RESMLP, 10, 3, options, seed=0)
    layout = autocommit.execute("SELECT model_layout FROM pgtrain.training_runs WHERE run_id = %s",
                                (run.run_id,)).fetchone()[0]
    assert layout == state_layout(expected)
    assert "net.blocks.1.norm.weight" in staged
    expected.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in staged.items()}, strict=True)


@pytest.mark.horovod
@pytest.mark.parametrize(("ref", "options", "says"), [
    ("no_such_package.models:net", {}, "cannot import 'no_such_package.models'"),
    (RESMLP, {"blocks": 0}, "the factory raised ValueError"),
    ("tests.unit.test_trainer_models:wrong_width", {}, "gives output [2, 9], the run needs [2, 8]"),
    ("tests.unit.test_trainer_models:fits_only_on_meta", {}, "cannot be allocated: allocating it failed (MemoryError)"),
])
def test_a_bad_model_fails_the_run_before_any_data_is_read(autocommit, db_url, monkeypatch, ref, options, says):
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # ranks import the unit test module like a user's package
    seed_samples(autocommit, rows=40, dim=4, classes=8)
    run = planned_run(autocommit, world_size=1, epochs=1, model=ref, model_options=options)
    lines, failure = job_output(run, db_url)

    assert failure is not None
    assert repr(ref) in str(failure) and says in str(failure)
    refusals = {line for line in lines if repr(ref) in line}
    assert len(refusals) == 1, refusals  # one line, no traceback around it
    assert not any("<stderr>:Traceback" in line for line in lines)  # the rank's, not horovodrun's own
    assert not any("rank 0/1:" in line for line in lines)  # the shard was never loaded
    assert record.epoch_metrics(autocommit, run.run_id) == []
    assert record.get_run(autocommit, run.run_id).status == "refused"  # bad input: not retried
