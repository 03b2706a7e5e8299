#!/usr/bin/env bash
# make demo: train on the digits with 2 Horovod ranks through the real DAG, commit a version, print a summary.
# Uses $PGTRAIN_DATABASE_URL (a postgresql:// URI) when set, else an embedded PostgreSQL in .pgdata/.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
source scripts/airflow_env.sh

if [ -z "${PGTRAIN_DATABASE_URL:-}" ]; then
  mkdir -p .demo
  if ! PGTRAIN_DATABASE_URL=$(.venv/bin/python -m dev.devdb url .pgdata 2>.demo/devdb.log); then
    cat .demo/devdb.log >&2
    echo "could not start the embedded PostgreSQL in .pgdata/ (log above); or set PGTRAIN_DATABASE_URL" >&2
    exit 1
  fi
  echo "using the embedded PostgreSQL in .pgdata/ (set PGTRAIN_DATABASE_URL to use your own)"
fi
export PGTRAIN_DATABASE_URL
export AIRFLOW_CONN_PGTRAIN_DB="$PGTRAIN_DATABASE_URL"

.venv/bin/python -m dev.examples digits --if-empty
echo "running the digits model's DAG pgtrain_model_digits-mlp (airflow dags test, world_size 2, launcher local) ..."
if ! .venv/bin/airflow dags test pgtrain_model_digits-mlp >.demo/dags-test.log 2>&1; then
  tail -n 60 .demo/dags-test.log
  echo "the DAG run failed; full log: .demo/dags-test.log" >&2
  exit 1
fi
echo
.venv/bin/python -m pgtrain.cli.report --require-committed
echo "demo wall time    $(( $(date +%s) - started )) s (full Airflow log: .demo/dags-test.log)"
