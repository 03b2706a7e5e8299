"""What a new user saw in every log of the stack (issue 20 item 12): for each commit of an ad-hoc model, Airflow's
"AssetModel ... not found" and "Emitting event for inactive AssetModel" (gone: commit_parameters emits an event
only for a model whose asset a DAG declares), and pathspec's GitWildMatchPattern deprecation wherever plugins are
loaded (gone from the services, which read plugins/.airflowignore as a regular expression; still in each task's
log, whose Task SDK 1.3.2 plugins manager ignores [core] dag_ignore_file_syntax: the strict xfail below)."""

from __future__ import annotations

import pytest

from tests.integration.stack.airflow_stack import AirflowStack

pytestmark = [pytest.mark.stack, pytest.mark.timeout(1800)]

ASSET_NOISE = ("cannot create asset event", "inactive AssetModel")
DEPRECATION = "GitWildMatchPattern"
TASKS = ("provision_tables", "plan_run", "compute_shards", "train", "commit_parameters", "report")
SERVICES_OWN_LOGS = ("api-server.log", "dag-processor.log", "triggerer.log")  # the scheduler's echoes task output


def noisy_lines(text: str, words: tuple[str, ...]) -> list[str]:
    return [line for line in text.splitlines() if any(word in line for word in words)]


def test_an_ad_hoc_commit_logs_no_orphan_asset_event(airflow_stack: AirflowStack, stack_training_run):
    dag_id, run_id = stack_training_run["dag_id"], stack_training_run["dag_run_id"]
    logs = {task: airflow_stack.task_log(dag_id, run_id, task) for task in TASKS}
    assert all(text.strip() for text in logs.values()), logs
    model = stack_training_run["conf"]["model_name"]
    assert f"no asset event: no DAG schedules on pgtrain://pgtrain_db/{model}" in logs["commit_parameters"]
    for task, text in logs.items():
        assert not noisy_lines(text, ASSET_NOISE), task
    for path in sorted(airflow_stack.logs_dir.rglob("*.log")):
        assert not noisy_lines(path.read_text(errors="replace"), ASSET_NOISE), path


def test_the_services_log_no_pathspec_deprecation(airflow_stack: AirflowStack, stack_training_run):
    for name in SERVICES_OWN_LOGS:
        path = airflow_stack.logs_dir / name
        assert path.exists() and not noisy_lines(path.read_text(errors="replace"), (DEPRECATION,)), path


@pytest.mark.xfail(strict=True, reason="the Task SDK's plugins manager reads .airflowignore as a glob whatever "
                                       "[core] dag_ignore_file_syntax says (apache-airflow-task-sdk 1.3.2)")
def test_a_task_log_carries_no_pathspec_deprecation(airflow_stack: AirflowStack, stack_training_run):
    dag_id, run_id = stack_training_run["dag_id"], stack_training_run["dag_run_id"]
    assert not noisy_lines(airflow_stack.task_log(dag_id, run_id, "plan_run"), (DEPRECATION,))
