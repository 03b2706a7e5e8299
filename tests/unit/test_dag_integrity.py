"""DAG integrity: it loads, its shape is what DESIGN.md says, its params are valid, and parsing it is cheap."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from airflow.dag_processing.dagbag import DagBag
from airflow.sdk.exceptions import ParamValidationError

from pgtrain.config.params import PARAMETERS, TrainingConfig
from tests.conftest import REPO

DAG_ID = "pgtrain_training"
TASK_ORDER = ["provision_tables", "plan_run", "compute_shards", "train", "commit_parameters", "report"]


@pytest.fixture(scope="module")
def dagbag() -> DagBag:
    return DagBag(dag_folder=str(REPO / "dags"))


@pytest.fixture(scope="module")
def dag(dagbag):
    return dagbag.dags[DAG_ID]


def test_dag_folder_has_no_import_errors(dagbag):
    assert dagbag.import_errors == {}
    assert DAG_ID in dagbag.dags


def test_tasks_run_in_the_designed_order(dag):
    assert {t.task_id for t in dag.tasks} == set(TASK_ORDER)
    position = {task_id: i for i, task_id in enumerate(TASK_ORDER)}
    for task in dag.tasks:
        for upstream in task.upstream_task_ids:
            assert position[upstream] < position[task.task_id], f"{upstream} must run before {task.task_id}"
    for earlier, later in zip(TASK_ORDER, TASK_ORDER[1:], strict=False):
        assert earlier in dag.get_task(later).get_flat_relative_ids(upstream=True), f"{earlier} -> {later}"


def test_the_generic_dag_runs_only_when_triggered(dag):
    assert dag.catchup is False
    assert dag.schedule is None  # ad-hoc runs only: scheduled models have their own DAGs
    assert dag.is_paused_upon_creation is False  # so a trigger runs, not sits queued on a paused DAG


def test_param_defaults_are_valid_training_config(dag):
    dag.params.validate()
    defaults = {name: dag.params[name] for name in dag.params}
    config = TrainingConfig.from_mapping(defaults)
    assert config == TrainingConfig(model_name="adhoc-model")  # digits-mlp belongs to the models file
    # the launcher, backend, collective timeout, precision and stall timeout are the author's (settings file): never
    # trigger params
    assert set(PARAMETERS) - {"launcher", "backend", "collective_timeout", "precision", "stall_timeout"} == set(
        defaults)
    assert config.launcher == "local" and config.world_size == 1 and config.hidden_sizes == (50,)


@pytest.mark.parametrize("name, value", [("world_size", 0), ("task", "clustering"), ("learning_rate", 0)])
def test_params_reject_bad_values(dag, name, value):
    with pytest.raises(ParamValidationError):
        dag.params.get_param(name).resolve(value)


@pytest.mark.parametrize("dag_file", ["pgtrain_training.py", "pgtrain_models.py", "pgtrain_models_check.py"])
def test_importing_the_dag_opens_no_connection_and_no_torch(dag_file):
    probe = f"""
import importlib.util, json, socket, sys, time
opened = []
real_connect = socket.socket.connect
def connect(self, address):
    opened.append(str(address))
    return real_connect(self, address)
socket.socket.connect = connect
started = time.perf_counter()
spec = importlib.util.spec_from_file_location("dag_under_test", {str(REPO / "dags" / dag_file)!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(json.dumps({{"seconds": time.perf_counter() - started, "connections": opened,
    "heavy": [m for m in ("torch", "horovod", "psycopg", "psycopg2", "numpy") if m in sys.modules]}}))
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["connections"] == []
    assert result["heavy"] == []


def test_every_task_follows_the_one_retry_policy(dag):
    from pgtrain.airflow.dag.failures import RETRY_POLICY

    assert [t.task_id for t in dag.tasks if t.retry_policy is not RETRY_POLICY] == []


def test_the_scoring_example_runs_on_the_asset_commit_parameters_emits(dagbag, dag):
    from pgtrain.airflow.dag.assets import MODELS_ALIAS, model_asset

    scoring = dagbag.dags["pgtrain_score_digits"]
    assert [a.uri for a in scoring.timetable.asset_condition.objects] == [model_asset("digits-mlp").uri]
    assert dag.get_task("commit_parameters").outlets == [MODELS_ALIAS]


def _parsed_in_a_task_process(monkeypatch, dag_file: str, dag_id: str, task_id: str) -> DagBag:
    """The DAG file as a task process parses it: Airflow sets the parsing context to the task it runs."""
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", dag_id)
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_TASK_ID", task_id)
    return DagBag(dag_folder=str(REPO / "dags" / dag_file))


@pytest.mark.parametrize("task_id", TASK_ORDER)
def test_every_task_process_gets_the_same_dag(monkeypatch, dag, task_id):
    """No placeholder: whichever task a process runs, the DAG it parses is the one the dag-processor stored."""
    parsed = _parsed_in_a_task_process(monkeypatch, "pgtrain_training.py", DAG_ID, task_id).dags[DAG_ID]
    assert {t.task_id: t.upstream_task_ids for t in parsed.tasks} == {t.task_id: t.upstream_task_ids for t in dag.tasks}
    assert {t.task_id: type(t) for t in parsed.tasks} == {t.task_id: type(t) for t in dag.tasks}


def test_the_local_launcher_trains_with_a_plain_operator(dag):
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    from pgtrain.airflow.local.operator import LocalTrainOperator

    train = dag.get_task("train")
    assert isinstance(train, LocalTrainOperator) and not isinstance(train, KubernetesPodOperator)
    assert "launcher" not in dag.params, "where the job runs is the author's setting, not a trigger param"


def test_the_kubernetes_launcher_trains_with_the_authors_cluster_settings(monkeypatch, tmp_path):
    from pgtrain.airflow.kubernetes.train import MPIJobTrainOperator

    settings = tmp_path / "pgtrain.yaml"
    settings.write_text("launcher: kubernetes\nkubernetes: {image: registry.example/trainer:7, namespace: ml, "
                        "gpus_per_worker: 4}\n")
    monkeypatch.setenv("PGTRAIN_SETTINGS", str(settings))
    parsed = DagBag(dag_folder=str(REPO / "dags" / "pgtrain_training.py"))
    train = parsed.dags[DAG_ID].get_task("train")
    assert isinstance(train, MPIJobTrainOperator)
    job = train.job_operator()
    assert (job.image, job.namespace, job.job_settings["gpus_per_worker"]) == ("registry.example/trainer:7", "ml", 4)


def test_a_search_on_kubernetes_maps_the_train_task_with_the_authors_cluster_settings(monkeypatch, tmp_path):
    """Each trial its own MPIJob task instance: the mapped train task's partial() takes the author's settings as
    job_arguments (a partial() refuses keywords no operator names: the DAG did not parse)."""
    from pgtrain.airflow.kubernetes.train import MPIJobTrainOperator

    settings = tmp_path / "pgtrain.yaml"
    settings.write_text("launcher: kubernetes\nkubernetes: {image: registry.example/trainer:7, namespace: ml, "
                        "gpus_per_worker: 4}\nsearch_limits: {max_trials: 4, concurrency: 2}\n")
    monkeypatch.setenv("PGTRAIN_SETTINGS", str(settings))
    parsed = DagBag(dag_folder=str(REPO / "dags" / "pgtrain_training.py"))
    assert not parsed.import_errors, parsed.import_errors
    train = parsed.dags[DAG_ID].get_task("train")
    assert train.operator_class is MPIJobTrainOperator and train.max_active_tis_per_dagrun == 2
    job = MPIJobTrainOperator(task_id="train", job_arguments=train.partial_kwargs["job_arguments"]).job_operator()
    assert (job.image, job.namespace, job.job_settings["gpus_per_worker"]) == ("registry.example/trainer:7", "ml", 4)


def test_an_edited_settings_file_applies_at_the_next_parse_without_a_restart(monkeypatch, tmp_path):
    """Each task process parses its DAG file, and the DAG file reads the settings file then: editing the file is
    enough (docs/configuration.md), even in a process that parsed it before (nothing caches it)."""
    settings = tmp_path / "pgtrain.yaml"
    monkeypatch.setenv("PGTRAIN_SETTINGS", str(settings))

    def parsed_settings() -> dict:
        dag = DagBag(dag_folder=str(REPO / "dags" / "pgtrain_training.py")).dags[DAG_ID]
        return dag.get_task("plan_run").op_args[0]

    settings.write_text("allowed_sources: [public]\nquality_gate: {max_accuracy_drop: 0.05}\n")
    assert parsed_settings()["allowed_sources"] == ["public"]
    settings.write_text("allowed_sources: [public, sales]\nquality_gate: {max_accuracy_drop: 0.01}\n")
    after = parsed_settings()
    assert (after["allowed_sources"], after["quality_gate"]) == (["public", "sales"], {"max_accuracy_drop": 0.01})


@pytest.mark.parametrize("launcher", ["local", "kubernetes"])
@pytest.mark.parametrize("task_id", TASK_ORDER)
def test_parsing_the_dag_imports_no_kubernetes_client(task_id, launcher, tmp_path):
    """The Kubernetes provider imports both Kubernetes clients: no task process pays for them when it parses the DAG,
    whatever the launcher (a kubernetes train task imports them when it runs)."""
    settings = tmp_path / "pgtrain.yaml"
    settings.write_text(f"launcher: {launcher}\n")
    probe = f"""
import importlib.util, json, os, sys
os.environ["_AIRFLOW_PARSING_CONTEXT_DAG_ID"] = {DAG_ID!r}
os.environ["_AIRFLOW_PARSING_CONTEXT_TASK_ID"] = {task_id!r}
spec = importlib.util.spec_from_file_location("dag_under_test", {str(REPO / "dags" / "pgtrain_training.py")!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(json.dumps([m for m in ("kubernetes", "kubernetes_asyncio", "airflow.providers.cncf.kubernetes.operators.pod")
                  if m in sys.modules]))
"""
    env = {**os.environ, "PGTRAIN_SETTINGS": str(settings)}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_a_model_dags_task_process_builds_only_its_dag(monkeypatch):
    full = DagBag(dag_folder=str(REPO / "dags" / "pgtrain_models.py"))
    assert full.import_errors == {} and full.dags
    dag_id = sorted(full.dags)[0]
    parsed = _parsed_in_a_task_process(monkeypatch, "pgtrain_models.py", dag_id, "plan_run")
    assert list(parsed.dags) == [dag_id]
    assert set(parsed.dags[dag_id].task_ids) == set(full.dags[dag_id].task_ids)


def test_a_context_inherited_from_another_dags_task_changes_nothing(monkeypatch):
    """The parsing context is environment variables, which a child process of any task inherits (for example a
    task running `airflow dags reserialize`): a context naming another DAG leaves these DAGs whole."""
    from pgtrain.airflow.local.operator import LocalTrainOperator

    full = DagBag(dag_folder=str(REPO / "dags" / "pgtrain_models.py"))
    training = _parsed_in_a_task_process(monkeypatch, "pgtrain_training.py", "someone_elses_dag", "plan_run")
    assert isinstance(training.dags[DAG_ID].get_task("train"), LocalTrainOperator)
    models = _parsed_in_a_task_process(monkeypatch, "pgtrain_models.py", "someone_elses_dag", "plan_run")
    assert set(models.dags) == set(full.dags)
    assert all(isinstance(d.get_task("train"), LocalTrainOperator) for d in models.dags.values())
