"""What an author's extra environment and partial pod templates (``kubernetes.env``, ``kubernetes.pod_template``
and the per-role ones) may say, and how a template merges into the replica templates. Pure Python.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

from pgtrain.launch.mpijob.api import (
    CONTAINER_NAME,
    DATABASE_MOUNT_PATH,
    DATABASE_URL_FILE,
    DATABASE_VOLUME,
    GPU_RESOURCE,
    SHM_VOLUME,
)

# Environment variables an author may not set: pgtrain's own, and names that would carry a secret (horovodrun
# copies the launcher's environment onto the ranks' command lines with Gloo, where `ps` shows it).
_RESERVED_ENV = re.compile(r"^(PGTRAIN_|PYTHONUNBUFFERED$|OMPI_ALLOW_RUN_AS_ROOT)")
_SECRET_ENV = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|CREDENTIAL|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|^PGPASS",
                         re.IGNORECASE)
_URL_WITH_CREDENTIALS = re.compile(r"://[^/@\s]+:[^/@\s]*@")  # scheme://user:password@
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def env_problems(env: Mapping[str, Any], key: str = "env") -> list[str]:
    """Why the author's extra environment (``kubernetes.env``) cannot go into the trainer containers, if it cannot."""
    problems = []
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            problems.append(f"{key}: {name!r} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
        elif _RESERVED_ENV.match(name):
            problems.append(f"{key}: {name} is pgtrain's own; the database URL reaches the pods only from the Secret "
                            f"kubernetes.database_secret, mounted as the file {DATABASE_URL_FILE}")
        elif _SECRET_ENV.search(name):
            problems.append(f"{key}: {name} looks like it carries a secret; settings are no place for one (and "
                            "horovodrun copies the environment onto the ranks' command lines): mount it from a "
                            "Kubernetes Secret (KubernetesPodOperator's `secrets` in your own DAG)")
        elif not isinstance(value, str):
            problems.append(f"{key}: {name}={value!r} should be a string (quote it in YAML)")
        elif _URL_WITH_CREDENTIALS.search(value):
            problems.append(f"{key}: {name} holds a URL with a user and password; settings are no place for one "
                            "(and horovodrun copies the environment onto the ranks' command lines): mount it from "
                            "a Kubernetes Secret")
    return problems


def template_problems(template: Mapping[str, Any], key: str = "pod_template") -> list[str]:
    """What a partial pod template (``kubernetes.pod_template``) may not set: what pgtrain decides itself."""
    problems = []
    for part in set(template) - {"metadata", "spec"}:
        problems.append(f"{key}.{part}: a pod template has only metadata (labels, annotations) and spec")
    for part in set(template.get("metadata") or {}) - {"labels", "annotations"}:
        problems.append(f"{key}.metadata.{part}: only labels and annotations can be set (the MPI Operator names "
                        "the pods)")
    spec = template.get("spec") or {}
    owned = {"restartPolicy": "the MPIJob's replica specs set it",
             "hostname": "the MPI Operator sets it", "subdomain": "the MPI Operator sets it"}
    for name, why in owned.items():
        if name in spec:
            problems.append(f"{key}.spec.{name}: {why}")
    for i, volume in enumerate(spec.get("volumes") or []):
        if volume.get("name") in (DATABASE_VOLUME, SHM_VOLUME):
            problems.append(f"{key}.spec.volumes[{i}]: {volume['name']} is pgtrain's (kubernetes.database_secret, "
                            "kubernetes.shm_size)")
    for i, container in enumerate(spec.get("containers") or []):
        where = f"{key}.spec.containers[{i}]"
        if not container.get("name"):
            problems.append(f"{where}: containers are merged by name: name it ({CONTAINER_NAME!r} is the trainer)")
            continue
        if container["name"] == CONTAINER_NAME:
            for field_, why in (("command", "the launcher's horovodrun and the workers' sshd are pgtrain's"),
                                ("args", "the launcher's horovodrun and the workers' sshd are pgtrain's"),
                                ("image", "set kubernetes.image")):
                if field_ in container:
                    problems.append(f"{where}.{field_}: {why}")
        resources = container.get("resources") or {}
        if any(GPU_RESOURCE in (resources.get(part) or {}) for part in ("requests", "limits")):
            problems.append(f"{where}.resources: {GPU_RESOURCE} comes from the layout (gpus_per_worker)")
        problems += [f"{where}.{problem}" for problem in env_problems(
            {e.get("name"): e.get("value", "") for e in container.get("env") or []})]
        for j, mount in enumerate(container.get("volumeMounts") or []):
            if mount.get("mountPath") == DATABASE_MOUNT_PATH or mount.get("name") == DATABASE_VOLUME:
                problems.append(f"{where}.volumeMounts[{j}]: {DATABASE_MOUNT_PATH} holds the database Secret")
    return problems


def non_root_problems(template: Mapping[str, Any], key: str = "pod_template") -> list[str]:
    """What a template asks of its containers' security contexts that non-root mode overrides: every container
    runs with ``capabilities: {drop: [ALL]}`` and without privilege escalation (the restricted Pod Security
    Standard), so a capability it adds (IPC_LOCK for RDMA's pinned memory) or privileges would be dropped silently."""
    problems = []
    spec = template.get("spec") or {}
    for part in ("containers", "initContainers"):
        for i, container in enumerate(spec.get(part) or []):
            where = f"{key}.spec.{part}[{i}].securityContext"
            context = container.get("securityContext") or {}
            added = (context.get("capabilities") or {}).get("add") or []
            if added:
                problems.append(
                    f"{where}.capabilities.add: {', '.join(map(str, added))} would be dropped: non_root mode runs "
                    "every container with capabilities drop ALL (the restricted Pod Security Standard); RDMA's "
                    "IPC_LOCK needs non_root: false (docs/kubernetes.md, \"RDMA and InfiniBand\")")
            for name in ("privileged", "allowPrivilegeEscalation"):
                if context.get(name):
                    problems.append(f"{where}.{name}: true would be overridden: non_root mode runs every container "
                                    "unprivileged, without privilege escalation; drop it or set non_root: false")
    return problems


def merge_template(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """``patch`` over ``base``, as a strategic merge patch does for a pod: objects merge key by key, lists of
    named objects (containers, volumes, env, volumeMounts, ...) item by name, other lists are replaced."""
    merged = copy.deepcopy(dict(base))
    for key, value in patch.items():
        old = merged.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping):
            merged[key] = merge_template(old, value)
        elif (isinstance(value, list) and isinstance(old, list) and value and old
              and all(isinstance(item, Mapping) and "name" in item for item in [*value, *old])):
            by_name = {item["name"]: i for i, item in enumerate(old)}
            result = copy.deepcopy(old)
            for item in value:
                if item["name"] in by_name:
                    result[by_name[item["name"]]] = merge_template(result[by_name[item["name"]]], item)
                else:
                    result.append(copy.deepcopy(dict(item)))
            merged[key] = result
        else:
            merged[key] = copy.deepcopy(value)
    return merged
