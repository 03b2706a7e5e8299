"""Tests with real Horovod ranks (horovodrun on this machine, Gloo) against the session's PostgreSQL: the trainer, the
local launcher, resume, orphans, verdicts, and whole DAG runs under `airflow dags test`. Their fixtures are the shared
ones of tests/conftest.py (make_database, db_url, autocommit, airflow_env, sentinel); nothing of their own."""
