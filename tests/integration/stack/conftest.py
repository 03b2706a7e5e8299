"""The session's real Airflow stack (fixture ``airflow_stack``): api-server, scheduler, dag-processor and triggerer
on 127.0.0.1, started by ``dev.devstack`` with LocalExecutor, its metadata in a database of the session's
PostgreSQL and the connection ``pgtrain_db`` pointing at a migrated training database of the same server.

One stack per test session, shared by every test marked ``stack``; it stops at the session's end. A test that
needs the stack's logs finds them under ``airflow_stack.logs_dir`` (tasks under ``logs_dir / "tasks"``). The
client the fixture yields: airflow_stack.AirflowStack.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from cryptography.fernet import Fernet
from psycopg import sql

from dev import devdb, devstack, examples
from pgtrain.config.settings import SETTINGS_FILE_NAME
from pgtrain.core.migrations import apply_migrations
from tests.integration.stack.airflow_stack import AirflowStack

STACK_MODELS = Path(__file__).resolve().parent / "stack_models.yaml"  # the stack's own models file
# The stack's settings: the repository's (dags/pgtrain.yaml) with the test factories its search tests train allowed.
TEST_MODELS = ("tests.integration.stack.trial_rendezvous:rendezvous_mlp",)
STARTUP_TIMEOUT = 900.0  # seconds; a busy 2-core machine migrates and starts four services in one to three minutes


@contextmanager
def stack_databases(pg_admin_url: str) -> Iterator[tuple[str, str]]:
    """(metadata URL, training URL): two new databases of the session's server, the training one migrated;
    dropped afterwards."""
    suffix = uuid.uuid4().hex[:10]
    names = (f"airflow_stack_{suffix}", f"pgtrain_stack_{suffix}")
    metadata_url, training_url = (devdb.create_database(pg_admin_url, name) for name in names)
    with psycopg.connect(training_url) as conn:
        apply_migrations(conn)
    try:
        yield metadata_url, training_url
    finally:
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            for name in names:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="session")
def airflow_stack(pg_admin_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowStack]:
    with stack_databases(pg_admin_url) as (metadata_url, training_url):
        yield from _started_stack(metadata_url, training_url, tmp_path_factory)


def _started_stack(metadata_url: str, training_url: str,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowStack]:
    # the stack's signing and encryption keys chosen here, so that a test can look for them where they must not be
    keys = {"AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
            "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode()}
    state_dir = tmp_path_factory.mktemp("airflow-stack")
    extra_env = {**keys, "PGTRAIN_SETTINGS": str(stack_settings(state_dir)),
                 **({"PGTRAIN_MODELS": str(STACK_MODELS)} if STACK_MODELS.exists() else {})}
    try:
        stack = devstack.start(state_dir, metadata_url=metadata_url, training_url=training_url,
                               extra_env=extra_env, timeout=STARTUP_TIMEOUT)
    except devstack.StackError as error:
        pytest.fail(f"the Airflow stack did not start: {error}\n{_log_tails(state_dir / 'logs')}")
    client = AirflowStack(stack, training_url)
    client.secrets = [*keys.values(), metadata_url, training_url]
    try:
        yield client
    finally:
        client.close()
        devstack.stop(state_dir)


def stack_settings(state_dir: Path) -> Path:
    """The repository's settings file with TEST_MODELS added to its allowed models, written into ``state_dir``."""
    settings = yaml.safe_load((devstack.REPO / "dags" / SETTINGS_FILE_NAME).read_text())
    settings["allowed_models"] = [*settings.get("allowed_models", []), *TEST_MODELS]
    path = state_dir / SETTINGS_FILE_NAME
    path.write_text(yaml.safe_dump(settings))
    return path


def _log_tails(logs_dir: Path, lines: int = 30) -> str:
    tails = []
    for path in sorted(logs_dir.glob("*.log")) if logs_dir.exists() else []:
        text = path.read_text(errors="replace").splitlines()[-lines:]
        tails.append(f"--- {path.name} ---\n" + "\n".join(text))
    return "\n".join(tails)


# -- one training run through the REST API, shared by the stack tests that need a committed version ----------------
STACK_TABLE = "stack_rows"


STACK_CONF: dict[str, Any] = {"source_table": f"public.{STACK_TABLE}", "model_name": "stack-mlp", "epochs": 3,
                              "world_size": 1, "hidden_sizes": [16], "learning_rate": 0.1, "batch_size": 16,
                              "seed": 7}


@pytest.fixture(scope="session")
def stack_training_run(airflow_stack: AirflowStack) -> dict[str, Any]:
    """pgtrain_training (the ad-hoc DAG: no schedule) triggered over the REST API with STACK_CONF on a small table
    of its own, waited for. Nobody unpauses it: the dag-processor creates it active, so the trigger runs."""
    with psycopg.connect(airflow_stack.training_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE public.{} (id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, "
                             "features real[] NOT NULL, label integer NOT NULL)").format(sql.Identifier(STACK_TABLE)))
        examples.insert_samples(conn, *examples.synthetic(300, 8, 4, seed=3), table=("public", STACK_TABLE))
    assert airflow_stack.wait_for_dag("pgtrain_training")["is_paused"] is False
    run_id = airflow_stack.trigger("pgtrain_training", STACK_CONF)
    state = airflow_stack.wait_for_run("pgtrain_training", run_id)
    assert state == "success", airflow_stack.describe_failure("pgtrain_training", run_id)
    return {"dag_id": "pgtrain_training", "dag_run_id": run_id, "conf": STACK_CONF}

