"""The DAG's params, generated from the one definition in ``pgtrain.config.PARAMETERS``."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Param

from pgtrain.config import PARAMETERS


def dag_params(*extra: dict[str, dict[str, Any]]) -> dict[str, Param]:
    params = {}
    for definitions in (PARAMETERS, *extra):
        for name, schema in definitions.items():
            schema = dict(schema)
            params[name] = Param(schema.pop("default"), **schema)
    return params
