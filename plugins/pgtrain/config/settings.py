"""The DAG author's settings: what runs where, and what a triggerer may read and run.

They live in a YAML file next to the DAGs (``dags/pgtrain.yaml``; ``$PGTRAIN_SETTINGS`` names another),
owned by whoever deploys the DAGs, never in the trigger form:

- ``allowed_sources``: schemas (``public``) or tables (``"Clinic"."Biopsies"``) a run may train on;
- ``allowed_models``: model references a run may build (``mlp``, ``package.module:factory``);
- ``kubernetes``: the MPIJob's image, namespace, Secret, node selector, tolerations, sizes;
- ``quality_gate``: how much worse than the head a run may be, and absolute floors (``QUALITY_GATE``);
- ``max_world_size``: the most ranks a run may ask for.

A run whose source or model is not allowed is refused in ``plan_run``, before any column or row of it
is read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pgtrain.config.params import QUALITY_GATE
from pgtrain.core.errors import ConfigError

SETTINGS_ENV = "PGTRAIN_SETTINGS"
DEFAULT_SETTINGS_FILE = Path(__file__).resolve().parents[2] / "dags" / "pgtrain.yaml"

# The MPIJob operator's arguments an author may set, with their JSON schema (the render CLI has a flag each).
KUBERNETES_SETTINGS: dict[str, dict[str, Any]] = {
    "namespace": {"type": "string", "minLength": 1},
    "image": {"type": "string", "minLength": 1},
    "gpus_per_worker": {"type": "integer", "minimum": 1, "maximum": 64},
    "database_secret": {"type": "string", "minLength": 1},
    "database_secret_key": {"type": "string", "minLength": 1},
    "service_account_name": {"type": "string", "minLength": 1},
    "node_selector": {"type": "object", "additionalProperties": {"type": "string"}},
    "tolerations": {"type": "array", "items": {"type": "object"}},
    "worker_cpu": {"type": "string", "minLength": 1},
    "worker_memory": {"type": "string", "minLength": 1},
    "startup_timeout_seconds": {"type": "integer", "minimum": 1},
    "active_deadline_seconds": {"type": ["integer", "null"], "minimum": 1},
    "deferrable": {"type": "boolean"},
}

_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "allowed_sources": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
        "allowed_models": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
        "kubernetes": {"type": "object", "additionalProperties": False, "properties": KUBERNETES_SETTINGS},
        "quality_gate": {"type": "object", "additionalProperties": False,
                         "properties": {name: {k: v for k, v in schema.items() if k != "default"}
                                        for name, schema in QUALITY_GATE.items()}},
        "max_world_size": {"type": "integer", "minimum": 1},
    },
}


@dataclass(frozen=True)
class AuthorSettings:
    allowed_sources: tuple[str, ...] = ("public",)
    allowed_models: tuple[str, ...] = ("mlp",)
    kubernetes: dict[str, Any] = field(default_factory=dict)
    quality_gate: dict[str, float | None] = field(default_factory=dict)
    max_world_size: int = 1024

    def operator_arguments(self) -> dict[str, Any]:
        """Keyword arguments of HorovodTrainOperator for launcher=kubernetes (KPO converts the tolerations)."""
        return dict(self.kubernetes)


def settings_path() -> Path:
    return Path(os.environ.get(SETTINGS_ENV) or DEFAULT_SETTINGS_FILE)


def load_settings(path: Path | str | None = None) -> AuthorSettings:
    """Read and check the author's settings file; a missing default file means the defaults."""
    import jsonschema
    import yaml

    path = Path(path) if path is not None else settings_path()
    if not path.exists():
        if path == DEFAULT_SETTINGS_FILE:
            return AuthorSettings()
        raise ConfigError(f"the pgtrain settings file {path} (from ${SETTINGS_ENV}) does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML: {error}") from error
    errors = sorted(jsonschema.Draft202012Validator(_SCHEMA).iter_errors(data), key=lambda e: list(e.path))
    if errors:
        raise ConfigError(f"{path}: " + "; ".join(
            f"{'.'.join(map(str, e.absolute_path)) or 'top level'}: {e.message}" for e in errors))
    return AuthorSettings(tuple(data.get("allowed_sources", AuthorSettings.allowed_sources)),
                          tuple(data.get("allowed_models", AuthorSettings.allowed_models)),
                          dict(data.get("kubernetes") or {}), dict(data.get("quality_gate") or {}),
                          data.get("max_world_size", AuthorSettings.max_world_size))
