"""pgtrain_training: retrain a model on rows in PostgreSQL with Horovod, and commit it as a new version.

provision_tables -> plan_run -> compute_shards -> train -> commit_parameters -> report

Trigger it from the UI with other params (world_size, epochs, source table, task, ...) or let the
daily schedule retrain with the defaults. The training database is the Airflow connection `pgtrain_db`.
What runs where, and which tables and models a run may use, are the author's settings in
`dags/pgtrain.yaml` ($PGTRAIN_SETTINGS), not params.
"""

from datetime import datetime, timedelta

from airflow.sdk import DAG

from pgtrain.airflow import tasks
from pgtrain.airflow.failures import RETRY_POLICY
from pgtrain.airflow.params import dag_params
from pgtrain.airflow.train_operator import HorovodTrainOperator
from pgtrain.settings import load_settings

settings = load_settings()

with DAG(
    dag_id="pgtrain_training",
    description="Distributed training from PostgreSQL, committed as a model version",
    schedule="@daily",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    params=dag_params(),
    default_args={"retries": 1, "retry_delay": timedelta(minutes=1), "retry_policy": RETRY_POLICY},
    tags=["pgtrain", "training"],
    doc_md=__doc__,
):
    training_run = tasks.plan_run()
    shards = tasks.compute_shards(training_run)
    trained = HorovodTrainOperator(task_id="train", training_run_id=training_run,
                                   execution_timeout=timedelta(hours=24), **settings.operator_arguments())
    committed = tasks.commit_parameters(training_run)
    summary = tasks.report(training_run)

    tasks.provision_tables() >> training_run
    shards >> trained >> committed >> summary
