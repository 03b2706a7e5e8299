"""The production pod settings of the author's ``kubernetes:`` block in the rendered MPIJob: /dev/shm, the launcher's
memory, Kueue, gang scheduling, placement, QoS, NCCL environment, non-root mode and pod templates; the same manifest
from the operator (KubernetesPodOperator's pod) and from ``render --settings``; bad values refused by key."""

from __future__ import annotations

import io
import re
from contextlib import redirect_stdout

import pytest
import yaml

from pgtrain.airflow.kubernetes.operator import MPIJobOperator
from pgtrain.airflow.kubernetes.train import MPIJobTrainOperator
from pgtrain.config.model_entries import load_entries
from pgtrain.config.settings import load_settings
from pgtrain.core.errors import ConfigError
from pgtrain.launch.mpijob import api, cli, spec, validation
from tests.conftest import REPO
from tests.k8s_sim.validation import assert_valid_mpijob

RUN_ID = "pgtrain_training/manual__2026-01-01T00:00:00+00:00"


def settings(world_size: int = 8, gpus: int = 4, **overrides) -> spec.MPIJobSettings:
    return spec.MPIJobSettings(run_id=RUN_ID, world_size=world_size, gpus_per_worker=gpus,
                               image="registry.example/pgtrain-trainer:1", attempt=1, **overrides)


def template(manifest: dict, role: str) -> dict:
    return manifest["spec"]["mpiReplicaSpecs"][role]["template"]


def trainer(manifest: dict, role: str) -> dict:
    return template(manifest, role)["spec"]["containers"][0]


def docs_example() -> str:
    """The Kueue/private-registry settings of docs/kubernetes.md, as an author would copy them."""
    text = (REPO / "docs" / "kubernetes.md").read_text()
    marker = text.index("<!-- the tests render this block")
    return re.search(r"```yaml\n(.*?)```", text[marker:], re.DOTALL).group(1)


def render(*args: str) -> dict:
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main(["render", *args]) == 0
    return yaml.safe_load(out.getvalue())


# --- /dev/shm, resources, restart policies ---

def test_workers_get_a_memory_backed_dev_shm_and_the_launcher_does_not():
    manifest = spec.build_mpijob(settings())
    worker = template(manifest, "Worker")["spec"]
    assert {"name": api.SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}} in worker["volumes"]
    assert {"name": api.SHM_VOLUME, "mountPath": "/dev/shm"} in trainer(manifest, "Worker")["volumeMounts"]
    launcher = template(manifest, "Launcher")["spec"]
    assert all("emptyDir" not in v for v in launcher["volumes"])
    assert_valid_mpijob(manifest)
    sized = spec.build_mpijob(settings(shm_size="64Gi"))
    assert {"name": api.SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}} in \
        template(sized, "Worker")["spec"]["volumes"]
    runtime = spec.build_mpijob(settings(shm_size=None))
    assert all(m["mountPath"] != "/dev/shm" for m in trainer(runtime, "Worker")["volumeMounts"])


def test_restart_policies_are_on_the_replica_specs_only():
    """The MPI Operator sets the pods' restartPolicy from the replica spec and warns about one in a template."""
    operator_manifest = MPIJobOperator(task_id="t", world_size=2, namespace="ml", image="i:1").build_mpijob(
        dry_run=True)  # KubernetesPodOperator's pod says restartPolicy: Never
    for manifest in (spec.build_mpijob(settings()), operator_manifest):
        for role, policy in (("Launcher", "Never"), ("Worker", "OnFailure")):
            assert manifest["spec"]["mpiReplicaSpecs"][role]["restartPolicy"] == policy
            assert "restartPolicy" not in template(manifest, role)["spec"]
        assert_valid_mpijob(manifest)


def test_the_launcher_has_room_for_horovodrun_and_its_build_probe():
    resources = trainer(spec.build_mpijob(settings()), "Launcher")["resources"]
    assert resources == {"requests": {"cpu": "500m", "memory": "2Gi"}, "limits": {"memory": "2Gi"}}
    resources = trainer(spec.build_mpijob(settings(launcher_cpu="1", launcher_memory="3Gi")), "Launcher")["resources"]
    assert resources == {"requests": {"cpu": "1", "memory": "3Gi"}, "limits": {"memory": "3Gi"}}


def test_worker_memory_limit_and_guaranteed_qos():
    assert "memory" not in trainer(spec.build_mpijob(settings()), "Worker")["resources"]["limits"]
    limited = trainer(spec.build_mpijob(settings(worker_memory_limit="24Gi")), "Worker")["resources"]
    assert limited["limits"] == {"memory": "24Gi", api.GPU_RESOURCE: 4}
    guaranteed = trainer(spec.build_mpijob(settings(worker_cpu="32", worker_memory="256Gi", worker_guaranteed=True)),
                         "Worker")["resources"]
    assert guaranteed == {"requests": {"cpu": "32", "memory": "256Gi"},
                          "limits": {"cpu": "32", "memory": "256Gi", api.GPU_RESOURCE: 4}}
    with pytest.raises(ConfigError, match="worker_memory_limit='24Gi' contradicts it"):
        settings(worker_guaranteed=True, worker_memory_limit="24Gi")


def test_worker_requests_are_sized_per_gpu_unless_the_author_sets_them():
    def requests(**overrides) -> dict:
        return trainer(spec.build_mpijob(settings(**overrides)), "Worker")["resources"]["requests"]

    assert requests() == {"cpu": "16", "memory": "64Gi"}  # 4 GPUs: 4 CPUs and 16Gi each
    assert requests(world_size=16, gpus=8) == {"cpu": "32", "memory": "128Gi"}
    assert requests(world_size=2, gpus=1, cpu_per_gpu="1500m", memory_per_gpu="12.5Gi") == {
        "cpu": "1500m", "memory": "12.5Gi"}
    assert requests(world_size=6, gpus=3, cpu_per_gpu="1.5") == {"cpu": "4.5", "memory": "48Gi"}
    assert requests(worker_cpu="20", memory_per_gpu="40Gi") == {"cpu": "20", "memory": "160Gi"}
    guaranteed = trainer(spec.build_mpijob(settings(16, 8, worker_guaranteed=True)), "Worker")["resources"]
    assert guaranteed["limits"] == {"cpu": "32", "memory": "128Gi", api.GPU_RESOURCE: 8}  # Guaranteed QoS
    assert_valid_mpijob(spec.build_mpijob(settings(16, 8, worker_guaranteed=True)))


def test_whole_node_workers_get_one_node_each_unless_the_author_says_otherwise():
    def anti_affinity(**overrides) -> list:
        affinity = template(spec.build_mpijob(settings(**overrides)), "Worker")["spec"].get("affinity") or {}
        return (affinity.get("podAntiAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution", [])

    (term,) = anti_affinity(world_size=16, gpus=8)
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert anti_affinity(world_size=16, gpus=8, one_worker_per_node=False) == []
    assert anti_affinity(world_size=8, gpus=4) == []  # half-node workers may share a node
    assert len(anti_affinity(world_size=8, gpus=4, one_worker_per_node=True)) == 1


# --- scheduling ---

def test_kueue_queue_label_priority_and_pull_secrets():
    manifest = spec.build_mpijob(settings(queue_name="team-ml", priority_class_name="ml-batch",
                                          image_pull_secrets=["registry-a", "registry-b"]))
    assert manifest["metadata"]["labels"][api.QUEUE_NAME_LABEL] == "team-ml"
    assert "suspend" not in manifest["spec"]["runPolicy"]  # Kueue's webhook suspends the job it queues
    for role in ("Launcher", "Worker"):
        pod = template(manifest, role)
        assert pod["spec"]["imagePullSecrets"] == [{"name": "registry-a"}, {"name": "registry-b"}]
        assert pod["spec"]["priorityClassName"] == "ml-batch"
        assert api.QUEUE_NAME_LABEL not in pod["metadata"]["labels"]
    assert_valid_mpijob(manifest)


def test_gang_scheduling_waits_for_the_workers_not_the_launcher():
    manifest = spec.build_mpijob(settings(16, 4, scheduling_policy={"queue": "gpu", "scheduleTimeoutSeconds": 600}))
    assert manifest["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 4, "queue": "gpu",
                                                                  "scheduleTimeoutSeconds": 600}
    own = spec.build_mpijob(settings(16, 4, scheduling_policy={"minAvailable": 5}))
    assert own["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 5}
    assert_valid_mpijob(manifest)


def test_placement_per_role():
    gpu_nodes = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}]}}}
    spread = {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 10, "podAffinityTerm": {
        "labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "topology.kubernetes.io/zone"}}]}}
    manifest = spec.build_mpijob(settings(node_selector={"gpu": "h100"}, worker_affinity=gpu_nodes,
                                          launcher_affinity=spread, one_worker_per_node=True,
                                          launcher_node_selector={"node-pool": "cpu"}))
    worker, launcher = template(manifest, "Worker")["spec"], template(manifest, "Launcher")["spec"]
    assert worker["nodeSelector"] == {"gpu": "h100"} and launcher["nodeSelector"] == {"node-pool": "cpu"}
    assert worker["affinity"]["nodeAffinity"] == gpu_nodes["nodeAffinity"]
    assert worker["affinity"]["podAntiAffinity"] == {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": {api.JOB_NAME_LABEL: manifest["metadata"]["name"],
                                          api.JOB_ROLE_LABEL: "worker"}},
        "topologyKey": "kubernetes.io/hostname"}]}
    assert launcher["affinity"] == spread
    assert_valid_mpijob(manifest)


# --- environment ---

def test_nccl_environment_follows_pgtrains_own_in_both_templates():
    manifest = spec.build_mpijob(settings(env={"NCCL_DEBUG": "INFO", "NCCL_IB_HCA": "mlx5"}))
    for role in ("Launcher", "Worker"):
        env = trainer(manifest, role)["env"]
        assert [e["name"] for e in env] == ["PGTRAIN_DATABASE_URL_FILE", "PYTHONUNBUFFERED",
                                            "PGTRAIN_GPUS_PER_WORKER", "NCCL_DEBUG", "NCCL_IB_HCA"]
    assert_valid_mpijob(manifest)


@pytest.mark.parametrize(("name", "words"), [
    ("PGTRAIN_DATABASE_URL", "the database URL reaches the pods only from the Secret kubernetes.database_secret"),
    ("PGTRAIN_DATABASE_URL_FILE", "is pgtrain's own"),
    ("WANDB_API_KEY", "looks like it carries a secret"),
    ("DB_PASSWORD", "looks like it carries a secret"),
    ("1BAD", "is not an environment variable name"),
])
def test_env_that_is_pgtrains_or_a_secret_is_refused(name, words):
    """By name; a value that is a URL with a password is refused whatever its name (test below)."""
    with pytest.raises(ConfigError, match=re.escape(f"env: {name if name != '1BAD' else repr(name)}")) as error:
        settings(env={name: "x"})
    assert words in str(error.value)
    with pytest.raises(ConfigError, match=re.escape(words)):  # the operator's path: KubernetesPodOperator's env_vars
        MPIJobOperator(task_id="t", world_size=1, env={name: "x"})


def test_an_env_value_with_a_url_password_is_refused_whatever_its_name():
    with pytest.raises(ConfigError, match="env: MY_DSN holds a URL with a user and password"):
        settings(env={"MY_DSN": "postgresql://trainer:s3cret@db:5432/x"})
    assert settings(env={"MY_ENDPOINT": "https://metrics.example:443/push"}).env  # no credentials: fine


# --- non-root ---

def test_non_root_mode_follows_the_operators_pi_example_under_restricted_pod_security():
    manifest = spec.build_mpijob(settings(non_root=True))
    assert manifest["spec"]["sshAuthMountPath"] == "/home/mpiuser/.ssh" == f"{api.NON_ROOT_HOME}/.ssh"
    launcher_command = trainer(manifest, "Launcher")["command"]
    assert launcher_command[:7] == ["horovodrun", "-np", "8", "--hostfile", api.HOSTFILE, "--ssh-port", "2222"]
    worker_command = trainer(manifest, "Worker")["command"]
    assert worker_command[:4] == ["/usr/sbin/sshd", "-De", "-p", "2222"]
    assert "HostKey=/home/mpiuser/.ssh/id_rsa" in worker_command
    for role in ("Launcher", "Worker"):
        pod = template(manifest, role)["spec"]
        # the restricted Pod Security Standard's requirements
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == api.NON_ROOT_UID == 1000
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert all(set(v) <= {"name", "secret", "emptyDir", "configMap", "projected"} for v in pod["volumes"])
        assert not pod.get("hostNetwork") and not pod.get("hostPID")
        # the Secret's file belongs to root: readable by the pod's fsGroup
        (database,) = [v for v in pod["volumes"] if v["name"] == api.DATABASE_VOLUME]
        assert database["secret"]["defaultMode"] == 0o440 and pod["securityContext"]["fsGroup"] == 1000
    assert_valid_mpijob(manifest)
    # a pod template may add to the security contexts, not undo them; its sidecars get the container context too
    widened = spec.build_mpijob(settings(non_root=True, worker_pod_template={"spec": {
        "securityContext": {"runAsUser": 0, "supplementalGroups": [44]},
        "containers": [{"name": "exporter", "image": "exporter:1", "securityContext": {"privileged": False}}]}}))
    pod = template(widened, "Worker")["spec"]
    assert pod["securityContext"]["runAsUser"] == 1000 and pod["securityContext"]["supplementalGroups"] == [44]
    assert pod["containers"][1]["securityContext"] == {"privileged": False, "allowPrivilegeEscalation": False,
                                                       "capabilities": {"drop": ["ALL"]}}
    assert_valid_mpijob(widened)
    root = spec.build_mpijob(settings())
    assert root["spec"]["sshAuthMountPath"] == "/root/.ssh" and "--ssh-port" in trainer(root, "Launcher")["command"]


def test_a_capability_non_root_mode_would_drop_is_refused_with_the_reason():
    rdma = {"spec": {"containers": [{"name": "trainer", "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}],
                     "initContainers": [{"name": "tune", "image": "busybox", "securityContext": {"privileged": True}}]}}
    with pytest.raises(ConfigError) as refused:
        settings(non_root=True, worker_pod_template=rdma)
    message = str(refused.value)
    assert ("worker_pod_template.spec.containers[0].securityContext.capabilities.add: IPC_LOCK would be dropped: "
            "non_root mode runs every container with capabilities drop ALL") in message
    assert "worker_pod_template.spec.initContainers[0].securityContext.privileged: true would be overridden" in message
    assert spec.author_problems({"non_root": True, "pod_template": rdma}) != []  # the operator's check, at parse time
    # as root, the capability reaches the container
    manifest = spec.build_mpijob(settings(worker_pod_template=rdma))
    assert trainer(manifest, "Worker")["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
    assert_valid_mpijob(manifest)


# --- pod templates ---

def test_pod_templates_merge_by_name_and_pgtrain_keeps_what_it_owns():
    sidecar = {"name": "dcgm-exporter", "image": "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04"}
    manifest = spec.build_mpijob(settings(
        pod_template={"metadata": {"labels": {"team": "vision"}},
                      "spec": {"containers": [{"name": "trainer", "resources": {
                          "requests": {"ephemeral-storage": "50Gi"}}}]}},
        worker_pod_template={"metadata": {"annotations": {"safe-to-evict": "false"}},
                             "spec": {"containers": [sidecar], "terminationGracePeriodSeconds": 120}}))
    for role in ("Launcher", "Worker"):
        pod = template(manifest, role)
        assert pod["metadata"]["labels"]["team"] == "vision"
        assert pod["metadata"]["annotations"][api.RUN_ID_ANNOTATION] == RUN_ID
        assert trainer(manifest, role)["resources"]["requests"]["ephemeral-storage"] == "50Gi"
        assert trainer(manifest, role)["command"][0] in ("horovodrun", "/usr/sbin/sshd")
    worker = template(manifest, "Worker")
    assert worker["spec"]["containers"][1] == sidecar and worker["metadata"]["annotations"]["safe-to-evict"] == "false"
    assert worker["spec"]["terminationGracePeriodSeconds"] == 120
    assert trainer(manifest, "Worker")["resources"]["limits"] == {api.GPU_RESOURCE: 4}
    assert len(template(manifest, "Launcher")["spec"]["containers"]) == 1
    assert_valid_mpijob(manifest)
    # a template's own /dev/shm is kept instead of pgtrain's (one mount per path)
    own_shm = spec.build_mpijob(settings(worker_pod_template={"spec": {
        "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}],
        "containers": [{"name": "trainer", "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]}]}}))
    assert [m["name"] for m in trainer(own_shm, "Worker")["volumeMounts"]] == ["shm", api.DATABASE_VOLUME]
    assert_valid_mpijob(own_shm)


@pytest.mark.parametrize(("key", "value", "words"), [
    ("pod_template", {"spec": {"containers": [{"name": "trainer", "command": ["bash"]}]}},
     "pod_template.spec.containers[0].command: the launcher's horovodrun and the workers' sshd are pgtrain's"),
    ("worker_pod_template", {"spec": {"restartPolicy": "Always"}},
     "worker_pod_template.spec.restartPolicy: the MPIJob's replica specs set it"),
    ("pod_template", {"spec": {"containers": [{"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": 8}}}]}},
     "nvidia.com/gpu comes from the layout"),
    ("launcher_pod_template", {"spec": {"volumes": [{"name": "pgtrain-database", "emptyDir": {}}]}},
     "launcher_pod_template.spec.volumes[0]: pgtrain-database is pgtrain's"),
    ("pod_template", {"spec": {"containers": [{"name": "trainer", "env": [
        {"name": "PGTRAIN_DATABASE_URL", "value": "postgresql://db/x"}]}]}},
     "pod_template.spec.containers[0].env: PGTRAIN_DATABASE_URL is pgtrain's own"),
    ("pod_template", {"spec": {"containers": [{"image": "x"}]}}, "containers are merged by name"),
    ("pod_template", {"metadata": {"name": "x"}}, "pod_template.metadata.name: only labels and annotations"),
])
def test_a_pod_template_that_overrides_pgtrain_is_refused_by_key(key, value, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        settings(**{key: value})


# --- the CRD schema ---

def test_the_crd_schema_refuses_unknown_fields_and_wrong_types():
    manifest = spec.build_mpijob(settings(scheduling_policy={"queue": "gpu"}))
    manifest["spec"]["runPolicy"]["schedulingPolicy"]["minAvalable"] = 2
    manifest["spec"]["slotsPerWorker"] = "4"
    problems = "\n".join(validation.crd_problems(manifest))
    assert "spec.runPolicy.schedulingPolicy: Additional properties are not allowed ('minAvalable'" in problems
    assert "spec.slotsPerWorker: '4' is not of type 'integer'" in problems
    with pytest.raises(ConfigError, match="MPIJob CRD schema"):
        validation.validate_mpijob(manifest)


# --- from the author's file: the docs' example, the operator and render --settings ---

def _without_kpo_defaults(value):
    """A template as the render command writes it: without the empty fields and defaults KubernetesPodOperator adds."""
    if isinstance(value, dict):
        return {k: _without_kpo_defaults(v) for k, v in value.items()
                if v not in ({}, [], None) and k != "terminationMessagePolicy" and (k, v) != ("hostNetwork", False)}
    if isinstance(value, list):
        return [_without_kpo_defaults(v) for v in value]
    return value


def test_the_docs_kueue_example_renders_the_same_from_the_operator_and_the_render_command(tmp_path):
    path = tmp_path / "pgtrain.yaml"
    path.write_text(docs_example())
    author = load_settings(path)
    job = MPIJobTrainOperator(task_id="train", **author.operator_arguments()).job_operator()
    job.world_size, job.training_run_id = 8, RUN_ID
    from_operator = job.build_mpijob(dry_run=True)
    rendered = render("--settings", str(path), "--world-size", "8", "--run-id", RUN_ID)
    assert_valid_mpijob(from_operator)
    assert_valid_mpijob(rendered)
    operator_name, name = from_operator["metadata"]["name"], rendered["metadata"]["name"]
    for role in ("Launcher", "Worker"):
        ours = yaml.safe_load(yaml.safe_dump(template(from_operator, role)["spec"]).replace(operator_name, name))
        assert _without_kpo_defaults(ours) == template(rendered, role)["spec"], role
    for manifest in (from_operator, rendered):
        assert manifest["metadata"]["labels"][api.QUEUE_NAME_LABEL] == "team-ml"
        assert manifest["metadata"]["namespace"] == "ml-training"
        assert manifest["spec"]["sshAuthMountPath"] == "/home/mpiuser/.ssh"
        assert manifest["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
        worker, launcher = template(manifest, "Worker")["spec"], template(manifest, "Launcher")["spec"]
        assert worker["imagePullSecrets"] == [{"name": "registry-example-com"}] == launcher["imagePullSecrets"]
        assert worker["priorityClassName"] == "ml-batch" == launcher["priorityClassName"]
        assert launcher["nodeSelector"] == {"node-pool": "cpu"}
        assert worker["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        assert worker["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"} in worker["containers"][0]["env"]
        assert worker["containers"][0]["resources"]["limits"] == {"cpu": "32", "memory": "256Gi",
                                                                  api.GPU_RESOURCE: 4}
        assert {"name": api.SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}} in worker["volumes"]
        assert template(manifest, "Worker")["metadata"]["annotations"][
            "cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
    assert job.startup_timeout_seconds == 3600 and job.deferrable is True


def test_render_flags_go_over_the_settings_file(tmp_path):
    path = tmp_path / "pgtrain.yaml"
    path.write_text(docs_example())
    rendered = render("--settings", str(path), "--world-size", "4", "--run-id", "d/r", "--gpus-per-worker", "2",
                      "--namespace", "other")
    assert rendered["metadata"]["namespace"] == "other" and rendered["spec"]["slotsPerWorker"] == 2
    assert rendered["metadata"]["labels"][api.QUEUE_NAME_LABEL] == "team-ml"


def test_bad_values_in_the_settings_file_name_the_key(tmp_path):
    path = tmp_path / "pgtrain.yaml"
    path.write_text("kubernetes:\n  shm_size: 8GB\n  queue_name: 'no spaces'\n  env: {NCCL_IB_DISABLE: 1}\n"
                    "  worker_affinity: {nodeAfinity: {}}\n")
    with pytest.raises(ConfigError) as error:
        load_settings(path)
    message = str(error.value)
    assert "kubernetes.shm_size: '8GB' is not a Kubernetes quantity (e.g. 500m, 4, 16Gi)" in message
    assert "kubernetes.queue_name: 'no spaces' does not match" in message
    assert "kubernetes.env.NCCL_IB_DISABLE: 1 is not of type 'string'" in message
    assert "kubernetes.worker_affinity: Additional properties are not allowed ('nodeAfinity'" in message


def test_a_pod_template_replacing_the_command_fails_the_dag_naming_the_key(tmp_path):
    """Refused when the DAG is parsed (as a schema error of the settings file is), before any run or pod."""
    path = tmp_path / "pgtrain.yaml"
    path.write_text("kubernetes:\n  pod_template:\n    spec:\n      containers:\n"
                    "        - {name: trainer, command: [bash, -c, 'sleep infinity']}\n"
                    "  env: {PGTRAIN_DATABASE_URL: x}\n")
    with pytest.raises(ConfigError) as error:
        MPIJobTrainOperator(task_id="train", **load_settings(path).operator_arguments())
    message = str(error.value)
    assert "pod_template.spec.containers[0].command: the launcher's horovodrun and the workers' sshd are pgtrain's" \
        in message
    assert "env: PGTRAIN_DATABASE_URL is pgtrain's own; the database URL reaches the pods only from the Secret" \
        in message
    assert "fix `kubernetes:` in the DAG author's settings file" in message


def test_a_models_file_entry_takes_the_same_keys(tmp_path):
    path = tmp_path / "models.yaml"
    entry = ("  - name: {name}\n    source: {{table: public.samples, key_column: id, features_column: features, "
             "label_column: label}}\n    schedule: {{cron: '@daily'}}\n    kubernetes: {kubernetes}\n")
    path.write_text("models:\n" + entry.format(name="queued", kubernetes="{queue_name: team-ml, shm_size: 32Gi}")
                    + entry.format(name="bad", kubernetes="{shm_size: lots}"))
    entries, errors = load_entries(path)
    assert [e.name for e in entries] == ["queued"]
    assert entries[0].kubernetes == {"queue_name": "team-ml", "shm_size": "32Gi"}
    assert "kubernetes.shm_size: 'lots' is not a Kubernetes quantity" in str(errors[0])
    manifest = spec.settings_from(entries[0].kubernetes, run_id="r", world_size=1, attempt=1)
    assert spec.build_mpijob(manifest)["metadata"]["labels"][api.QUEUE_NAME_LABEL] == "team-ml"


def test_every_key_is_documented_and_listed_in_the_settings_file():
    from pgtrain.config.settings import KUBERNETES_SETTINGS

    docs = (REPO / "docs" / "kubernetes.md").read_text()
    table = docs[docs.index("| setting | default | renders to |"):docs.index("Sizes are Kubernetes quantities")]
    shipped = (REPO / "dags" / "pgtrain.yaml").read_text()
    for key in KUBERNETES_SETTINGS:
        assert f"`{key}`" in table, f"{key} is not in docs/kubernetes.md's table of kubernetes keys"
        assert re.search(rf"\b{key}\b", shipped), f"{key} is not listed in dags/pgtrain.yaml"
