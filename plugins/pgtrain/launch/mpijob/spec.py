"""The Kubeflow MPIJob (``kubeflow.org/v2beta1``) that runs the trainer on GPU pods: its settings, name and
manifest. Pure Python (no Airflow, no Kubernetes client).

Layout: ``world_size`` ranks, one per GPU, ``gpus_per_worker`` GPUs (= MPI slots) per worker
pod; a launcher pod without GPU runs ``horovodrun`` (backend ``horovod``) or ``mpirun`` (backend ``torch``) against
the hostfile the MPI Operator mounts at ``/etc/mpi/hostfile``. The database URL reaches the pods only from a
Kubernetes Secret.
"""

from __future__ import annotations

import copy
import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pgtrain.config.kubernetes import SETTINGS, KubernetesSettings, default, value_problems
from pgtrain.config.params import DEFAULT_COLLECTIVE_TIMEOUT
from pgtrain.core.database_url import DATABASE_URL_ENV, DATABASE_URL_FILE_ENV
from pgtrain.core.errors import ConfigError
from pgtrain.launch.mpijob import sizing
from pgtrain.launch.mpijob.api import (
    API_GROUP,
    API_VERSION,
    CONTAINER_NAME,
    DATABASE_MOUNT_PATH,
    DATABASE_URL_FILE,
    DATABASE_VOLUME,
    DNS_LABEL_MAX,
    GPU_RESOURCE,
    GPUS_PER_WORKER_ENV,
    JOB_NAME_LABEL,
    JOB_ROLE_LABEL,
    KIND,
    NON_ROOT_SSH_AUTH_MOUNT_PATH,
    NON_ROOT_UID,
    NON_ROOT_WORKER_COMMAND,
    QUEUE_NAME_LABEL,
    RUN_ID_ANNOTATION,
    SHM_MOUNT_PATH,
    SHM_VOLUME,
    SSH_AUTH_MOUNT_PATH,
    WORKER_COMMAND,
)
from pgtrain.launch.mpijob.launcher import launcher_command
from pgtrain.launch.mpijob.pod_templates import env_problems, merge_template, non_root_problems, template_problems
from pgtrain.launch.mpijob.validation import validate_mpijob


@dataclass(frozen=True, kw_only=True)
class MPIJobSettings(KubernetesSettings):
    """Everything that shapes one MPIJob: the Kubernetes settings (``pgtrain.config.kubernetes``, where each is
    declared) and the run's own; validated on construction. The ``pod`` settings are for base_pod() only: an
    operator-supplied pod carries its own (KubernetesPodOperator's arguments of these names; env is its env_vars)."""

    run_id: str
    world_size: int
    name: str = ""
    # The run's train attempt (pgtrain.runs.record.begin_attempt), passed to the trainer, which fences its writes by it.
    attempt: int
    # The ranks' collectives (pgtrain.launch.backends.kubernetes_backend: auto is the image's Horovod) and, for torch,
    # how long a rank waits in one collective before the job fails.
    backend: str = "horovod"
    collective_timeout: int = DEFAULT_COLLECTIVE_TIMEOUT

    def __post_init__(self) -> None:
        problems = []
        if not self.run_id:
            problems.append("run_id is empty")
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int) or self.world_size < 1:
            problems.append(f"world_size={self.world_size!r} should be a positive integer")
        if (isinstance(self.gpus_per_worker, bool) or not isinstance(self.gpus_per_worker, int)
                or self.gpus_per_worker < 1):
            problems.append(f"gpus_per_worker={self.gpus_per_worker!r} should be a positive integer")
        if not self.image:
            problems.append("image is empty: build trainer_image/Dockerfile, push it and set kubernetes.image in "
                            "the settings file")
        if not self.database_secret or not self.database_secret_key:
            problems.append("database_secret and database_secret_key name the Secret with the database URL")
        if self.backoff_limit < 0:
            problems.append(f"backoff_limit={self.backoff_limit} should be >= 0")
        if self.backend not in ("horovod", "torch"):
            problems.append(f"backend={self.backend!r} should be horovod or torch (auto is resolved before)")
        if isinstance(self.attempt, bool) or not isinstance(self.attempt, int) or self.attempt < 1:
            problems.append(f"attempt={self.attempt!r} should be the run's train attempt (an integer >= 1)")
        problems += _cross_problems({name: getattr(self, name) for name in SETTINGS})
        if problems:
            raise ConfigError("invalid MPIJob settings: " + "; ".join(problems))
        layout(self.world_size, self.gpus_per_worker)  # raises on an impossible layout

    @property
    def worker_requests(self) -> dict[str, str]:
        """Each worker's cpu and memory requests: the author's, else sized per GPU it holds."""
        _, slots = layout(self.world_size, self.gpus_per_worker)
        return {"cpu": sizing.per_gpu(self.worker_cpu, self.cpu_per_gpu, slots),
                "memory": sizing.per_gpu(self.worker_memory, self.memory_per_gpu, slots)}

    @property
    def job_name(self) -> str:
        workers, _ = layout(self.world_size, self.gpus_per_worker)
        return self.name or job_name(self.run_id, workers=workers)


def layout(world_size: int, gpus_per_worker: int) -> tuple[int, int]:
    """(worker pods, slots per worker): one rank per GPU; fewer ranks than GPUs per worker use one worker."""
    slots = min(gpus_per_worker, world_size)
    workers = math.ceil(world_size / slots)
    if workers * slots != world_size:
        raise ConfigError(
            f"world_size={world_size} is not a multiple of gpus_per_worker={gpus_per_worker}: "
            f"{workers} workers would hold {workers * slots} GPUs for {world_size} ranks. Choose a "
            f"world_size that is a multiple of gpus_per_worker (e.g. {workers * slots}) or change gpus_per_worker"
        )
    return workers, slots


def job_name(*identity: object, workers: int = 1) -> str:
    """A DNS-1035 name unique to ``identity``, short enough for the MPI Operator's pod and service names.

    The readable part comes from the identity; a hash of all of it keeps names of different
    runs (or tries) apart after truncation.
    """
    digest = hashlib.sha256("\x1f".join(str(part) for part in identity).encode()).hexdigest()[:8]
    limit = DNS_LABEL_MAX - _longest_suffix(workers) - len(digest) - 1
    readable = re.sub(r"[^a-z0-9]+", "-", "-".join(str(p) for p in identity[:2]).lower())
    readable = readable.lstrip("-0123456789")[:limit].rstrip("-") or "mpijob"
    return f"{readable}-{digest}"


def _longest_suffix(workers: int) -> int:
    # Pods are <job>-launcher-<5 chars> (the launcher Job's pod) and <job>-worker-<i>; pod hostnames
    # are DNS labels. The launcher pod's random suffix is added by the Job controller, which
    # truncates its generateName; the hostname it uses is <job>-launcher.
    return max(len("-launcher"), len(f"-worker-{workers - 1}"))


def author_problems(values: Mapping[str, Any]) -> list[str]:
    """What is wrong with the settings among ``values`` (the operator's arguments, the render command's flags): each
    against its schema, then together (a missing one is its default); checked when the operator is built, before
    any pod is. How the operator watches (``operator`` settings) is KubernetesPodOperator's own argument, taken as
    given (a test polls faster than the settings file's bounds allow an author)."""
    problems = value_problems({name: value for name, value in values.items()
                               if name in SETTINGS and SETTINGS[name].role != "operator"})
    return problems or _cross_problems(values)


def _cross_problems(values: Mapping[str, Any]) -> list[str]:
    """What the schemas cannot say: settings that contradict each other, env names and pod templates that would
    take over what pgtrain owns."""
    values = {name: values.get(name, default(name)) for name in SETTINGS}
    problems = []
    if values["worker_guaranteed"] and values["worker_memory_limit"] not in (None, values["worker_memory"]):
        problems.append(f"worker_guaranteed sets the memory limit to the memory request (worker_memory="
                        f"{values['worker_memory']!r}, None: memory_per_gpu for each GPU); "
                        f"worker_memory_limit={values['worker_memory_limit']!r} contradicts it: drop one of them")
    problems += env_problems(values["env"] or {})
    for key in ("pod_template", "worker_pod_template", "launcher_pod_template"):
        problems += template_problems(values[key] or {}, key)
        if values["non_root"]:
            problems += non_root_problems(values[key] or {}, key)
    return problems


def settings_from(kubernetes: Mapping[str, Any], **run: Any) -> MPIJobSettings:
    """MPIJobSettings from the author's ``kubernetes:`` block (pgtrain.config.settings.KUBERNETES_SETTINGS) and
    the run's own (run_id, world_size, attempt, ...): what ``render --settings`` shows."""
    return MPIJobSettings(**{**kubernetes, **run})


def database_volume(secret: str, key: str, mode: int = 0o400) -> dict[str, Any]:
    """The Secret's key as the file DATABASE_URL_FILE, readable by the container's user only (0400), or by its
    group too in non-root mode (0440, the pod's fsGroup: a Secret's files belong to root)."""
    return {"name": DATABASE_VOLUME,
            "secret": {"secretName": secret, "items": [{"key": key, "path": "url"}], "defaultMode": mode}}


def _env_names(pod: Mapping[str, Any]) -> list[str]:
    """The names of the trainer container's own environment (the author's ``env``), which mpirun passes on."""
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return [e["name"] for e in containers[0].get("env") or [] if e.get("name")
            and e["name"] not in (DATABASE_URL_ENV, DATABASE_URL_FILE_ENV)]


def _env_value(pod: Mapping[str, Any], name: str) -> str | None:
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return next((e.get("value") for e in containers[0].get("env") or [] if e.get("name") == name), None)


def _with_database_secret(spec: dict[str, Any], container: dict[str, Any], settings: MPIJobSettings) -> None:
    """Mount the URL's Secret into ``container`` and point the trainer at the file; drop any URL env var. Tell the
    ranks how many GPUs each worker holds (GPUS_PER_WORKER_ENV): with any, a rank without CUDA refuses the run."""
    spec["volumes"] = [v for v in spec.get("volumes") or [] if v.get("name") != DATABASE_VOLUME]
    spec["volumes"].append(database_volume(settings.database_secret, settings.database_secret_key,
                                           0o440 if settings.non_root else 0o400))
    mounts = [m for m in container.get("volumeMounts") or [] if m.get("mountPath") != DATABASE_MOUNT_PATH
              and m.get("name") != DATABASE_VOLUME]
    container["volumeMounts"] = [*mounts, {"name": DATABASE_VOLUME, "mountPath": DATABASE_MOUNT_PATH,
                                           "readOnly": True}]
    env = [e for e in container.get("env") or []
           if e.get("name") not in (DATABASE_URL_ENV, DATABASE_URL_FILE_ENV, "PYTHONUNBUFFERED", GPUS_PER_WORKER_ENV)]
    _, slots = layout(settings.world_size, settings.gpus_per_worker)
    container["env"] = [{"name": DATABASE_URL_FILE_ENV, "value": DATABASE_URL_FILE},
                        {"name": "PYTHONUNBUFFERED", "value": "1"},
                        {"name": GPUS_PER_WORKER_ENV, "value": str(slots)}, *env]


def base_pod(settings: MPIJobSettings) -> dict[str, Any]:
    """The pod both templates start from when no Airflow operator supplies one (the ``render`` command): what
    MPIJobOperator has KubernetesPodOperator put on its pod from the same settings."""
    container: dict[str, Any] = {"name": CONTAINER_NAME, "image": settings.image}
    if settings.env:
        container["env"] = [{"name": name, "value": value} for name, value in settings.env.items()]
    spec: dict[str, Any] = {"containers": [container]}
    if settings.node_selector:
        spec["nodeSelector"] = dict(settings.node_selector)
    if settings.tolerations:
        spec["tolerations"] = [dict(t) for t in settings.tolerations]
    if settings.service_account_name:
        spec["serviceAccountName"] = settings.service_account_name
    if settings.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": name} for name in settings.image_pull_secrets]
    if settings.priority_class_name:
        spec["priorityClassName"] = settings.priority_class_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"labels": {}}, "spec": spec}


def build_mpijob(settings: MPIJobSettings, pod: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The MPIJob manifest; ``pod`` is the API-form pod both replica templates are derived from.

    ``pod`` carries everything a KubernetesPodOperator would put on its own pod (image, env,
    secrets, volumes, resources, scheduling, pull secrets, labels); its first container is the
    trainer container. The result passes :func:`validate_mpijob`.
    """
    pod = copy.deepcopy(dict(pod) if pod is not None else base_pod(settings))
    workers, slots = layout(settings.world_size, settings.gpus_per_worker)
    name = settings.job_name
    labels = dict((pod.get("metadata") or {}).get("labels", {}))
    annotations = {**(pod.get("metadata") or {}).get("annotations", {}), RUN_ID_ANNOTATION: settings.run_id}

    worker_requests = settings.worker_requests
    worker_limits = {"memory": settings.worker_memory_limit} if settings.worker_memory_limit else {}
    if settings.worker_guaranteed:
        worker_limits = dict(worker_requests)
    worker_affinity = dict(settings.worker_affinity)
    if sizing.one_worker_per_node(settings.one_worker_per_node, slots):
        worker_affinity = _one_per_node(worker_affinity or (pod.get("spec") or {}).get("affinity") or {}, name)
    launcher = _replica_template(
        pod, settings, labels, annotations,
        command=launcher_command(settings.run_id, settings.world_size, settings.attempt, settings.backend,
                                 settings.collective_timeout, _env_names(pod), as_root=not settings.non_root,
                                 socket_ifname=_env_value(pod, "NCCL_SOCKET_IFNAME")),
        requests={"cpu": settings.launcher_cpu, "memory": settings.launcher_memory},
        limits={"memory": settings.launcher_memory}, gpus=0, shm_size=None, affinity=settings.launcher_affinity,
        node_selector=settings.launcher_node_selector, templates=(settings.pod_template,
                                                                  settings.launcher_pod_template),
    )
    worker = _replica_template(
        pod, settings, labels, annotations, command=NON_ROOT_WORKER_COMMAND if settings.non_root else WORKER_COMMAND,
        requests=worker_requests, limits=worker_limits, gpus=slots,
        shm_size=settings.shm_size, affinity=worker_affinity, node_selector={},
        templates=(settings.pod_template, settings.worker_pod_template),
    )
    run_policy: dict[str, Any] = {
        "cleanPodPolicy": "Running",
        "backoffLimit": settings.backoff_limit,
        "ttlSecondsAfterFinished": settings.ttl_seconds_after_finished,
    }
    if settings.active_deadline_seconds:
        run_policy["activeDeadlineSeconds"] = settings.active_deadline_seconds
    if settings.scheduling_policy:
        # The operator's default minAvailable is workers + 1; the launcher only exists once the workers are ready
        # (launcherCreationPolicy: WaitForWorkersReady), so a gang waiting for it would never start.
        run_policy["schedulingPolicy"] = {"minAvailable": workers, **settings.scheduling_policy}
    job_labels = dict(labels)
    if settings.queue_name:
        job_labels[QUEUE_NAME_LABEL] = settings.queue_name
    manifest = {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "metadata": {"name": name, "namespace": settings.namespace, "labels": job_labels,
                     "annotations": dict(annotations)},
        "spec": {
            "slotsPerWorker": slots,
            "launcherCreationPolicy": "WaitForWorkersReady",
            "mpiImplementation": "OpenMPI",
            "sshAuthMountPath": NON_ROOT_SSH_AUTH_MOUNT_PATH if settings.non_root else SSH_AUTH_MOUNT_PATH,
            "runPolicy": run_policy,
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "restartPolicy": "Never", "template": launcher},
                "Worker": {"replicas": workers, "restartPolicy": "OnFailure", "template": worker},
            },
        },
    }
    validate_mpijob(manifest)
    return manifest


def _one_per_node(affinity: Mapping[str, Any], job: str) -> dict[str, Any]:
    """``affinity`` plus a required anti-affinity between this job's worker pods on a node's hostname."""
    term = {"labelSelector": {"matchLabels": {JOB_NAME_LABEL: job, JOB_ROLE_LABEL: "worker"}},
            "topologyKey": "kubernetes.io/hostname"}
    result = copy.deepcopy(dict(affinity))
    anti = result.setdefault("podAntiAffinity", {})
    anti["requiredDuringSchedulingIgnoredDuringExecution"] = [
        *anti.get("requiredDuringSchedulingIgnoredDuringExecution", []), term]
    return result


# The restricted Pod Security Standard, as the MPI Operator's non-root mode runs (api.NON_ROOT_*).
def _non_root_pod_context() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": NON_ROOT_UID, "runAsGroup": NON_ROOT_UID, "fsGroup": NON_ROOT_UID,
            "seccompProfile": {"type": "RuntimeDefault"}}


NON_ROOT_CONTAINER_CONTEXT: dict[str, Any] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _replica_template(pod: Mapping[str, Any], settings: MPIJobSettings, labels: Mapping[str, str],
                      annotations: Mapping[str, str], *, command: list[str], requests: dict[str, str],
                      limits: dict[str, str], gpus: int, shm_size: str | None, affinity: Mapping[str, Any],
                      node_selector: Mapping[str, str], templates: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One replica's pod template: the pod, the role's settings, the author's templates, then what pgtrain owns
    (the command, the database Secret, the GPUs). No restartPolicy: the MPI Operator sets it from the replica spec
    (and warns about one in the template)."""
    spec = copy.deepcopy(dict(pod.get("spec") or {}))
    spec.pop("restartPolicy", None)
    if affinity:
        spec["affinity"] = {**(spec.get("affinity") or {}), **copy.deepcopy(dict(affinity))}
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    containers = spec.get("containers") or [{}]
    containers[0]["name"] = CONTAINER_NAME
    spec["containers"] = containers
    metadata = {"labels": dict(labels), "annotations": dict(annotations)}
    for template in templates:
        spec = merge_template(spec, template.get("spec") or {})
        metadata = merge_template(metadata, template.get("metadata") or {})
    containers = spec["containers"]
    container = containers[0]
    if settings.non_root:  # over what the templates say: they may add to it, not undo it
        spec["securityContext"] = {**(spec.get("securityContext") or {}), **_non_root_pod_context()}
        for each in [*containers, *(spec.get("initContainers") or [])]:  # sidecars too: the pod passes as a whole
            each["securityContext"] = {**(each.get("securityContext") or {}),
                                       **copy.deepcopy(NON_ROOT_CONTAINER_CONTEXT)}
    if shm_size and not any(m.get("mountPath") == SHM_MOUNT_PATH for m in container.get("volumeMounts") or []):
        spec["volumes"] = [*(spec.get("volumes") or []),
                           {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": shm_size}}]
        container["volumeMounts"] = [*(container.get("volumeMounts") or []),
                                     {"name": SHM_VOLUME, "mountPath": SHM_MOUNT_PATH}]
    container["image"] = container.get("image") or settings.image
    container["command"] = list(command)
    container.pop("args", None)
    _with_database_secret(spec, container, settings)
    resources = copy.deepcopy(container.get("resources") or {})
    resources["requests"] = {**requests, **(resources.get("requests") or {})}
    resources["limits"] = {**limits, **(resources.get("limits") or {})}
    for part in ("requests", "limits"):
        resources[part].pop(GPU_RESOURCE, None)
    if gpus:
        resources["limits"][GPU_RESOURCE] = gpus
    container["resources"] = {k: v for k, v in resources.items() if v}
    return {"metadata": metadata, "spec": spec}
