"""The run ledger (pgtrain.runs.record) owns pgtrain.training_runs: one read of a run gives every column a stage
needs, in one shape (a commit reads the run once, not again as a JSON dict)."""

from __future__ import annotations

from pgtrain.config.params import TrainingConfig
from pgtrain.runs import record


def test_a_run_read_once_holds_what_the_trainer_recorded(autocommit):
    run = record.plan_run(autocommit, "pgtrain_test", "r", TrainingConfig())
    assert (run.model_layout, run.init_version, run.backend, run.test_metrics) == (None, None, None, None)
    layout = {"net.0.weight": {"shape": [50, 8], "dtype": "float32"}}
    record.set_model_layout(autocommit, run.run_id, layout)
    record.set_init_version(autocommit, run.run_id, 3)
    record.set_backend(autocommit, run.run_id, "horovod")
    record.set_test_metrics(autocommit, run.run_id, {"test_accuracy": 0.75, "test_loss": float("nan")})
    again = record.get_run(autocommit, run.run_id)
    assert (again.model_layout, again.init_version, again.backend) == (layout, 3, "horovod")
    assert again.test_metrics == {"test_accuracy": 0.75, "test_loss": None}


def test_recorded_runs_are_the_snapshots_as_written_and_skip_ids_of_no_run(autocommit):
    run = record.plan_run(autocommit, "pgtrain_test", "r", TrainingConfig(epochs=3))
    found = record.recorded_runs(autocommit, [run.run_id, None, "pgtrain_test/none"])
    assert list(found) == [run.run_id]
    assert (found[run.run_id]["dag_run_id"], found[run.run_id]["config"]["epochs"]) == ("r", 3)
    assert record.latest_run_id(autocommit) == run.run_id
