"""pgtrain_model_<name>: one training DAG per entry of the models file (dags/models.yaml, $PGTRAIN_MODELS).

Each runs the same tasks as pgtrain_training on the entry's source, fixed by the DAG's author, on its
schedule: cron, new rows in the source (an AssetWatcher in the triggerer), or whichever comes first.
Bad entries are reported by pgtrain_models_check.py, so that these DAGs keep loading.
A task process (Airflow sets the parsing context to its DAG and task) builds only its own DAG.
"""

from datetime import datetime

from airflow.sdk import DAG, get_parsing_context

from pgtrain.airflow.dag.params import dag_params
from pgtrain.airflow.dag.pipeline import DEFAULT_ARGS, model_schedule, training_pipeline
from pgtrain.config.model_entries import FIXED_PARAMS, load_entries
from pgtrain.config.settings import load_settings

settings = load_settings()
entries, _ = load_entries()
running_dag = get_parsing_context().dag_id
# A task process of one model's DAG builds only that DAG (a context naming no entry builds them all).
only = running_dag if running_dag in {entry.dag_id for entry in entries} else None

for entry in entries:
    if only and entry.dag_id != only:
        continue
    with DAG(
        dag_id=entry.dag_id,
        description=entry.description or f"Train {entry.name} on {entry.source_table}",
        schedule=model_schedule(entry),
        start_date=datetime(2026, 1, 1),
        catchup=False,
        max_active_runs=1,
        params=dag_params(entry.params, fixed=FIXED_PARAMS),
        default_args=DEFAULT_ARGS,
        tags=["pgtrain", "training", "model"],
        doc_md=__doc__,
    ) as dag:
        training_pipeline(entry.settings(settings), model_entry=entry.name)
    globals()[entry.dag_id] = dag
