"""The Kubeflow MPIJob (``kubeflow.org/v2beta1``) that runs the trainer on GPU pods: spec, rules, state.

Pure Python (no Airflow, no Kubernetes client): the Airflow operator, its trigger and the
``render`` command below all build, check and read MPIJobs through these functions.

    python -m pgtrain.mpijob render --world-size 8 --gpus-per-worker 4 --image IMAGE --run-id RUN

Layout: ``world_size`` Horovod ranks, one per GPU, ``gpus_per_worker`` GPUs (= MPI slots) per worker
pod; a launcher pod without GPU runs ``horovodrun`` against the hostfile the MPI Operator mounts at
``/etc/mpi/hostfile``. The database URL reaches the pods only from a Kubernetes Secret.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import math
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pgtrain import __version__
from pgtrain.errors import ConfigError
from pgtrain.trainer_command import DATABASE_URL_ENV, DATABASE_URL_FILE_ENV, horovodrun_options, trainer_argv

API_GROUP = "kubeflow.org"
API_VERSION = "v2beta1"
KIND = "MPIJob"
PLURAL = "mpijobs"
MPI_OPERATOR_VERSION = "v0.6.0"  # first release with launcherCreationPolicy; see docs/kubernetes.md

# Labels the MPI Operator puts on the pods it creates.
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"

GPU_RESOURCE = "nvidia.com/gpu"
CONTAINER_NAME = "trainer"
HOSTFILE = "/etc/mpi/hostfile"  # the MPI Operator mounts its <job>-config ConfigMap at /etc/mpi
SSH_AUTH_MOUNT_PATH = "/root/.ssh"
# The Secret with the database URL is mounted as a file here (never an env var: Horovod's Gloo launcher
# writes every env var into the ranks' `sh -c` command lines, where `ps` shows them).
DATABASE_VOLUME = "pgtrain-database"
DATABASE_MOUNT_PATH = "/var/run/secrets/pgtrain"
DATABASE_URL_FILE = f"{DATABASE_MOUNT_PATH}/url"
WORKER_COMMAND = ["/usr/sbin/sshd", "-De"]  # workers only serve SSH; the launcher starts ranks on them
RUN_ID_ANNOTATION = "pgtrain.io/training-run-id"
# The MPI Operator only accepts these (pkg/apis/kubeflow/validation); the launcher is a batch Job.
RESTART_POLICIES = ("Never", "OnFailure")

DEFAULT_IMAGE = f"pgtrain-trainer:{__version__}"
DEFAULT_SECRET_NAME = "pgtrain-db"
DEFAULT_SECRET_KEY = "url"

_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_LABEL_MAX = 63
_CREDENTIAL_URL = re.compile(r"postgres(ql)?://[^/\s:@]*:[^@\s/]+@|password\s*=", re.IGNORECASE)

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
    # The run's train attempt (pgtrain.runs.begin_attempt), passed to the trainer, which fences its writes by it.
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
            problems.append("image is empty: build trainer_image/Dockerfile, push it and set k8s_image")
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
    limit = _DNS_LABEL_MAX - _longest_suffix(workers) - len(digest) - 1
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


def validate_mpijob(manifest: Mapping[str, Any]) -> None:
    """The MPI Operator's own v2beta1 rules plus pgtrain's: raise ConfigError listing every violation."""
    problems = list(mpijob_problems(manifest))
    if problems:
        raise ConfigError("the MPIJob manifest is invalid: " + "; ".join(problems))


def mpijob_problems(manifest: Mapping[str, Any]) -> Iterator[str]:
    if manifest.get("apiVersion") != f"{API_GROUP}/{API_VERSION}" or manifest.get("kind") != KIND:
        yield f"apiVersion/kind should be {API_GROUP}/{API_VERSION} {KIND}"
    spec = manifest.get("spec") or {}
    replicas = spec.get("mpiReplicaSpecs") or {}
    launcher, worker = replicas.get("Launcher"), replicas.get("Worker")
    name = (manifest.get("metadata") or {}).get("name") or ""
    workers = (worker or {}).get("replicas") or 1
    if not _DNS_1035.match(name) or len(name) > _DNS_LABEL_MAX:
        yield f"metadata.name {name!r} is not a DNS-1035 label (lowercase letter first, [a-z0-9-], <= 63)"
    longest = f"{name}-worker-{workers - 1}"
    if len(longest) > _DNS_LABEL_MAX or len(f"{name}-launcher") > _DNS_LABEL_MAX:
        yield f"pod hostname {longest!r} would be longer than {_DNS_LABEL_MAX} characters"
    if not launcher:
        yield "spec.mpiReplicaSpecs.Launcher is required"
    elif launcher.get("replicas") != 1:
        yield f"Launcher replicas must be 1, not {launcher.get('replicas')!r}"
    if not worker:
        yield "spec.mpiReplicaSpecs.Worker is required (the launcher runs no ranks)"
    elif not isinstance(worker.get("replicas"), int) or worker["replicas"] < 1:
        yield f"Worker replicas must be >= 1, not {worker.get('replicas')!r}"
    for role, replica in (("Launcher", launcher), ("Worker", worker)):
        if not replica:
            continue
        if replica.get("restartPolicy") not in RESTART_POLICIES:
            yield f"{role} restartPolicy {replica.get('restartPolicy')!r} is not one of {RESTART_POLICIES}"
        containers = ((replica.get("template") or {}).get("spec") or {}).get("containers") or []
        if not containers:
            yield f"{role} template has no container"
        for container in containers:
            gpu = ((container.get("resources") or {}).get("limits") or {}).get(GPU_RESOURCE)
            if role == "Launcher" and gpu:
                yield "the Launcher must not request GPUs"
            if role == "Worker" and container.get("name") == CONTAINER_NAME and gpu != spec.get("slotsPerWorker"):
                yield f"Worker {GPU_RESOURCE} limit {gpu!r} should equal slotsPerWorker {spec.get('slotsPerWorker')!r}"
            for env in container.get("env") or []:
                if env.get("name") == DATABASE_URL_ENV:
                    yield (f"{role} sets {DATABASE_URL_ENV}; the database URL must come from the Secret mounted at "
                           f"{DATABASE_MOUNT_PATH} ({DATABASE_URL_FILE_ENV})")
    slots = spec.get("slotsPerWorker")
    if not isinstance(slots, int) or slots < 1:
        yield f"slotsPerWorker must be a positive integer, not {slots!r}"
    policy = spec.get("runPolicy") or {}
    if policy.get("cleanPodPolicy") not in ("None", "Running", "All"):
        yield f"runPolicy.cleanPodPolicy {policy.get('cleanPodPolicy')!r} is not None/Running/All"
    for key in ("backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished"):
        if key in policy and (not isinstance(policy[key], int) or policy[key] < 0):
            yield f"runPolicy.{key} must be a non-negative integer, not {policy[key]!r}"
    if not spec.get("sshAuthMountPath"):
        yield "spec.sshAuthMountPath is required"
    if spec.get("mpiImplementation", "OpenMPI") not in ("OpenMPI", "Intel", "MPICH"):
        yield f"spec.mpiImplementation {spec.get('mpiImplementation')!r} is not supported"
    if spec.get("launcherCreationPolicy", "AtStartup") not in ("AtStartup", "WaitForWorkersReady"):
        yield f"spec.launcherCreationPolicy {spec.get('launcherCreationPolicy')!r} is not supported"
    for path in credential_literals(manifest):
        yield f"{path} looks like a credential; pass it through a Secret instead"


def credential_literals(value: Any, path: str = "") -> list[str]:
    """Paths in a manifest (or log line, or XCom value) whose strings look like a database password."""
    if isinstance(value, Mapping):
        return [p for k, v in value.items() for p in credential_literals(v, f"{path}.{k}" if path else str(k))]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in credential_literals(v, f"{path}[{i}]")]
    if isinstance(value, str) and _CREDENTIAL_URL.search(value):
        return [path or "<value>"]
    return []


# --- reading an MPIJob's state (the operator and its trigger share this) ---

@dataclass(frozen=True)
class JobState:
    phase: str  # Pending, Running, Succeeded, Failed
    reason: str = ""
    message: str = ""

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


def job_state(job: Mapping[str, Any]) -> JobState:
    """The MPIJob's phase from its conditions (the last true one of Succeeded/Failed/Running wins)."""
    conditions = {c.get("type"): c for c in (job.get("status") or {}).get("conditions") or []
                  if c.get("status") == "True"}
    for phase in ("Failed", "Succeeded", "Running"):
        if phase in conditions:
            cond = conditions[phase]
            return JobState(phase, cond.get("reason") or "", cond.get("message") or "")
    return JobState("Pending")


def is_deleting(job: Mapping[str, Any]) -> bool:
    return bool((job.get("metadata") or {}).get("deletionTimestamp"))


def startup_problems(pods: Sequence[Mapping[str, Any]]) -> list[str]:
    """Why the job's pods are not running yet, one line per pod that is stuck (API-form pods)."""
    lines = []
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        status = pod.get("status") or {}
        phase = status.get("phase") or "Pending"
        if phase != "Pending":
            continue
        why = [f"{c.get('reason')}: {c.get('message')}" for c in status.get("conditions") or []
               if c.get("type") == "PodScheduled" and c.get("status") == "False"]
        for cs in status.get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting")
            if waiting and waiting.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
                why.append(f"{waiting.get('reason')}: {waiting.get('message') or ''}".rstrip(": "))
        lines.append(f"{pod['metadata']['name']} Pending" + (f" ({'; '.join(why)})" if why else ""))
    return lines


def fatal_start_problem(pods: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]] = ()) -> str | None:
    """A container that can never start (no Secret, bad image name): no point waiting for the timeout.

    ``events``: the pods' API-form events; a missing Secret shows there only (FailedMount), while the pod
    waits in ContainerCreating.
    """
    for pod in pods:
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in ("CreateContainerConfigError", "InvalidImageName", "ErrImageNeverPull"):
                return f"{pod['metadata']['name']}: {waiting['reason']}: {waiting.get('message') or ''}"
    names = {pod["metadata"]["name"] for pod in pods}
    for event in events:
        message = event.get("message") or ""
        if (event.get("reason") == "FailedMount" and (event.get("involvedObject") or {}).get("name") in names
                and f'"{DATABASE_VOLUME}"' in message and ("not found" in message or "non-existent" in message)):
            return f"{event['involvedObject']['name']}: FailedMount: {message}"
    return None


@dataclass(frozen=True)
class WatchVerdict:
    """What one look at an MPIJob and its pods says. ``outcome``: waiting (not started, still within the
    startup timeout), running, succeeded, failed, cannot_start (a pod can never start: no point waiting)
    or timeout (not started in time)."""

    outcome: str
    message: str = ""
    reason: str = ""

    @property
    def done(self) -> bool:
        return self.outcome not in ("waiting", "running")


def watch_step(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], now: float, startup_deadline: float,
               started: bool = False, events: Sequence[Mapping[str, Any]] = ()) -> WatchVerdict:
    """One step of watching a job (API-form job, pods and their events), the same for the operator's loop
    and its trigger.

    ``started``: the job was seen running before (a job that started is never timed out for startup).
    """
    state = job_state(job)
    if state.finished:
        return WatchVerdict("succeeded" if state.phase == "Succeeded" else "failed", state.message, state.reason)
    if started or state.phase == "Running":
        return WatchVerdict("running", state.message, state.reason)
    fatal = fatal_start_problem(pods, events)
    if fatal is not None:
        return WatchVerdict("cannot_start", fatal)
    if now >= startup_deadline:
        return WatchVerdict("timeout", "; ".join(startup_problems(pods)))
    return WatchVerdict("waiting")


def render_yaml(manifest: Mapping[str, Any]) -> str:
    import yaml  # only the CLI needs it

    return yaml.safe_dump(dict(manifest), sort_keys=False, default_flow_style=False)


def _key_values(items: Sequence[str], what: str) -> dict[str, str]:
    result = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--{what} expects KEY=VALUE, got {item!r}")
        result[key] = value
    return result


def _toleration(text: str) -> dict[str, str]:
    """KEY[=VALUE][:EFFECT], as kubectl taint writes taints."""
    spec, _, effect = text.partition(":")
    key, sep, value = spec.partition("=")
    toleration = {"key": key, "operator": "Equal" if sep else "Exists"}
    if sep:
        toleration["value"] = value
    if effect:
        toleration["effect"] = effect
    return toleration


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pgtrain.mpijob", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    render = sub.add_parser("render", help="print the MPIJob as YAML (no cluster needed)")
    render.add_argument("--run-id", required=True, help="training run id (plan_run creates it)")
    render.add_argument("--world-size", type=int, required=True, help="Horovod ranks = GPUs")
    render.add_argument("--gpus-per-worker", type=int, default=1)
    render.add_argument("--image", default=DEFAULT_IMAGE)
    render.add_argument("--name", default="", help="MPIJob name (default: derived from the run id)")
    render.add_argument("--namespace", default="default")
    render.add_argument("--secret", default=DEFAULT_SECRET_NAME, help="Secret holding the database URL")
    render.add_argument("--secret-key", default=DEFAULT_SECRET_KEY)
    render.add_argument("--worker-cpu", default="4")
    render.add_argument("--worker-memory", default="16Gi")
    render.add_argument("--node-selector", action="append", default=[], metavar="KEY=VALUE")
    render.add_argument("--toleration", action="append", default=[], metavar="KEY[=VALUE][:EFFECT]")
    render.add_argument("--active-deadline-seconds", type=int, default=86400)
    render.add_argument("--attempt", type=int, default=1,
                        help="the run's train attempt the trainer is told (pgtrain.runs.begin_attempt); a "
                             "trainer of an older attempt than the run's cannot write")
    args = parser.parse_args(argv)
    try:
        settings = MPIJobSettings(
            run_id=args.run_id, world_size=args.world_size, gpus_per_worker=args.gpus_per_worker,
            image=args.image, name=args.name, namespace=args.namespace, database_secret=args.secret,
            database_secret_key=args.secret_key, worker_cpu=args.worker_cpu, worker_memory=args.worker_memory,
            node_selector=_key_values(args.node_selector, "node-selector"),
            tolerations=[_toleration(t) for t in args.toleration],
            active_deadline_seconds=args.active_deadline_seconds, attempt=args.attempt,
        )
        sys.stdout.write(render_yaml(build_mpijob(settings)))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
