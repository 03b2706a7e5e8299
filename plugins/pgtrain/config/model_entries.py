"""The models file: one entry per scheduled model, each of which becomes its own DAG (``dags/pgtrain_models.py``).

``dags/models.yaml`` (``$PGTRAIN_MODELS`` names another) is the DAG author's, like ``dags/pgtrain.yaml``:

- ``name``: the model (its versions, head and lock); the DAG is ``pgtrain_model_<name>``;
- ``source``: the table and its key, feature and label columns: fixed, whoever triggers the DAG;
- ``schedule``: ``cron`` (an expression or preset), ``min_new_rows`` (retrain once that many rows have been
  added since the head version's watermark; ``poll_seconds`` between checks), or both;
- ``launcher`` (``local`` or ``kubernetes``), ``backend``, ``collective_timeout``, ``precision`` and
  ``stall_timeout`` (default: the settings file's) and ``kubernetes``
  (``KUBERNETES_SETTINGS``, over the settings file's);
- ``params``: default training params (``pgtrain.config.params.PARAMETERS``: epochs, world_size, task, ...), which the
  trigger form offers and a triggerer may change;
- ``quality_gate`` (``pgtrain.config.params.QUALITY_GATE``): on by default, ``DEFAULT_QUALITY_GATE``: a version no
  better than the head does not become the head of a scheduled model; set a field to null to turn it off;
- ``max_world_size``: the most ranks a triggered run may ask for (default: the settings file's);
- ``categories`` (``pgtrain.config.settings.CATEGORIES``): over the settings file's, key by key; its
  ``hashed_columns`` add to the settings file's.
- ``intra_op_threads``: torch's threads in each rank of the model's runs (default: the settings file's).
- ``search_limits`` (``pgtrain.config.search``): the model's caps on a search (default: the settings file's); its
  default search is ``params.search``, checked with the entry.

``load_entries`` checks every entry on its own: a bad one (unknown key, wrong type, duplicate name) is reported
as an ``EntryError`` naming the file, the entry and the field, and the others are returned to be scheduled.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pgtrain.config.kubernetes import schema_message
from pgtrain.config.param_checks import param_problems, quality_gate_problems
from pgtrain.config.param_schemas import _MODEL_NAME, PARAMETERS, RANK_SETTINGS
from pgtrain.config.search import schema_problems as search_schema_problems
from pgtrain.config.settings import AUTHOR_PROPERTIES, AuthorSettings, author_file, rule
from pgtrain.core.errors import ConfigError

MODELS_ENV = "PGTRAIN_MODELS"
MODELS_FILE_NAME = "models.yaml"  # next to the DAG files, which pass its path
# What the author fixes per model: a triggerer of the model's DAG can change none of these.
FIXED_PARAMS = ("model_name", "source_table", "key_column", "features_column", "feature_columns", "exclude_columns",
                "categorical_columns", "label_column", "launcher", "backend", "collective_timeout", "precision",
                "stall_timeout")
# The entry's source keys that are params of the same name (``table`` is source_table).
SOURCE_PARAMS = ("key_column", "features_column", "feature_columns", "exclude_columns", "categorical_columns",
                 "label_column")
# A scheduled model's gate unless its entry says otherwise: no worse than the head it would replace.
DEFAULT_QUALITY_GATE: dict[str, float | None] = {"max_accuracy_drop": 0.0, "max_rmse_rise": 0.0}
DEFAULT_POLL_SECONDS = 60


_ENTRY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "source", "schedule"],
    "properties": {
        "name": {"type": "string", "pattern": _MODEL_NAME},
        "description": {"type": "string"},
        "source": {
            "type": "object", "additionalProperties": False, "required": ["table", "label_column"],
            "properties": {
                "table": rule(PARAMETERS["source_table"]),
                **{name: rule(PARAMETERS[name]) for name in SOURCE_PARAMS},
            },
        },
        "schedule": {
            "type": "object", "additionalProperties": False, "minProperties": 1,
            "anyOf": [{"required": ["cron"]}, {"required": ["min_new_rows"]}],
            "properties": {
                "cron": {"type": "string", "minLength": 1},
                "min_new_rows": {"type": "integer", "minimum": 1},
                "poll_seconds": {"type": "number", "minimum": 1, "maximum": 86400},
            },
        },
        "params": {"type": "object"},  # checked against PARAMETERS by validate_params (closest-name hints)
        **AUTHOR_PROPERTIES,
    },
}
_FILE_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["models"],
                "properties": {"models": {"type": "array"}}}


@dataclass(frozen=True)
class ModelEntry:
    name: str
    fixed: dict[str, Any]  # FIXED_PARAMS but the launcher: the model and its source
    params: dict[str, Any]  # default training params the form offers
    launcher: str | None = None  # None: the settings file's
    backend: str | None = None  # None: the settings file's
    collective_timeout: int | None = None  # None: the settings file's
    precision: str | None = None  # None: the settings file's
    stall_timeout: int | None = None  # None: the settings file's
    cron: str | None = None
    min_new_rows: int | None = None
    poll_seconds: float = DEFAULT_POLL_SECONDS
    kubernetes: dict[str, Any] = field(default_factory=dict)
    quality_gate: dict[str, float | None] = field(default_factory=lambda: dict(DEFAULT_QUALITY_GATE))
    max_world_size: int | None = None
    description: str = ""
    categories: dict[str, Any] = field(default_factory=dict)
    intra_op_threads: int | None = None  # None: the settings file's
    search_limits: dict[str, Any] | None = None  # None: the settings file's

    @property
    def dag_id(self) -> str:
        return dag_id_for(self.name)

    @property
    def source_table(self) -> str:
        return self.fixed["source_table"]

    @property
    def key_column(self) -> str:
        return self.fixed["key_column"]

    def settings(self, base: AuthorSettings) -> AuthorSettings:
        """The author's settings for this model's runs: its own table is the one source it may read; its
        launcher and Kubernetes settings over the settings file's; its quality gate; its world-size bound; its
        category rules over the settings file's (hashed columns: both lists); its threads per rank."""
        hashed = [*base.categories.get("hashed_columns", ()), *self.categories.get("hashed_columns", ())]
        categories = {**base.categories, **self.categories, **({"hashed_columns": list(dict.fromkeys(hashed))}
                                                                 if hashed else {})}
        return dataclasses.replace(
            base, allowed_sources=(self.source_table,), kubernetes={**base.kubernetes, **self.kubernetes},
            quality_gate=dict(self.quality_gate), max_world_size=self.max_world_size or base.max_world_size,
            launcher=self.launcher or base.launcher, categories=categories, backend=self.backend or base.backend,
            collective_timeout=self.collective_timeout or base.collective_timeout,
            intra_op_threads=base.intra_op_threads if self.intra_op_threads is None else self.intra_op_threads,
            precision=self.precision or base.precision, stall_timeout=self.stall_timeout or base.stall_timeout,
            search_limits=self.search_limits or base.search_limits)

    def fixed_params(self, settings: AuthorSettings) -> dict[str, Any]:
        """Every param the author fixes for this model's runs (FIXED_PARAMS), with ``settings``' launcher and
        backend."""
        return {**self.fixed, **settings.fixed_params()}


@dataclass(frozen=True)
class EntryError:
    """What is wrong with one entry: ``where`` names the file and the entry, each problem its field."""

    path: Path
    entry: str
    problems: tuple[str, ...]
    name: str | None = None  # the entry's model name, when it has a readable one

    def __str__(self) -> str:
        return f"{self.path}: {self.entry}: " + "; ".join(self.problems)


def dag_id_for(model_name: str) -> str:
    return "pgtrain_model_" + "".join(c if c.isalnum() or c in "_-." else "_" for c in model_name)


def load_entries(path: Path | str | None = None, *, default: Path | str | None = None,
                 search_limits: Mapping[str, Any] | None = None) -> tuple[list[ModelEntry], list[EntryError]]:
    """The valid entries of the models file (``author_file``: ``path``, ``$PGTRAIN_MODELS`` or ``default``), and
    one EntryError per bad entry (``search_limits``: the settings file's, for ``parse_entry``). A file that cannot
    be read at all (missing, not YAML, no ``models`` list) raises ConfigError: then no entry can be trusted; no file
    at all means no scheduled models (the generic DAG still runs)."""
    found = author_file(path, MODELS_ENV, default, "models")
    if found is None:
        return [], []
    path, data = found
    problems = _schema_problems(_FILE_SCHEMA, data)
    if problems:
        raise ConfigError(f"{path}: " + "; ".join(problems))
    entries, errors, seen = [], [], {}
    for index, raw in enumerate(data["models"]):
        name = raw.get("name") if isinstance(raw, dict) else None
        label = f"models[{index}]" + (f" (name {name!r})" if isinstance(name, str) else "")
        if isinstance(name, str) and name in seen:
            errors.append(EntryError(path, label, (f"name: duplicate model name {name!r}, already used by "
                                                   f"models[{seen[name]}]",), name))
            continue
        if isinstance(name, str):
            seen[name] = index
        try:
            entries.append(parse_entry(raw, search_limits))
        except ConfigError as error:
            errors.append(EntryError(path, label, tuple(str(error).split("\n")),
                                     name if isinstance(name, str) else None))
    return entries, errors


def parse_entry(raw: Any, search_limits: Mapping[str, Any] | None = None) -> ModelEntry:
    """One entry as a ModelEntry; ConfigError with one line per problem, each naming its field.
    ``search_limits``: the settings file's; an entry with a search needs them, or its own."""
    problems = _schema_problems(_ENTRY_SCHEMA, raw)
    if not isinstance(raw, dict):
        raise ConfigError("\n".join(problems))
    source, params = (value if isinstance(value, dict) else {} for value in (raw.get("source"), raw.get("params")))
    problems += [f"params.{name}: fixed by the entry (name, source, launcher, backend), not a training param"
                 for name in sorted(set(params) & set(FIXED_PARAMS))]
    problems += [f"params.{name}: the author's setting of how the ranks run, not a training param: set it on the "
                 "entry itself" for name in sorted(set(params) & set(RANK_SETTINGS))]
    fixed = {"model_name": raw.get("name"), "source_table": source.get("table"),
             **{name: source.get(name, PARAMETERS[name]["default"]) for name in SOURCE_PARAMS}}
    table = source.get("table")
    if isinstance(table, str) and "." not in table:  # the settings would read an unqualified name as a schema
        problems.append(f"source.table: {table!r} must be schema-qualified (e.g. public.{table}): the model's DAG "
                        "reads exactly this table, whatever a connection's search_path says")
    problems += [f"params: {p}" if p.startswith("'") else f"params.{p}"
                 for p in param_problems({k: v for k, v in params.items() if k not in FIXED_PARAMS})]
    if isinstance(params.get("search"), dict):
        problems += search_schema_problems(params["search"], where="params.search")
    if params.get("search") is not None and not raw.get("search_limits") and not search_limits:
        problems.append("params.search: the entry's author allows no search (no search_limits on the entry nor in "
                        "the settings file): set search_limits: {max_trials: N} on the entry, or drop params.search")
    gate = raw.get("quality_gate")
    if isinstance(gate, dict):
        task = params.get("task") if isinstance(params.get("task"), str) else None
        problems += [f"quality_gate.{p}" for p in quality_gate_problems(gate, task)]
    cron = (raw.get("schedule") or {}).get("cron") if isinstance(raw.get("schedule"), dict) else None
    if isinstance(cron, str) and not problems:
        problems += [f"schedule.cron: {p}" for p in _cron_problems(cron)]
    if problems:
        raise ConfigError("\n".join(problems))
    schedule = raw["schedule"]
    return ModelEntry(
        name=raw["name"], fixed=fixed, params=dict(params), launcher=raw.get("launcher"), backend=raw.get("backend"),
        collective_timeout=raw.get("collective_timeout"), precision=raw.get("precision"),
        stall_timeout=raw.get("stall_timeout"), cron=schedule.get("cron"),
        min_new_rows=schedule.get("min_new_rows"), poll_seconds=schedule.get("poll_seconds", DEFAULT_POLL_SECONDS),
        kubernetes=dict(raw.get("kubernetes") or {}),
        quality_gate={**DEFAULT_QUALITY_GATE, **(raw.get("quality_gate") or {})},
        max_world_size=raw.get("max_world_size"), description=raw.get("description", ""),
        categories=dict(raw.get("categories") or {}),
        intra_op_threads=raw.get("intra_op_threads"), search_limits=raw.get("search_limits"))


def _schema_problems(schema: dict[str, Any], data: Any) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema)
    return [f"{'.'.join(map(str, e.absolute_path)) or 'entry'}: {_message(e)}"
            for e in sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))]


def _message(error: Any) -> str:
    if error.validator == "additionalProperties":
        return error.message + f" (allowed: {', '.join(error.schema.get('properties', {}))})"
    if error.validator == "anyOf" and list(error.absolute_path)[-1:] == ["schedule"]:
        return "give cron, min_new_rows, or both"
    return schema_message(error)


def model_owners(path: Path | str | None = None, *, default: Path | str | None = None) -> dict[str, str]:
    """Model name -> the DAG that trains it, for every entry of the models file, good or bad (a bad entry's
    model still belongs to its author). An unreadable file fails closed: ConfigError, not "owns nothing"."""
    try:
        entries, errors = load_entries(path, default=default)
    except ConfigError as error:
        raise ConfigError(f"{error}; until the models file is fixed, ad-hoc runs cannot tell which models "
                          "belong to a scheduled model's DAG, so none runs") from None
    names = [e.name for e in entries] + [err.name for err in errors if err.name]
    return {name: dag_id_for(name) for name in names}


def find_entry(name: str, path: Path | str | None = None) -> ModelEntry:
    """The valid entry named ``name``; ConfigError saying why there is none (absent, or what is wrong with it)."""
    entries, errors = load_entries(path)
    for entry in entries:
        if entry.name == name:
            return entry
    bad = [str(error) for error in errors if error.name == name]
    if bad:
        raise ConfigError("the model's entry is invalid: " + "; ".join(bad))
    raise ConfigError(f"{path or 'the models file'} has no entry named {name!r}; its models are: "
                      + ", ".join(e.name for e in entries))


def errors_report(errors: list[EntryError]) -> str:
    """One import error for every bad entry: what the per-model DAG file's checker raises."""
    return (f"{len(errors)} model entr{'y' if len(errors) == 1 else 'ies'} of {errors[0].path} cannot be scheduled "
            "(the other models' DAGs are loaded):\n" + "\n".join(f"- {e}" for e in errors))


def _cron_problems(expression: str) -> list[str]:
    """What Airflow's cron timetables would refuse when the DAG is checked (croniter, plus Airflow's presets)."""
    from croniter import croniter

    if expression in ("@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly") or \
            croniter.is_valid(expression):
        return []
    return [f"{expression!r} is not a cron expression (five fields such as '0 3 * * *', or a preset such as "
            "'@daily')"]
