# Sourced by the demo and test scripts: a project-local Airflow (SQLite metadata DB, no services).
export AIRFLOW_HOME="${AIRFLOW_HOME:-$PWD/.airflow}"
export AIRFLOW__CORE__DAGS_FOLDER="$PWD/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__UNIT_TEST_MODE=False
export AIRFLOW__LOGGING__LOGGING_LEVEL="${AIRFLOW__LOGGING__LOGGING_LEVEL:-INFO}"
mkdir -p "$AIRFLOW_HOME"
if [ ! -f "$AIRFLOW_HOME/.migrated" ]; then
  .venv/bin/airflow db migrate >"$AIRFLOW_HOME/db-migrate.log" 2>&1 || { cat "$AIRFLOW_HOME/db-migrate.log"; exit 1; }
  touch "$AIRFLOW_HOME/.migrated"
fi
