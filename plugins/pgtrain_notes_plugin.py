"""Registers the listener that writes each pgtrain DAG run's outcome into the run's note
(pgtrain.airflow.ui.run_notes): the scheduler (and `airflow dags test`) call it when a run ends."""

from airflow.plugins_manager import AirflowPlugin

from pgtrain.airflow.ui import run_notes


class PgtrainRunNotesPlugin(AirflowPlugin):
    name = "pgtrain_run_notes"
    listeners = [run_notes]
