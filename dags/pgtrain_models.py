"""pgtrain_model_<name>: one training DAG per entry of the models file (dags/models.yaml, $PGTRAIN_MODELS).

provision_tables -> plan_run -> compute_shards -> train -> commit_parameters -> report

Each runs on the entry's source and launcher, fixed by the DAG's author, on its schedule: cron, new rows in
the source (an AssetWatcher in the triggerer), or whichever comes first. The trigger form offers the entry's
training params. Bad entries are reported by pgtrain_models_check.py, so that these DAGs keep loading.
A task process (Airflow sets the parsing context to its DAG and task) builds only its own DAG.
"""

from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, chain, get_parsing_context

from pgtrain.airflow.dag.params import dag_params
from pgtrain.airflow.dag.tasks import compute_shards, plan_run, provision_tables
from pgtrain.airflow.pipeline import DEFAULT_ARGS, model_schedule, training_tasks
from pgtrain.config.model_entries import MODELS_FILE_NAME, load_entries
from pgtrain.config.settings import SETTINGS_FILE_NAME, load_settings

HERE = Path(__file__).parent
base_settings = load_settings(default=HERE / SETTINGS_FILE_NAME)
entries, _ = load_entries(default=HERE / MODELS_FILE_NAME, search_limits=base_settings.search_limits)
running_dag = get_parsing_context().dag_id
# A task process of one model's DAG builds only that DAG (a context naming no entry builds them all).
only = running_dag if running_dag in {entry.dag_id for entry in entries} else None

for entry in entries:
    if only and entry.dag_id != only:
        continue
    settings = entry.settings(base_settings)
    fixed = entry.fixed_params(settings)  # the author's: not offered to the triggerer
    with DAG(
        dag_id=entry.dag_id,
        description=entry.description or f"Train {entry.name} on {entry.source_table}",
        schedule=model_schedule(entry),
        start_date=datetime(2026, 1, 1),
        catchup=False,
        max_active_runs=1,
        params=dag_params(entry.params, fixed=fixed),
        default_args=DEFAULT_ARGS,
        tags=["pgtrain", "training", "model"],
        doc_md=__doc__,
    ) as dag:
        run = plan_run(settings.to_dict(), fixed)
        chain(provision_tables(), run, compute_shards(run, settings.to_dict()), *training_tasks(run, settings))
    globals()[entry.dag_id] = dag
