"""The DAG's params, generated from the one definition in ``pgtrain.config.params.PARAMETERS``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from airflow.sdk import Param

from pgtrain.config.params import PARAMETERS

# Airflow validates a Param with jsonschema.validate, which first checks the schema itself against its
# metaschema, and does so every time it resolves a param: for each task, and whenever a DAG's params are
# compared or printed (1,800 times in one `airflow dags test` of pgtrain_training). Against the default
# draft 2020-12 metaschema that check costs about 3 times the draft-07 one; the params use nothing newer.
SCHEMA_DIALECT = "http://json-schema.org/draft-07/schema#"


def dag_params(defaults: Mapping[str, Any] | None = None, fixed: Iterable[str] = ()) -> dict[str, Param]:
    """Every param of PARAMETERS but the ``fixed`` ones (the DAG's author chose them: not offered to the
    triggerer), with ``defaults`` over PARAMETERS' defaults."""
    params, defaults, fixed = {}, dict(defaults or {}), set(fixed)
    for name, schema in PARAMETERS.items():
        if name in fixed:
            continue
        schema = dict(schema)
        default = schema.pop("default")
        params[name] = Param(defaults.get(name, default), **{"$schema": SCHEMA_DIALECT, **schema})
    return params
