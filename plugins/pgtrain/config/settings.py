"""The DAG author's settings: what runs where, and what a triggerer may read and run.

They live in a YAML file next to the DAGs (``dags/pgtrain.yaml``, whose path the DAG files pass;
``$PGTRAIN_SETTINGS`` names another), owned by whoever deploys the DAGs, never in the trigger form:

- ``launcher``: where the generic DAG's jobs run, ``local`` (horovodrun on the worker) or ``kubernetes``;
- ``backend``: the ranks' collectives, ``auto``, ``horovod`` or ``torch``, and ``collective_timeout`` (seconds);
- ``precision`` (``fp32`` or ``bf16``) and ``stall_timeout`` (seconds a running job may go without a new epoch);
- ``allowed_sources``: schemas (``public``) or tables (``"Clinic"."Biopsies"``) a run may train on;
- ``allowed_models``: model references a run may build (``mlp``, ``package.module:factory``);
- ``kubernetes``: the MPIJob's image, namespace, Secret, scheduling (queue, priority, affinity), sizes, pod
  security, extra environment and pod templates (``KUBERNETES_SETTINGS``, declared in ``pgtrain.config.kubernetes``);
- ``quality_gate``: how much worse than the head a run may be, and absolute floors (``QUALITY_GATE``);
- ``max_world_size``: the most ranks a run may ask for;
- ``categories``: the most levels a run may keep per categorical column and the fewest rows a kept level needs
  (a trigger beyond them is refused), and what of the levels a version may store in clear (``CATEGORIES``).
- ``intra_op_threads``: torch's threads in each rank (``RANK_SETTINGS``; default: as many as its CPUs allow, fewer for a
  small network's training steps: ``trainer.threads``).
- ``search_limits``: whether a run may search, and its caps: ``max_trials``, ``concurrency`` (trials at once),
  ``max_total_world_size`` (``pgtrain.config.search``); none: a run with the ``search`` param is refused.

A run whose source or model is not allowed is refused in ``plan_run``, before any column or row of it
is read.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pgtrain.config.kubernetes import KUBERNETES_SETTINGS, schema_message
from pgtrain.config.params import (
    CATEGORY_STORAGE,
    MAX_WORLD_SIZE,
    PARAMETERS,
    QUALITY_GATE,
    RANK_SETTINGS,
    TrainingConfig,
    quality_gate_problems,
)
from pgtrain.config.search import LIMITS_SCHEMA
from pgtrain.core.errors import ConfigError

SETTINGS_ENV = "PGTRAIN_SETTINGS"
SETTINGS_FILE_NAME = "pgtrain.yaml"  # next to the DAG files, which pass its path

def rule(schema: dict[str, Any]) -> dict[str, Any]:
    """A param's JSON schema as a rule for a file the author writes: no default, title, description or section."""
    return {k: v for k, v in schema.items() if k not in ("default", "section", "title", "description")}


# The author's bounds on the category params (a trigger asking for more levels, or rarer ones, is refused), then
# what a version stores in clear (CATEGORY_STORAGE). Unset keys take these defaults.
CATEGORY_BOUNDS: dict[str, dict[str, Any]] = {
    "max_categories": {"type": "integer", "minimum": 1, "maximum": PARAMETERS["max_categories"]["maximum"],
                       "default": 1000},
    "min_category_count": {"type": "integer", "minimum": 1, "default": 1},
}
CATEGORIES: dict[str, dict[str, Any]] = {**CATEGORY_BOUNDS, **CATEGORY_STORAGE}


# What the settings file and a models-file entry share: where a run's job runs, its gate, its size bound and its
# category rules.
AUTHOR_PROPERTIES: dict[str, dict[str, Any]] = {
    "launcher": rule(PARAMETERS["launcher"]),
    "backend": rule(PARAMETERS["backend"]),
    "collective_timeout": rule(PARAMETERS["collective_timeout"]),
    "precision": rule(PARAMETERS["precision"]),
    "stall_timeout": rule(PARAMETERS["stall_timeout"]),
    "kubernetes": {"type": "object", "additionalProperties": False, "properties": KUBERNETES_SETTINGS},
    "quality_gate": {"type": "object", "additionalProperties": False,
                     "properties": {name: rule(schema) for name, schema in QUALITY_GATE.items()}},
    "max_world_size": {"type": "integer", "minimum": 1, "maximum": MAX_WORLD_SIZE},
    "categories": {"type": "object", "additionalProperties": False,
                   "properties": {name: rule(schema) for name, schema in CATEGORIES.items()}},
    **{name: rule(schema) for name, schema in RANK_SETTINGS.items()},
    "search_limits": LIMITS_SCHEMA,
}

# The author's settings a run's config snapshot holds (its params, fixed by the author).
RUN_SETTINGS = ("launcher", "backend", "collective_timeout", "precision", "stall_timeout")

_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "allowed_sources": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
        "allowed_models": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
        **AUTHOR_PROPERTIES,
    },
}


@dataclass(frozen=True)
class AuthorSettings:
    allowed_sources: tuple[str, ...] = ("public",)
    allowed_models: tuple[str, ...] = ("mlp",)
    kubernetes: dict[str, Any] = field(default_factory=dict)
    quality_gate: dict[str, float | None] = field(default_factory=dict)
    max_world_size: int = MAX_WORLD_SIZE
    launcher: str = TrainingConfig.launcher
    categories: dict[str, Any] = field(default_factory=dict)  # CATEGORIES keys the author set
    backend: str = TrainingConfig.backend
    collective_timeout: int = TrainingConfig.collective_timeout
    precision: str = TrainingConfig.precision
    stall_timeout: int = TrainingConfig.stall_timeout
    intra_op_threads: int | None = None
    search_limits: dict[str, Any] | None = None  # pgtrain.config.search.SearchLimits; None: no search

    def category_rules(self) -> dict[str, Any]:
        """Every CATEGORIES key: the author's value, else its default."""
        return {name: self.categories.get(name, schema["default"]) for name, schema in CATEGORIES.items()}

    def fixed_params(self) -> dict[str, Any]:
        """The params every run of the DAG takes from these settings: not offered to the triggerer."""
        return {name: getattr(self, name) for name in RUN_SETTINGS}

    def operator_arguments(self) -> dict[str, Any]:
        """Keyword arguments of MPIJobTrainOperator for launcher=kubernetes (KPO converts the tolerations)."""
        return dict(self.kubernetes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: what a DAG hands its tasks (resolved once, when the DAG file is parsed)."""
        data = dataclasses.asdict(self)
        return {**data, "allowed_sources": list(self.allowed_sources), "allowed_models": list(self.allowed_models)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AuthorSettings:
        return cls(**{**data, "allowed_sources": tuple(data["allowed_sources"]),
                      "allowed_models": tuple(data["allowed_models"])})


def author_file(path: Path | str | None, env: str, default: Path | str | None, what: str) -> tuple[Path, Any] | None:
    """(path, parsed YAML) of an author's file: ``path``, else ``$env``, else ``default`` (a DAG passes the file
    next to it). None when only ``default`` is named and it does not exist: the built-in defaults apply. A named
    file that is missing or not YAML is a ConfigError, and so is naming none at all (no silent defaults)."""
    import yaml

    named = path or os.environ.get(env)
    if not named and not default:
        raise ConfigError(f"which pgtrain {what} file? Pass its path, or set ${env}")
    chosen = Path(named or default)
    if not named and not chosen.exists():
        return None
    if not chosen.exists():
        raise ConfigError(f"the pgtrain {what} file {chosen} does not exist (${env} names another)")
    try:
        return chosen, yaml.safe_load(chosen.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{chosen} is not valid YAML: {error}") from error


def load_settings(path: Path | str | None = None, *, default: Path | str | None = None) -> AuthorSettings:
    """Read and check the author's settings file (``author_file``): ``path``, ``$PGTRAIN_SETTINGS`` or
    ``default``; a ``default`` that does not exist means the defaults."""
    import jsonschema

    found = author_file(path, SETTINGS_ENV, default, "settings")
    if found is None:
        return AuthorSettings()
    chosen, data = found
    errors = sorted(jsonschema.Draft202012Validator(_SCHEMA).iter_errors(data), key=lambda e: list(e.path))
    if errors:
        raise ConfigError(f"{chosen}: " + "; ".join(
            f"{'.'.join(map(str, e.absolute_path)) or 'top level'}: {schema_message(e)}" for e in errors))
    gate_problems = quality_gate_problems(data.get("quality_gate") or {})
    if gate_problems:
        raise ConfigError(f"{chosen}: " + "; ".join(f"quality_gate.{p}" for p in gate_problems))
    defaults = AuthorSettings()
    return AuthorSettings(tuple(data.get("allowed_sources", defaults.allowed_sources)),
                          tuple(data.get("allowed_models", defaults.allowed_models)),
                          dict(data.get("kubernetes") or {}), dict(data.get("quality_gate") or {}),
                          data.get("max_world_size", defaults.max_world_size),
                          data.get("launcher", defaults.launcher), dict(data.get("categories") or {}),
                          data.get("backend", defaults.backend),
                          data.get("collective_timeout", defaults.collective_timeout),
                          data.get("precision", defaults.precision),
                          data.get("stall_timeout", defaults.stall_timeout), data.get("intra_op_threads"),
                          data.get("search_limits"))
