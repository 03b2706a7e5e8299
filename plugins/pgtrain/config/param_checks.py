"""Params checked against their declarations (``pgtrain.config.param_schemas``): every problem named, each with the
param it is about, and a key that is not a param with the closest param's name."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from pgtrain.config.metrics import metric_problems
from pgtrain.config.param_schemas import CATEGORY_STORAGE, PARAMETERS, QUALITY_GATE, RANK_SETTINGS
from pgtrain.core.errors import ConfigError

_SCHEMA = {"type": "object", "properties": {**PARAMETERS, **QUALITY_GATE, **CATEGORY_STORAGE,
                                                   **RANK_SETTINGS},
           "additionalProperties": False}


def quality_gate_problems(gate: Mapping[str, Any], task: str | None = None) -> list[str]:
    """What a quality gate's schema cannot say is wrong with it: ``max_drop`` or ``floor`` without the ``metric``
    they judge, or a metric of another task than ``task`` (None: any task)."""
    if gate.get("metric") is None:
        return [f"{key}: needs metric, the metric it judges" for key in ("max_drop", "floor")
                if gate.get(key) is not None]
    return [f"metric: {problem}" for problem in metric_problems(gate["metric"], task)]


def unknown_keys(values: dict[str, Any], known: dict[str, Any] = PARAMETERS) -> list[str]:
    """One message per key that is not a param, with the closest param name when there is one."""
    messages = []
    for key in sorted(set(values) - set(known)):
        # Two candidates: a typo is often equally close to two params (feature_column: features_column or
        # feature_columns), and naming the wrong one alone misleads.
        close = difflib.get_close_matches(key, PARAMETERS, n=2)
        hint = (f"; did you mean {' or '.join(map(repr, close))}?" if close
                else f"; the params are: {', '.join(PARAMETERS)}")
        messages.append(f"{key!r} is not a param of this DAG{hint}")
    return messages


def validate_params(values: dict[str, Any]) -> None:
    """Raise ConfigError listing every problem of ``values`` against PARAMETERS (JSON schema, full matches)."""
    problems = param_problems(values)
    if problems:
        raise ConfigError("invalid training parameters: " + "; ".join(problems))


def param_problems(values: dict[str, Any]) -> list[str]:
    """One message per problem of ``values`` against PARAMETERS, each starting with the param's name."""
    import jsonschema  # Airflow depends on it; imported here so that parsing a DAG stays cheap

    problems = unknown_keys(values, _SCHEMA["properties"])
    known = {k: v for k, v in values.items() if k in _SCHEMA["properties"]}
    validator = jsonschema.Draft202012Validator(_SCHEMA)
    for error in sorted(validator.iter_errors(known), key=lambda e: list(e.absolute_path)):
        where = ".".join(str(p) for p in error.absolute_path) or "params"
        problems.append(f"{where}: {_short(error)}")
    return problems


def _short(error: Any) -> str:
    if error.validator == "anyOf":
        return f"{error.instance!r} is not valid: {error.schema.get('description', 'see the param description')}"
    return error.message
