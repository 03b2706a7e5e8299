"""The DAG's params, generated from the one definition in ``pgtrain.config.PARAMETERS``."""

from __future__ import annotations

from airflow.sdk import Param

from pgtrain.config import PARAMETERS


def dag_params() -> dict[str, Param]:
    params = {}
    for name, schema in PARAMETERS.items():
        schema = dict(schema)
        params[name] = Param(schema.pop("default"), **schema)
    return params
