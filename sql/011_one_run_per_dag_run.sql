-- A pgtrain run belongs to one Airflow DAG run, not to a DAG run id. A reset Airflow metadata database (or
-- `airflow dags test` of the same date, which deletes and recreates its run) hands out the same run ids again
-- (scheduled__<date>); each such DAG run now gets a run of its own, whose run_id is "<dag_id>/<dag_run_id>#<n>"
-- from the second one on (pgtrain.runs.record.plan_run). plan_run finds the run of its own DAG run through
-- Airflow's task state store, which retries and clears keep and which goes with the DAG run.
ALTER TABLE pgtrain.training_runs DROP CONSTRAINT IF EXISTS training_runs_dag_id_dag_run_id_key;
CREATE INDEX IF NOT EXISTS training_runs_dag_run ON pgtrain.training_runs (dag_id, dag_run_id);
