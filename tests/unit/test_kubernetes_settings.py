"""Each Kubernetes setting is declared once (``pgtrain.config.kubernetes.KubernetesSettings``); the settings file's
schema, ``MPIJobSettings``, the operators' arguments and the ``render`` flags all reach every field from there, and a
bad value of any of them is refused naming the setting, before any pod."""

from __future__ import annotations

import dataclasses
import inspect
import io
from contextlib import redirect_stdout
from datetime import datetime

import pytest
import yaml
from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

from pgtrain.airflow.kubernetes.operator import MPIJobOperator
from pgtrain.airflow.kubernetes.train import MPIJobTrainOperator
from pgtrain.config import kubernetes
from pgtrain.config.settings import AUTHOR_PROPERTIES, load_settings
from pgtrain.core.errors import ConfigError
from pgtrain.launch.mpijob import api, cli, spec

FIELDS = [f.name for f in dataclasses.fields(kubernetes.KubernetesSettings)]
AUTHOR = [name for name in FIELDS if kubernetes.SETTINGS[name].author]
SCALAR_FLAGS = {"string", "integer", "number", "boolean"}
# A value of the right JSON type for each kind of schema that is not the setting's default, and one of the wrong type.
OTHER = {"string": "7Gi", "integer": 7, "number": 7, "boolean": True, "object": {}, "array": []}
WRONG = {"string": 7, "integer": "many", "number": "many", "boolean": "yes", "object": "x", "array": "x"}


def kind(name: str) -> str:
    types = kubernetes.SETTINGS[name].schema["type"]
    return next(t for t in ([types] if isinstance(types, str) else types) if t != "null")


def other(name: str) -> object:
    """A value of ``name`` that its schema takes (one of its choices, where it has some)."""
    if name == "env":
        return {"NCCL_DEBUG": "WARN"}
    choices = kubernetes.SETTINGS[name].schema.get("enum")
    return next(c for c in choices if c != kubernetes.default(name)) if choices else OTHER[kind(name)]


def render(*args: str) -> dict:
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main(["render", "--world-size", "2", "--run-id", "d/r", *args]) == 0
    return yaml.safe_load(out.getvalue())


def test_every_author_setting_is_a_key_of_the_settings_files_kubernetes_block_and_no_other_is():
    assert list(AUTHOR_PROPERTIES["kubernetes"]["properties"]) == AUTHOR == list(kubernetes.KUBERNETES_SETTINGS)
    assert {"backoff_limit", "ttl_seconds_after_finished"} <= set(FIELDS) - set(AUTHOR)


@pytest.mark.parametrize("name", FIELDS)
def test_each_setting_is_a_field_of_mpijob_settings_with_its_declared_default(name):
    built = spec.MPIJobSettings(run_id="r", world_size=1, attempt=1)
    assert getattr(built, name) == kubernetes.default(name)
    schema = dict(kubernetes.SETTINGS[name].schema)
    assert kubernetes.value_problems({name: kubernetes.default(name)}) == [] or kubernetes.default(name) is None, \
        f"{name}'s default does not pass its own schema {schema}"


@pytest.mark.parametrize("name", FIELDS)
def test_each_setting_is_an_argument_of_the_operator_and_reaches_where_its_role_says(name):
    value = other(name)
    operator = MPIJobOperator(task_id="train", **{name: value})
    role = kubernetes.SETTINGS[name].role
    if role == "job":
        assert operator.job_settings[name] == value
        assert set(operator.job_settings) == set(kubernetes.named("job"))
    elif name == "env":
        assert operator.env_vars[0].name == "NCCL_DEBUG"
    else:  # KubernetesPodOperator's own argument of that name
        assert name in inspect.signature(KubernetesPodOperator.__init__).parameters
        assert getattr(operator, name) in (value, [value]) or name == "tolerations"


def test_the_operators_watch_takes_pgtrains_defaults_and_the_dags_default_args_for_any_setting():
    operator = MPIJobOperator(task_id="train")
    assert (operator.startup_timeout_seconds, operator.poll_interval) == (600, 10)
    from airflow.sdk import DAG

    with DAG("k8s_settings", schedule=None, start_date=datetime(2026, 1, 1),
             default_args={"gpus_per_worker": 2, "shm_size": "1Gi", "poll_interval": 3, "namespace": "team"}):
        train = MPIJobTrainOperator(task_id="train", shm_size="2Gi")
    job = train.job_operator()
    assert (job.job_settings["gpus_per_worker"], job.job_settings["shm_size"]) == (2, "2Gi")
    assert (job.poll_interval, job.namespace) == (3, "team")


@pytest.mark.parametrize("name", [n for n in AUTHOR if kubernetes.SETTINGS[n].role != "operator"])
def test_each_scalar_author_setting_has_a_render_flag_and_a_collection_one_where_it_says_how(name):
    flags = {action.dest: action for action in cli.build_parser()._subparsers._group_actions[0].choices[
        "render"]._actions}
    declared = kubernetes.SETTINGS[name]
    if kind(name) in SCALAR_FLAGS or declared.flag is not None:
        assert name in flags, f"{name} has no render flag"
        assert (declared.flag.name if declared.flag else "--" + name.replace("_", "-")) in flags[name].option_strings
        assert declared.help in flags[name].help
    else:
        assert name not in flags


def test_the_render_flags_reach_the_manifest():
    rendered = render("--queue-name", "team-ml", "--priority-class-name", "batch", "--shm-size", "1Gi",
                      "--non-root", "--node-selector", "pool=gpu", "--toleration", "gpu:NoSchedule", "--secret", "db")
    worker = rendered["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert rendered["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-ml"
    assert worker["priorityClassName"] == "batch" and worker["nodeSelector"] == {"pool": "gpu"}
    assert worker["tolerations"] == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert {"name": api.SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}} in worker["volumes"]
    assert worker["securityContext"]["runAsNonRoot"] is True
    assert any(v.get("secret", {}).get("secretName") == "db" for v in worker["volumes"])


def test_render_takes_a_settings_file_with_operator_only_settings(tmp_path):
    """The watch's settings (poll_interval among them) are settings of the file too; rendering skips nothing."""
    path = tmp_path / "pgtrain.yaml"
    path.write_text("kubernetes: {poll_interval: 5, startup_timeout_seconds: 60, deferrable: true, shm_size: 1Gi}\n")
    worker = render("--settings", str(path))["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert {"name": api.SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}} in worker["volumes"]


@pytest.mark.parametrize("name", AUTHOR)
def test_a_bad_value_of_any_setting_is_refused_naming_it_in_the_file_and_by_the_operator(name, tmp_path):
    bad = WRONG[kind(name)]
    path = tmp_path / "pgtrain.yaml"
    path.write_text(yaml.safe_dump({"kubernetes": {name: bad}}))
    with pytest.raises(ConfigError, match=rf"pgtrain\.yaml: kubernetes\.{name}: "):
        load_settings(path)
    if kubernetes.SETTINGS[name].role == "operator":  # KubernetesPodOperator's own argument, as given
        return
    with pytest.raises(ConfigError, match=rf"Kubernetes arguments are invalid: {name}: .*settings file"):
        MPIJobTrainOperator(task_id="train", **{name: bad})
    with pytest.raises(ConfigError, match=rf"invalid MPIJob settings: {name}: "):
        MPIJobOperator(task_id="train", **{name: bad})


def test_a_template_is_checked_once_rendered_not_when_the_dag_is_parsed():
    train = MPIJobTrainOperator(task_id="train", gpus_per_worker="{{ params.gpus }}")
    assert train.job_operator().job_settings["gpus_per_worker"] == "{{ params.gpus }}"


def test_a_bad_render_flag_is_refused_naming_the_setting(capsys):
    assert cli.main(["render", "--world-size", "2", "--run-id", "r", "--launcher-memory", "lots"]) == 2
    assert "launcher_memory: 'lots' is not a Kubernetes quantity" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["render", "--world-size", "2", "--run-id", "r", "--node-selector", "pool"])
    assert "--node-selector: expects KEY=VALUE, got 'pool'" in capsys.readouterr().err
