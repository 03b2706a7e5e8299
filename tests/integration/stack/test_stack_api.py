"""The real Airflow stack through its REST API: a triggered run commits a version holding the conf's values, and a
conf the trigger form's schema refuses is refused by the API with a 4xx naming the param."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from dev import devstack
from tests.integration.stack.airflow_stack import AirflowStack

pytestmark = [pytest.mark.stack, pytest.mark.timeout(1800)]


def test_a_triggered_run_commits_a_version_with_the_conf_it_was_given(airflow_stack: AirflowStack,
                                                                      stack_training_run):
    conf, dag_run_id = stack_training_run["conf"], stack_training_run["dag_run_id"]
    with psycopg.connect(airflow_stack.training_url, autocommit=True) as conn:
        status, config, run_id = conn.execute(
            "SELECT status, config, run_id FROM pgtrain.training_runs WHERE dag_id = %s AND dag_run_id = %s",
            ("pgtrain_training", dag_run_id)).fetchone()
        version = conn.execute("SELECT version, metrics FROM pgtrain.model_versions WHERE run_id = %s",
                               (run_id,)).fetchone()
        head = conn.execute("SELECT version FROM pgtrain.model_heads WHERE model_name = %s",
                            (conf["model_name"],)).fetchone()
    assert status == "committed"
    knobs = {key: value for key, value in conf.items() if key != "source_table"}
    assert {key: config[key] for key in knobs} == knobs
    assert config["source_table"] == '"public"."stack_rows"'  # recorded resolved and quoted
    assert version is not None, f"run {run_id} committed no version"
    assert version[1]["epochs"] == conf["epochs"]
    assert head == (version[0],)


@pytest.mark.parametrize(("conf", "param"), [
    ({"epochs": 0}, "epochs"),
    ({"world_size": "two"}, "world_size"),
    ({"hidden_sizes": []}, "hidden_sizes"),
])
def test_a_conf_the_form_refuses_is_refused_by_the_api(airflow_stack: AirflowStack, conf, param):
    airflow_stack.wait_for_dag("pgtrain_training")
    before = {run["dag_run_id"] for run in airflow_stack.runs("pgtrain_training")}
    response = airflow_stack.api("POST", "/api/v2/dags/pgtrain_training/dagRuns",
                                 json={"logical_date": None, "conf": conf})
    assert 400 <= response.status_code < 500, response.text
    assert f"param {param}" in response.json()["detail"], response.text
    assert {run["dag_run_id"] for run in airflow_stack.runs("pgtrain_training")} == before


def test_no_database_url_or_key_is_on_a_command_line(airflow_stack: AirflowStack):
    processes = devstack.stack_processes(airflow_stack.state_dir)
    assert set(processes) == set(devstack.SERVICES) and all(processes.values()), processes
    for service, pids in processes.items():
        for pid in pids:
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
            except OSError:  # ended meanwhile
                continue
            shown = [secret for secret in [*airflow_stack.secrets, "postgresql"] if secret in argv]
            assert not shown, f"{service} process {pid} has a secret on its command line: {argv}"
