"""The Kubeflow MPIJob (``kubeflow.org/v2beta1``) that runs the trainer on GPU pods: its settings, name and
manifest. Pure Python (no Airflow, no Kubernetes client).

Layout: ``world_size`` Horovod ranks, one per GPU, ``gpus_per_worker`` GPUs (= MPI slots) per worker
pod; a launcher pod without GPU runs ``horovodrun`` against the hostfile the MPI Operator mounts at
``/etc/mpi/hostfile``. The database URL reaches the pods only from a Kubernetes Secret.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pgtrain.core.database_url import DATABASE_URL_ENV, DATABASE_URL_FILE_ENV
from pgtrain.core.errors import ConfigError
from pgtrain.launch.mpijob.api import (
    API_GROUP,
    API_VERSION,
    CONTAINER_NAME,
    DATABASE_MOUNT_PATH,
    DATABASE_URL_FILE,
    DATABASE_VOLUME,
    DEFAULT_IMAGE,
    DEFAULT_SECRET_KEY,
    DEFAULT_SECRET_NAME,
    DNS_LABEL_MAX,
    GPU_RESOURCE,
    HOSTFILE,
    KIND,
    RUN_ID_ANNOTATION,
    SSH_AUTH_MOUNT_PATH,
    WORKER_COMMAND,
)
from pgtrain.launch.mpijob.validation import validate_mpijob
from pgtrain.launch.trainer_command import horovodrun_options, trainer_argv


@dataclass(frozen=True)
class MPIJobSettings:
    """Everything that shapes one MPIJob; validated on construction."""

    run_id: str
    world_size: int
    image: str = DEFAULT_IMAGE
    gpus_per_worker: int = 1
    name: str = ""
    namespace: str = "default"
    database_secret: str = DEFAULT_SECRET_NAME
    database_secret_key: str = DEFAULT_SECRET_KEY
    worker_cpu: str = "4"
    worker_memory: str = "16Gi"
    launcher_cpu: str = "500m"
    launcher_memory: str = "1Gi"
    backoff_limit: int = 0
    active_deadline_seconds: int | None = 86400
    ttl_seconds_after_finished: int = 3600
    # The run's train attempt (pgtrain.runs.record.begin_attempt), passed to the trainer, which fences its writes by it.
    attempt: int = field(kw_only=True)
    # Scheduling for base_pod(); an operator-supplied pod carries its own.
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Mapping[str, Any]] = ()

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
        if isinstance(self.attempt, bool) or not isinstance(self.attempt, int) or self.attempt < 1:
            problems.append(f"attempt={self.attempt!r} should be the run's train attempt (an integer >= 1)")
        if problems:
            raise ConfigError("invalid MPIJob settings: " + "; ".join(problems))
        layout(self.world_size, self.gpus_per_worker)  # raises on an impossible layout

    @property
    def job_name(self) -> str:
        workers, _ = layout(self.world_size, self.gpus_per_worker)
        return self.name or job_name(self.run_id, workers=workers)


def default(name: str) -> Any:
    """The default of an MPIJobSettings field: the one home of the MPIJob's sizes and run policy defaults
    (the operator's arguments and the render command's flags take theirs from here)."""
    field_ = MPIJobSettings.__dataclass_fields__[name]
    return field_.default_factory() if field_.default is dataclasses.MISSING else field_.default


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


def launcher_command(run_id: str, world_size: int, attempt: int) -> list[str]:
    """``horovodrun`` over the MPI Operator's hostfile: MPI (+NCCL) in the GPU image, Gloo where MPI is absent.

    horovodrun passes the launcher's environment to every rank (``mpirun -x NAME``, or ``env K=V`` on
    the ranks' command lines with Gloo); the database URL is not in it, only the path of the file the
    Secret is mounted as on every pod.
    """
    return ["horovodrun", "-np", str(world_size), "--hostfile", HOSTFILE, *horovodrun_options(),
            *trainer_argv(run_id, attempt)]


def database_volume(secret: str, key: str) -> dict[str, Any]:
    """The Secret's key as the file DATABASE_URL_FILE, readable by the container's user only."""
    return {"name": DATABASE_VOLUME,
            "secret": {"secretName": secret, "items": [{"key": key, "path": "url"}], "defaultMode": 0o400}}


def _with_database_secret(spec: dict[str, Any], container: dict[str, Any], settings: MPIJobSettings) -> None:
    """Mount the URL's Secret into ``container`` and point the trainer at the file; drop any URL env var."""
    spec["volumes"] = [v for v in spec.get("volumes") or [] if v.get("name") != DATABASE_VOLUME]
    spec["volumes"].append(database_volume(settings.database_secret, settings.database_secret_key))
    mounts = [m for m in container.get("volumeMounts") or [] if m.get("mountPath") != DATABASE_MOUNT_PATH
              and m.get("name") != DATABASE_VOLUME]
    container["volumeMounts"] = [*mounts, {"name": DATABASE_VOLUME, "mountPath": DATABASE_MOUNT_PATH,
                                           "readOnly": True}]
    env = [e for e in container.get("env") or []
           if e.get("name") not in (DATABASE_URL_ENV, DATABASE_URL_FILE_ENV, "PYTHONUNBUFFERED")]
    container["env"] = [{"name": DATABASE_URL_FILE_ENV, "value": DATABASE_URL_FILE},
                        {"name": "PYTHONUNBUFFERED", "value": "1"}, *env]


def base_pod(settings: MPIJobSettings) -> dict[str, Any]:
    """The pod both templates start from when no Airflow operator supplies one (the ``render`` command)."""
    spec: dict[str, Any] = {"containers": [{"name": CONTAINER_NAME, "image": settings.image}]}
    if settings.node_selector:
        spec["nodeSelector"] = dict(settings.node_selector)
    if settings.tolerations:
        spec["tolerations"] = [dict(t) for t in settings.tolerations]
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

    launcher = _replica_template(
        pod, settings, labels, annotations, restart_policy="Never",
        command=launcher_command(settings.run_id, settings.world_size, settings.attempt),
        requests={"cpu": settings.launcher_cpu, "memory": settings.launcher_memory},
        limits={"memory": settings.launcher_memory}, gpus=0,
    )
    worker = _replica_template(
        pod, settings, labels, annotations, restart_policy="OnFailure", command=WORKER_COMMAND,
        requests={"cpu": settings.worker_cpu, "memory": settings.worker_memory}, limits={}, gpus=slots,
    )
    run_policy: dict[str, Any] = {
        "cleanPodPolicy": "Running",
        "backoffLimit": settings.backoff_limit,
        "ttlSecondsAfterFinished": settings.ttl_seconds_after_finished,
    }
    if settings.active_deadline_seconds:
        run_policy["activeDeadlineSeconds"] = settings.active_deadline_seconds
    manifest = {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "metadata": {"name": name, "namespace": settings.namespace, "labels": dict(labels),
                     "annotations": dict(annotations)},
        "spec": {
            "slotsPerWorker": slots,
            "launcherCreationPolicy": "WaitForWorkersReady",
            "mpiImplementation": "OpenMPI",
            "sshAuthMountPath": SSH_AUTH_MOUNT_PATH,
            "runPolicy": run_policy,
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "restartPolicy": "Never", "template": launcher},
                "Worker": {"replicas": workers, "restartPolicy": "OnFailure", "template": worker},
            },
        },
    }
    validate_mpijob(manifest)
    return manifest


def _replica_template(pod: Mapping[str, Any], settings: MPIJobSettings, labels: Mapping[str, str],
                      annotations: Mapping[str, str], *, restart_policy: str, command: list[str],
                      requests: dict[str, str], limits: dict[str, str], gpus: int) -> dict[str, Any]:
    spec = copy.deepcopy(dict(pod.get("spec") or {}))
    spec.pop("restartPolicy", None)
    containers = spec.get("containers") or [{}]
    container = containers[0]
    container["name"] = CONTAINER_NAME
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
    spec["containers"] = [container, *containers[1:]]
    spec["restartPolicy"] = restart_policy
    return {"metadata": {"labels": dict(labels), "annotations": dict(annotations)}, "spec": spec}
