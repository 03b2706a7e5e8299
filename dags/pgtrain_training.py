"""pgtrain_training: retrain a model on rows in PostgreSQL with Horovod, and commit it as a new version.

provision_tables -> plan_run -> compute_shards -> train -> commit_parameters -> report

Ad-hoc runs: trigger it from the UI or the REST API with the params of your run (source table, columns,
task, model name, epochs, world_size, ...). It has no schedule: scheduled models, retrained on a cron or when
new rows land, each have their own DAG from the models file (pgtrain_models.py), and the models there are
theirs alone. It is active from its creation (is_paused_upon_creation=False): having no schedule it starts
nothing by itself, and a trigger runs at once instead of waiting, queued, for someone to unpause it.
The training database is the Airflow connection `pgtrain_db`.
What runs where (the launcher, the cluster), and which tables and models a run may use, are the author's
settings in `dags/pgtrain.yaml` ($PGTRAIN_SETTINGS), not params.
"""

from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, chain

from pgtrain.airflow.dag.params import dag_params
from pgtrain.airflow.dag.tasks import compute_shards, plan_run, provision_tables
from pgtrain.airflow.pipeline import DEFAULT_ARGS, training_tasks
from pgtrain.config.model_entries import MODELS_FILE_NAME
from pgtrain.config.settings import SETTINGS_FILE_NAME, load_settings

HERE = Path(__file__).parent
settings = load_settings(default=HERE / SETTINGS_FILE_NAME)
fixed = settings.fixed_params()  # launcher and backend: the author's, not the triggerer's
ADHOC_MODEL_NAME = "adhoc-model"  # digits-mlp, the default of the config, is the models file's

with DAG(
    dag_id="pgtrain_training",
    description="Distributed training from PostgreSQL, committed as a model version",
    schedule=None,
    is_paused_upon_creation=False,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    params=dag_params({"model_name": ADHOC_MODEL_NAME}, fixed=fixed),
    default_args=DEFAULT_ARGS,
    tags=["pgtrain", "training"],
    doc_md=__doc__,
):
    run = plan_run(settings.to_dict(), fixed, models_file=str(HERE / MODELS_FILE_NAME))
    chain(provision_tables(), run, compute_shards(run, settings.to_dict()), *training_tasks(run, settings))
