"""The Kubernetes settings of a training job, each declared once: a field of ``KubernetesSettings`` with its default,
type, JSON schema, help, whether the DAG author sets it and where it goes. Pure Python (no Airflow, no Kubernetes).

Derived from the fields, never listed again:

- ``KUBERNETES_SETTINGS``: the schema of the author's ``kubernetes:`` block (``pgtrain.config.settings``, a
  models-file entry's block);
- ``value_problems``: an operator argument or a settings value checked against its schema, naming the key;
- ``MPIJobOperator``'s arguments: the ``job`` settings become its ``job_settings`` (``MPIJobSettings``), the ``pod``
  ones are KubernetesPodOperator's arguments of the same name (its pod), the ``operator`` ones its watch's;
- the ``render`` command's flags (``pgtrain.launch.mpijob.cli``): one per scalar author setting, and the flags a
  setting declares (``Flag``).

``pgtrain.launch.mpijob.spec.MPIJobSettings`` is these fields plus the run's own (run id, world size, attempt).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from pgtrain import __version__

# A Kubernetes resource quantity ("500m", "16Gi"), as the API server's own pattern.
_NUMBER = r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
QUANTITY = {"type": "string", "pattern": rf"^(\+|-)?{_NUMBER}(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?{_NUMBER}))?$"}
_OPTIONAL_QUANTITY = {**QUANTITY, "type": ["string", "null"]}  # the pattern applies to a string only
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
_NAME = {"type": "string", "minLength": 1}
# Raw Kubernetes objects (affinity, tolerations, pod templates) are checked against the Kubernetes schemas when
# the manifest is rendered and by the API server; here only their shape.
_AFFINITY = {"type": "object", "additionalProperties": False,
             "properties": {part: {"type": "object"} for part in ("nodeAffinity", "podAffinity", "podAntiAffinity")}}
_POD_TEMPLATE = {"type": "object", "additionalProperties": False, "properties": {
    "metadata": {"type": "object", "additionalProperties": False,
                 "properties": {"labels": _STRINGS, "annotations": _STRINGS}},
    "spec": {"type": "object"},
}}
_SCHEDULING_POLICY = {"type": "object", "additionalProperties": False, "properties": {
    "minAvailable": {"type": "integer", "minimum": 1},
    "queue": _NAME,
    "priorityClass": _NAME,
    "scheduleTimeoutSeconds": {"type": "integer", "minimum": 1},
    "minResources": {"type": "object", "additionalProperties": {"anyOf": [QUANTITY, {"type": "integer"}]}},
}}


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expects KEY=VALUE, got {text!r}")
    return key, value


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


class Flag(NamedTuple):
    """A ``render`` flag of a setting: ``name`` given once per item, each parsed by ``item`` (a mapping setting
    collects (key, value) pairs, a sequence setting the items); a scalar setting only renames its flag."""

    name: str
    metavar: str | None = None
    item: Callable[[str], Any] | None = None


Role = Literal["job", "pod", "operator"]


@dataclass(frozen=True)
class Setting:
    """What a field of KubernetesSettings declares beside its default and type (its ``metadata``)."""

    schema: Mapping[str, Any]  # a value's JSON schema
    help: str
    # job: the MPIJob's own (MPIJobOperator's job_settings); pod: KubernetesPodOperator's argument of the same name
    # builds it into the pod both templates derive from (base_pod without an operator); operator: how the operator
    # watches the job, in no manifest.
    role: Role = "job"
    author: bool = True  # a key of the author's kubernetes: block; False: an operator argument only
    flag: Flag | None = None  # None: --name-with-dashes for a scalar author setting, no flag for another


def setting(default: Any, schema: Mapping[str, Any], help: str, *, role: Role = "job", author: bool = True,
            flag: Flag | None = None) -> Any:
    """A field of KubernetesSettings: its default (``{}`` is a fresh dict each time) and its declaration."""
    metadata = {"setting": Setting(schema, help, role, author, flag)}
    if isinstance(default, dict):
        return dataclasses.field(default_factory=dict, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True, kw_only=True)
class KubernetesSettings:
    """Every Kubernetes setting of a training job: one field each (docs/kubernetes.md has what each renders to)."""

    namespace: str = setting("default", _NAME, "the MPIJob's namespace (and its Secret's)", role="pod")
    image: str = setting(f"pgtrain-trainer:{__version__}", _NAME, "the trainer image", role="pod")
    image_pull_secrets: Sequence[str] = setting((), {"type": "array", "items": _NAME},
                                                "Secrets to pull the image with", role="pod")
    gpus_per_worker: int = setting(1, {"type": "integer", "minimum": 1, "maximum": 64},
                                   "GPUs = MPI slots = ranks per worker pod")
    database_secret: str = setting("pgtrain-db", _NAME, "the Secret holding the database URL",
                                   flag=Flag("--secret"))
    database_secret_key: str = setting("url", _NAME, "the database URL's key in the Secret",
                                       flag=Flag("--secret-key"))
    service_account_name: str | None = setting(None, _NAME, "the pods' service account", role="pod")
    priority_class_name: str | None = setting(None, _NAME, "the pods' priority class", role="pod")
    queue_name: str | None = setting(None, {"type": "string",
                                            "pattern": r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"},
                                     "Kueue's LocalQueue (a label on the MPIJob)")
    scheduling_policy: Mapping[str, Any] = setting({}, _SCHEDULING_POLICY,
                                                   "the MPI Operator's gang scheduling (runPolicy.schedulingPolicy)")
    node_selector: Mapping[str, str] = setting({}, _STRINGS, "the pods' node selector", role="pod",
                                               flag=Flag("--node-selector", "KEY=VALUE", _key_value))
    tolerations: Sequence[Mapping[str, Any]] = setting((), {"type": "array", "items": {"type": "object"}},
                                                       "the pods' tolerations", role="pod",
                                                       flag=Flag("--toleration", "KEY[=VALUE][:EFFECT]", _toleration))
    # Per role: Kubernetes affinity objects (over the pod's own, key by key), one worker pod per node, the
    # launcher's node selector (instead of the pod's: it needs no GPU node).
    worker_affinity: Mapping[str, Any] = setting({}, _AFFINITY, "the workers' affinity")
    launcher_affinity: Mapping[str, Any] = setting({}, _AFFINITY, "the launcher's affinity")
    one_worker_per_node: bool | None = setting(None, {"type": "boolean"},
                                               "one worker pod per node (None: on for whole-node workers)")
    launcher_node_selector: Mapping[str, str] = setting({}, _STRINGS, "the launcher's node selector")
    # None: cpu_per_gpu and memory_per_gpu for each GPU the worker holds (pgtrain.launch.mpijob.sizing).
    worker_cpu: str | None = setting(None, QUANTITY, "each worker's cpu request")
    worker_memory: str | None = setting(None, QUANTITY, "each worker's memory request")
    cpu_per_gpu: str = setting("4", QUANTITY, "a worker's cpu request per GPU it holds")
    memory_per_gpu: str = setting("16Gi", QUANTITY, "a worker's memory request per GPU it holds")
    # None: no memory limit (Burstable). worker_guaranteed: limits = requests (cpu and memory), Guaranteed QoS.
    worker_memory_limit: str | None = setting(None, _OPTIONAL_QUANTITY, "each worker's memory limit")
    worker_guaranteed: bool = setting(False, {"type": "boolean"}, "workers' limits = requests (Guaranteed QoS)")
    # 2Gi: horovodrun's build probe imports CUDA torch and horovod.torch beside horovodrun and mpirun
    # (docs/kubernetes.md); 1Gi left little room.
    launcher_cpu: str = setting("500m", QUANTITY, "the launcher's cpu request")
    launcher_memory: str = setting("2Gi", QUANTITY, "the launcher's memory request and limit")
    # A memory-backed /dev/shm on the workers (None: the container runtime's, often 64 MiB). Its pages count
    # against the pod's memory; 8Gi bounds it at half the default worker request and is far above what NCCL's
    # shared-memory transport takes for 8 GPUs (a few hundred MiB).
    shm_size: str | None = setting("8Gi", _OPTIONAL_QUANTITY, "the workers' memory-backed /dev/shm")
    # Names are checked by pod_templates.env_problems, whose message says what a name may be.
    env: Mapping[str, str] = setting({}, {"type": "object", "additionalProperties": {"type": "string"}},
                                     "extra environment of the trainer containers", role="pod")
    # The MPI Operator's non-root mode under the restricted Pod Security Standard (api.NON_ROOT_*).
    non_root: bool = setting(False, {"type": "boolean"}, "the MPI Operator's non-root mode")
    # Partial pod templates (metadata labels/annotations and spec) merged into both replica templates, then into
    # one of them; what pgtrain owns (pod_templates.template_problems) cannot be set there.
    pod_template: Mapping[str, Any] = setting({}, _POD_TEMPLATE, "a partial pod template for both roles")
    worker_pod_template: Mapping[str, Any] = setting({}, _POD_TEMPLATE, "a partial pod template for the workers")
    launcher_pod_template: Mapping[str, Any] = setting({}, _POD_TEMPLATE, "a partial pod template for the launcher")
    startup_timeout_seconds: int = setting(600, {"type": "integer", "minimum": 1},
                                           "fail when the job is not running this long after its start",
                                           role="operator")
    active_deadline_seconds: int | None = setting(86400, {"type": ["integer", "null"], "minimum": 1},
                                                  "the MPI Operator stops a job running longer")
    # None: Airflow's [operators] default_deferrable.
    deferrable: bool | None = setting(None, {"type": "boolean"}, "hand the wait to the triggerer", role="operator")
    poll_interval: float = setting(10, {"type": "number", "minimum": 1, "maximum": 300},
                                   "seconds between two looks at the job", role="operator")
    backoff_limit: int = setting(0, {"type": "integer", "minimum": 0}, "the MPIJob's runPolicy.backoffLimit",
                                 author=False)
    ttl_seconds_after_finished: int = setting(3600, {"type": "integer", "minimum": 0},
                                              "the MPIJob's runPolicy.ttlSecondsAfterFinished", author=False)


SETTINGS: dict[str, Setting] = {f.name: f.metadata["setting"] for f in dataclasses.fields(KubernetesSettings)}
# The schema of the author's kubernetes: block (closed: config.settings refuses any other key).
KUBERNETES_SETTINGS: dict[str, dict[str, Any]] = {name: dict(s.schema) for name, s in SETTINGS.items() if s.author}


def default(name: str) -> Any:
    """A setting's default (the operator's arguments and the render command's flags take theirs from here)."""
    field_ = KubernetesSettings.__dataclass_fields__[name]
    return field_.default_factory() if field_.default is dataclasses.MISSING else field_.default


def named(role: Role) -> tuple[str, ...]:
    """The settings of one role, in their declared order."""
    return tuple(name for name, s in SETTINGS.items() if s.role == role)


def with_defaults(given: Mapping[str, Any], role: Role) -> dict[str, Any]:
    """Each setting of ``role``: its value in ``given``, else its default (a mapping given as None is empty)."""
    values = {name: given.get(name, default(name)) for name in named(role)}
    return {name: default(name) if value is None and isinstance(default(name), dict) else value
            for name, value in values.items()}


def schema_message(error: Any) -> str:
    """A jsonschema error's message, with a quantity's pattern said in words."""
    if error.validator == "pattern" and error.validator_value == QUANTITY["pattern"]:
        return f"{error.instance!r} is not a Kubernetes quantity (e.g. 500m, 4, 16Gi)"
    return error.message


def _plain(value: Any) -> bool:
    """JSON-like (what a settings file holds); a template string is checked once rendered, a Kubernetes client
    object by KubernetesPodOperator."""
    if isinstance(value, str):
        return "{{" not in value
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float))


def value_problems(values: Mapping[str, Any]) -> list[str]:
    """What is wrong with the declared settings among ``values`` (other keys are not looked at), by their schemas:
    ``name: what is wrong`` each."""
    import jsonschema

    arrays = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "array", lambda _checker, instance: isinstance(instance, (list, tuple)))
    validator_class = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=arrays)
    problems = []
    for name, value in values.items():
        if name in SETTINGS and _plain(value):
            problems += [f"{'.'.join(map(str, [name, *e.absolute_path]))}: {schema_message(e)}"
                         for e in validator_class(SETTINGS[name].schema).iter_errors(value)]
    return problems
