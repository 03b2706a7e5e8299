"""pgtrain_score_digits: an example downstream DAG, scheduled by a new version of the digits-mlp model.

pgtrain_model_digits-mlp, the digits model's DAG (dags/models.yaml), emits an event of the model's asset
(pgtrain://pgtrain_db/digits-mlp) from its commit_parameters for every version it commits, with the version,
its metrics and the run in the event's extra. This DAG runs on that event and scores public.samples with
exactly that version into public.digits_scores_v<N>.
"""

from datetime import datetime

from airflow.sdk import DAG, task

from pgtrain.airflow.dag.assets import model_asset

DIGITS = model_asset("digits-mlp")

with DAG(
    dag_id="pgtrain_score_digits",
    description="Score the samples with each new version of digits-mlp",
    schedule=[DIGITS],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["pgtrain", "scoring", "example"],
    doc_md=__doc__,
):

    @task(inlets=[DIGITS])
    def score(triggering_asset_events=None) -> dict:
        from pgtrain.airflow.dag.connection import database_url
        from pgtrain.core.db import connect
        from pgtrain.store.inference import predict

        version = triggering_asset_events[DIGITS][-1].extra["version"]
        with connect(database_url()) as conn:
            result = predict(conn, "digits-mlp", version, "public.samples", "id", f"public.digits_scores_v{version}")
        return {"version": version, "rows": result.rows}

    score()
