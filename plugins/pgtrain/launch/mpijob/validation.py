"""The MPI Operator's own v2beta1 rules for an MPIJob, plus pgtrain's (no credential in a manifest).

The MPIJob's own fields are checked against the MPI Operator's CRD schema (``mpijob_crd_v2beta1.json``: the
v0.6.0 CRD's ``openAPIV3Schema`` without its pod template part, which the tests check against the Kubernetes
schemas) with unknown fields refused: the API server would prune them silently.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pgtrain.core.database_url import DATABASE_URL_ENV, DATABASE_URL_FILE_ENV
from pgtrain.core.errors import ConfigError
from pgtrain.launch.mpijob.api import (
    API_GROUP,
    API_VERSION,
    CONTAINER_NAME,
    DATABASE_MOUNT_PATH,
    DNS_1035,
    DNS_LABEL_MAX,
    GPU_RESOURCE,
    KIND,
    RESTART_POLICIES,
)

_CREDENTIAL_URL = re.compile(r"postgres(ql)?://[^/\s:@]*:[^@\s/]+@|password\s*=", re.IGNORECASE)


def validate_mpijob(manifest: Mapping[str, Any]) -> None:
    """The MPI Operator's own v2beta1 rules plus pgtrain's: raise ConfigError listing every violation."""
    problems = list(mpijob_problems(manifest))
    if problems:
        raise ConfigError("the MPIJob manifest is invalid: " + "; ".join(problems))


@functools.cache
def _crd_validator() -> Any:
    import jsonschema

    schema = json.loads((Path(__file__).parent / "mpijob_crd_v2beta1.json").read_text())["openAPIV3Schema"]

    def closed(node: Any) -> Any:
        if isinstance(node, dict):
            node = {key: closed(value) for key, value in node.items()}
            if "properties" in node and "additionalProperties" not in node:
                node["additionalProperties"] = False
        return node

    schema["properties"]["spec"] = closed(schema["properties"]["spec"])
    return jsonschema.Draft202012Validator(schema)


def crd_problems(manifest: Mapping[str, Any]) -> Iterator[str]:
    """Where the manifest breaks the MPI Operator's CRD schema (types, enums, unknown fields)."""
    for error in sorted(_crd_validator().iter_errors(dict(manifest)), key=lambda e: list(map(str, e.path))):
        yield f"{'.'.join(map(str, error.absolute_path)) or 'top level'}: {error.message} (MPIJob CRD schema)"


def mpijob_problems(manifest: Mapping[str, Any]) -> Iterator[str]:
    yield from crd_problems(manifest)
    if manifest.get("apiVersion") != f"{API_GROUP}/{API_VERSION}" or manifest.get("kind") != KIND:
        yield f"apiVersion/kind should be {API_GROUP}/{API_VERSION} {KIND}"
    spec = manifest.get("spec") or {}
    replicas = spec.get("mpiReplicaSpecs") or {}
    launcher, worker = replicas.get("Launcher"), replicas.get("Worker")
    name = (manifest.get("metadata") or {}).get("name") or ""
    workers = (worker or {}).get("replicas") or 1
    if not DNS_1035.match(name) or len(name) > DNS_LABEL_MAX:
        yield f"metadata.name {name!r} is not a DNS-1035 label (lowercase letter first, [a-z0-9-], <= 63)"
    longest = f"{name}-worker-{workers - 1}"
    if len(longest) > DNS_LABEL_MAX or len(f"{name}-launcher") > DNS_LABEL_MAX:
        yield f"pod hostname {longest!r} would be longer than {DNS_LABEL_MAX} characters"
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
