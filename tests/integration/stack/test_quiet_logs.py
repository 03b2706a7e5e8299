"""What a new user saw in every log of the stack (issue 20 item 12): for each commit of an ad-hoc model, Airflow's
"AssetModel ... not found" and "Emitting event for inactive AssetModel" (gone: commit_parameters emits an event
only for a model whose asset a DAG declares), and pathspec's GitWildMatchPattern deprecation wherever plugins were
loaded (gone: Airflow's plugins folder is no longer the library's sources, so there is no .airflowignore to read,
which Task SDK 1.3.2 read as a glob with that deprecated class whatever [core] dag_ignore_file_syntax said)."""

from __future__ import annotations

import pytest

from tests.integration.stack.airflow_stack import AirflowStack

pytestmark = [pytest.mark.stack, pytest.mark.timeout(1800)]

ASSET_NOISE = ("cannot create asset event", "inactive AssetModel")
DEPRECATION = "GitWildMatchPattern"
TASKS = ("provision_tables", "plan_run", "compute_shards", "train", "commit_parameters", "report")
SERVICES = ("api-server.log", "scheduler.log", "dag-processor.log", "triggerer.log")


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


def test_no_service_or_task_logs_the_pathspec_deprecation(airflow_stack: AirflowStack, stack_training_run):
    dag_id, run_id = stack_training_run["dag_id"], stack_training_run["dag_run_id"]
    for task in TASKS:
        text = airflow_stack.task_log(dag_id, run_id, task)
        assert text.strip() and not noisy_lines(text, (DEPRECATION,)), task
    assert all((airflow_stack.logs_dir / name).exists() for name in SERVICES)
    for path in sorted(airflow_stack.logs_dir.rglob("*.log")):  # every service's and every task's
        assert not noisy_lines(path.read_text(errors="replace"), (DEPRECATION,)), path
