"""Models as Airflow Assets: each committed version is an asset event downstream DAGs can be scheduled on.

The model a run commits is a param, known only at run time, so ``commit_parameters`` declares the alias
``pgtrain-models`` and attaches the event to the model's own asset, ``pgtrain://<connection id>/<model>``,
with the version, its metrics and the run in ``extra``. A downstream DAG schedules on ``model_asset(...)``.

Only a model whose asset some DAG declares (schedules on, or names as an outlet) gets events: Airflow keeps
just those assets active, and an event of any other one (an ad-hoc model's) schedules nothing, while Airflow
creates the asset inactive and warns about it at every commit.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Asset, AssetAlias

from pgtrain.airflow.dag.connection import DEFAULT_CONN_ID

MODELS_ALIAS = AssetAlias("pgtrain-models")


def model_asset(model_name: str, conn_id: str = DEFAULT_CONN_ID) -> Asset:
    """The asset of a model in the training database behind ``conn_id``."""
    return Asset(uri=f"pgtrain://{conn_id}/{model_name}", name=f"pgtrain model {model_name} ({conn_id})",
                 group="pgtrain-models")


def is_declared(outlet_events: Any, asset: Asset) -> bool:
    """Whether some DAG declares ``asset``, asked of the API server through the task's ``outlet_events``: it resolves
    an asset reference to active assets only. (An event recorded for an asset that is not among the task's outlets,
    as this lookup leaves one, is not emitted.)"""
    from airflow.sdk.exceptions import AirflowRuntimeError, ErrorType

    try:
        outlet_events[Asset.ref(uri=asset.uri)]
    except AirflowRuntimeError as error:
        if error.error.error == ErrorType.ASSET_NOT_FOUND:
            return False
        raise
    return True
