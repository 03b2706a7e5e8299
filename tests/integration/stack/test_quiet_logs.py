"""What a new user saw in every log of the stack and is gone (issue 20 item 12): pathspec's GitWildMatchPattern
deprecation in every process that loads plugins (each task), and, for each commit of an ad-hoc model, Airflow's
"AssetModel ... not found" and "Emitting event for inactive AssetModel" (commit_parameters emits an event only
for a model whose asset a DAG declares)."""

from __future__ import annotations

import pytest

from tests.integration.stack.airflow_stack import AirflowStack

pytestmark = [pytest.mark.stack, pytest.mark.timeout(1800)]

NOISE = ("GitWildMatchPattern", "cannot create asset event", "inactive AssetModel", "XDG_RUNTIME_DIR")
TASKS = ("provision_tables", "plan_run", "compute_shards", "train", "commit_parameters", "report")


def test_an_ad_hoc_run_logs_no_deprecation_and_no_orphan_asset_event(airflow_stack: AirflowStack,
                                                                     stack_training_run):
    dag_id, run_id = stack_training_run["dag_id"], stack_training_run["dag_run_id"]
    logs = {task: airflow_stack.task_log(dag_id, run_id, task) for task in TASKS}
    assert all(text.strip() for text in logs.values()), logs
    model = stack_training_run["conf"]["model_name"]
    assert f"no asset event: no DAG schedules on pgtrain://pgtrain_db/{model}" in logs["commit_parameters"]
    for task, text in logs.items():
        assert not [line for line in text.splitlines() if any(n in line for n in NOISE)], task
    for path in sorted(airflow_stack.logs_dir.rglob("*.log")):  # the services' (and every task's) own files
        noisy = [line for line in path.read_text(errors="replace").splitlines() if any(n in line for n in NOISE)]
        assert not noisy, f"{path}: {noisy[:3]}"
