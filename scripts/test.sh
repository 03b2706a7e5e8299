#!/usr/bin/env bash
# make test: the whole suite against real PostgreSQL (embedded unless TEST_DATABASE_URL is set).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/airflow_env.sh
.venv/bin/ruff check .
exec .venv/bin/python -m pytest "$@"
