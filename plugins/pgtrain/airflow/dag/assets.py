"""Models as Airflow Assets: each committed version is an asset event downstream DAGs can be scheduled on.

The model a run commits is a param, known only at run time, so ``commit_parameters`` declares the alias
``pgtrain-models`` and attaches the event to the model's own asset, ``pgtrain://<connection id>/<model>``,
with the version, its metrics and the run in ``extra``. A downstream DAG schedules on ``model_asset(...)``.
"""

from __future__ import annotations

from airflow.sdk import Asset, AssetAlias

from pgtrain.airflow.dag.connection import DEFAULT_CONN_ID

MODELS_ALIAS = AssetAlias("pgtrain-models")


def model_asset(model_name: str, conn_id: str = DEFAULT_CONN_ID) -> Asset:
    """The asset of a model in the training database behind ``conn_id``."""
    return Asset(uri=f"pgtrain://{conn_id}/{model_name}", name=f"pgtrain model {model_name} ({conn_id})",
                 group="pgtrain-models")
