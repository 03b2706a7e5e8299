"""MPIJobOperator's manifest: built from KubernetesPodOperator's pod, valid, labelled, free of credentials."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from airflow.providers.cncf.kubernetes.pod_generator import make_safe_label_value
from airflow.providers.cncf.kubernetes.secret import Secret
from kubernetes.client import models as k8s

from pgtrain.airflow.kubernetes.operator import MPIJobOperator
from pgtrain.airflow.kubernetes.train import MPIJobTrainOperator
from pgtrain.config.settings import load_settings
from pgtrain.core.database_url import DATABASE_URL_ENV, DATABASE_URL_FILE_ENV
from pgtrain.core.errors import ConfigError
from pgtrain.launch.mpijob import api
from pgtrain.launch.mpijob.spec import database_volume
from tests.k8s_sim.airflow_context import task_context
from tests.k8s_sim.validation import assert_valid_mpijob

RUN_ID = "manual__2026-01-01T00:00:00+00:00"
TI_LABELS = {"dag_id": "pgtrain_training", "task_id": "train", "run_id": make_safe_label_value(RUN_ID),
             "try_number": "3"}


def kpo_operator(**overrides) -> MPIJobOperator:
    arguments = dict(
        task_id="train", namespace="ml", image="registry.example/pgtrain-trainer:1", world_size=8,
        gpus_per_worker=4, training_run_id="pgtrain_training/manual__1",
        env_vars={"NCCL_DEBUG": "WARN"},
        secrets=[Secret("env", "WANDB_API_KEY", "wandb", "key")],
        volumes=[k8s.V1Volume(name="shm", empty_dir=k8s.V1EmptyDirVolumeSource(medium="Memory"))],
        volume_mounts=[k8s.V1VolumeMount(name="shm", mount_path="/dev/shm")],
        node_selector={"nvidia.com/gpu.product": "H100"},
        tolerations=[k8s.V1Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")],
        affinity=k8s.V1Affinity(node_affinity=k8s.V1NodeAffinity(
            required_during_scheduling_ignored_during_execution=k8s.V1NodeSelector(node_selector_terms=[
                k8s.V1NodeSelectorTerm(match_expressions=[k8s.V1NodeSelectorRequirement(
                    key="pool", operator="In", values=["gpu"])])]))),
        image_pull_secrets=[k8s.V1LocalObjectReference(name="registry")],
        service_account_name="trainer", labels={"team": "ml"}, annotations={"owner": "ml-platform"},
    )
    return MPIJobOperator(**{**arguments, **overrides})


@pytest.fixture
def manifest() -> dict:
    context = task_context("pgtrain_training", RUN_ID, try_number=3)
    return kpo_operator().build_mpijob(context, dry_run=True)


def templates(manifest: dict) -> dict[str, dict]:
    return {role: spec["template"] for role, spec in manifest["spec"]["mpiReplicaSpecs"].items()}


def test_both_templates_carry_what_kubernetes_pod_operator_builds(manifest):
    for role, template in templates(manifest).items():
        spec = template["spec"]
        container = spec["containers"][0]
        assert container["image"] == "registry.example/pgtrain-trainer:1", role
        env = {e["name"]: e for e in container["env"]}
        assert env["NCCL_DEBUG"]["value"] == "WARN"
        assert env["WANDB_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "wandb", "key": "key"}
        assert DATABASE_URL_ENV not in env and env[DATABASE_URL_FILE_ENV]["value"] == api.DATABASE_URL_FILE
        assert container["volumeMounts"] == [{"name": "shm", "mountPath": "/dev/shm"},
                                             {"name": api.DATABASE_VOLUME, "mountPath": api.DATABASE_MOUNT_PATH,
                                              "readOnly": True}]
        assert spec["volumes"] == [{"name": "shm", "emptyDir": {"medium": "Memory"}},
                                   database_volume("pgtrain-db", "url")]
        assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}
        assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        assert spec["affinity"]["nodeAffinity"]
        assert spec["imagePullSecrets"] == [{"name": "registry"}]
        assert spec["serviceAccountName"] == "trainer"
        assert template["metadata"]["annotations"]["owner"] == "ml-platform"


def test_task_instance_labels_on_the_job_and_both_templates(manifest):
    for labels in [manifest["metadata"]["labels"], *(t["metadata"]["labels"] for t in templates(manifest).values())]:
        assert {k: labels[k] for k in TI_LABELS} == TI_LABELS
        assert labels["team"] == "ml" and labels["pgtrain_mpijob_operator"] == "True"
    assert manifest["metadata"]["namespace"] == "ml"


def test_operator_manifest_is_valid(manifest):
    assert_valid_mpijob(manifest)
    assert manifest["spec"]["runPolicy"]["activeDeadlineSeconds"] == 86400
    worker = templates(manifest)["Worker"]["spec"]["containers"][0]
    assert worker["resources"]["limits"][api.GPU_RESOURCE] == 4
    assert manifest["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    launcher = templates(manifest)["Launcher"]["spec"]["containers"][0]
    assert launcher["command"][:3] == ["horovodrun", "-np", "8"]
    # A plain MPIJobOperator begins no attempt in a database: its trainer is told attempt 1.
    assert launcher["command"][-2:] == ["--attempt", "1"]


def test_user_gpu_resources_are_replaced_by_the_layout():
    resources = k8s.V1ResourceRequirements(limits={"nvidia.com/gpu": "8", "memory": "64Gi"},
                                           requests={"cpu": "16"})
    manifest = kpo_operator(container_resources=resources, world_size=4, gpus_per_worker=2).build_mpijob(
        task_context("d", "r"), dry_run=True)
    worker = templates(manifest)["Worker"]["spec"]["containers"][0]["resources"]
    launcher = templates(manifest)["Launcher"]["spec"]["containers"][0]["resources"]
    assert worker["limits"] == {"nvidia.com/gpu": 2, "memory": "64Gi"} and worker["requests"]["cpu"] == "16"
    assert "nvidia.com/gpu" not in launcher["limits"]


def test_a_retry_gets_a_new_name_and_the_same_labels_to_find_it_by():
    first = kpo_operator().build_mpijob(task_context("d", "r", try_number=1), dry_run=True)
    second = kpo_operator().build_mpijob(task_context("d", "r", try_number=2), dry_run=True)
    assert first["metadata"]["name"] != second["metadata"]["name"]
    selector = kpo_operator()._build_find_pod_label_selector(task_context("d", "r"), exclude_checked=True)
    assert "try_number" not in selector and "already_checked!=True" in selector


def test_dry_run_prints_the_mpijob(capsys):
    kpo_operator().dry_run()
    out = capsys.readouterr().out
    printed = yaml.safe_load(out[out.index("apiVersion:"):])  # after the operator's own log lines
    assert printed["kind"] == "MPIJob" and printed["spec"]["slotsPerWorker"] == 4


def test_xcom_sidecar_is_refused():
    with pytest.raises(Exception, match="no XCom sidecar"):
        kpo_operator(do_xcom_push=True)


def test_train_operator_takes_kubernetes_settings_from_the_authors_settings_file(tmp_path):
    path = tmp_path / "pgtrain.yaml"
    path.write_text("kubernetes:\n  namespace: gpu-team\n  image: from-settings:1\n  gpus_per_worker: 8\n"
                    "  node_selector: {pool: a100}\n  tolerations: [{key: gpu, operator: Exists}]\n")
    operator = MPIJobTrainOperator(task_id="train", **load_settings(path).operator_arguments()).job_operator()
    assert (operator.namespace, operator.image, operator.job_settings["gpus_per_worker"]) == (
        "gpu-team", "from-settings:1", 8)
    assert operator.node_selector == {"pool": "a100"}
    assert operator.tolerations[0].key == "gpu"


def test_settings_file_errors_name_the_file_and_the_field(tmp_path):
    path = tmp_path / "pgtrain.yaml"
    path.write_text("kubernetes:\n  imgae: typo:1\n")
    with pytest.raises(ConfigError, match=r"pgtrain\.yaml: kubernetes: Additional properties .*'imgae'"):
        load_settings(path)


def test_importing_the_operators_stays_light_for_dag_parsing():
    probe = ("import sys, pgtrain.airflow.local.operator, pgtrain.airflow.kubernetes.operator, "
             "pgtrain.launch.mpijob.spec; "
             "print([m for m in ('torch', 'horovod', 'psycopg', 'numpy') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_train_task_takes_the_dags_default_args_and_renders_with_its_macros():
    """What a KubernetesPodOperator took from the DAG, the job the train task builds takes too: default_args for
    the job (deferrable, the Kubernetes connection), the DAG's retry policy, its template macros."""
    from datetime import datetime

    from airflow.sdk import DAG, ExceptionRetryPolicy

    policy = ExceptionRetryPolicy(rules=[])
    with DAG("k8s_defaults", schedule=None, start_date=datetime(2026, 1, 1), user_defined_macros={"tag": "7"},
             default_args={"deferrable": True, "kubernetes_conn_id": "k8s_prod", "retries": 3,
                           "retry_policy": policy}):
        train = MPIJobTrainOperator(task_id="train", image="registry.example/trainer:{{ tag }}")
    assert train.retries == 3 and train.retry_policy is policy
    job = train.job_operator()
    assert job.deferrable is True and job.kubernetes_conn_id == "k8s_prod"
    job = train.job_operator(task_context("k8s_defaults", "manual__1"))
    assert job.image == "registry.example/trainer:7"


def test_bad_job_arguments_fail_the_train_task_for_good_with_what_to_fix(monkeypatch):
    from airflow.sdk.exceptions import AirflowFailException

    from pgtrain.airflow.dag import train_run

    monkeypatch.setattr(train_run, "planned_run", lambda *args: type("Run", (), {"config": type(
        "Config", (), {"world_size": 2})()})())
    train = MPIJobTrainOperator(task_id="train", training_run_id="pgtrain_test/bad", namspace="typo")
    with pytest.raises(AirflowFailException, match=r"(?s)Kubernetes arguments are invalid: .*namspace.*settings file"):
        train.execute(task_context("pgtrain_test", "bad"))


def test_a_setting_given_both_in_job_arguments_and_as_a_keyword_is_refused_naming_it():
    with pytest.raises(ConfigError, match=r"namespace given both in job_arguments and as a keyword"):
        MPIJobTrainOperator(task_id="train", job_arguments={"namespace": "ml"}, namespace="other")
