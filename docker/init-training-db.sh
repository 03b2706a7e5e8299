#!/usr/bin/env bash
# First start of the compose PostgreSQL: a training database and its role (password from the environment).
set -euo pipefail
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
  -v trainer_password="$TRAINER_DB_PASSWORD" <<'SQL'
CREATE ROLE trainer LOGIN PASSWORD :'trainer_password';
CREATE DATABASE training OWNER trainer;
SQL
