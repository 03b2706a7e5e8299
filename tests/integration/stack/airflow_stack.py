"""The session's real Airflow stack (fixture ``airflow_stack``): api-server, scheduler, dag-processor and triggerer
on 127.0.0.1, started by ``dev.devstack`` with LocalExecutor, its metadata in a database of the session's
PostgreSQL and the connection ``pgtrain_db`` pointing at a migrated training database of the same server.

One stack per test session, shared by every test marked ``stack``; it stops at the session's end. A test that
needs the stack's logs finds them under ``airflow_stack.logs_dir`` (tasks under ``logs_dir / "tasks"``).
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from cryptography.fernet import Fernet
from psycopg import sql

from dev import devdb, devstack, examples
from pgtrain.core.migrations import apply_migrations
from tests.conftest import REPO

STACK_MODELS = REPO / "tests" / "stack_models.yaml"
STARTUP_TIMEOUT = 900.0  # seconds; a busy 2-core machine migrates and starts four services in one to three minutes
TERMINAL_STATES = ("success", "failed")


class AirflowStack:
    """A running stack and a small REST client for it (bearer token from POST /auth/token)."""

    def __init__(self, stack: devstack.Stack, training_url: str) -> None:
        self._stack = stack
        self.base_url = stack.base_url
        self.training_url = training_url
        self.logs_dir: Path = stack.logs_dir
        self.state_dir: Path = stack.state_dir
        self.username = stack.username
        self._token: str | None = None
        self.secrets: list[str] = []  # keys and database URLs the processes hold (no command line may show them)
        self._client = httpx.Client(base_url=self.base_url, timeout=60)

    @property
    def password(self) -> str:
        return self._stack.password

    def token(self) -> str:
        if self._token is None:
            response = self._client.post("/auth/token", json={"username": self.username, "password": self.password})
            assert response.status_code in (200, 201), f"POST /auth/token: {response.status_code} {response.text}"
            self._token = response.json()["access_token"]
        return self._token

    def api(self, method: str, path: str, json: Any = None, **kwargs: Any) -> httpx.Response:
        """A request to the stack with the bearer token (a fresh one when the old one expired)."""
        for _ in range(2):
            headers = {"Authorization": f"Bearer {self.token()}", **kwargs.pop("headers", {})}
            response = self._client.request(method, path, json=json, headers=headers, **kwargs)
            if response.status_code != 401:
                return response
            self._token = None
        return response

    def wait_for_dag(self, dag_id: str, timeout: float = 600.0) -> dict[str, Any]:
        """Until the dag-processor has serialized the DAG; fails early with the DAG file's import error."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            response = self.api("GET", f"/api/v2/dags/{dag_id}")
            if response.status_code == 200:
                details = self.api("GET", f"/api/v2/dags/{dag_id}/details")
                if details.status_code == 200:
                    return response.json()
            errors = self.api("GET", "/api/v2/importErrors").json().get("import_errors", [])
            mine = [error for error in errors if dag_id in error.get("stack_trace", "")]
            if mine:
                raise AssertionError(f"{dag_id} does not import: {mine[0]['filename']}\n{mine[0]['stack_trace']}")
            time.sleep(2)
        raise AssertionError(f"DAG {dag_id} not parsed after {timeout:g} s; logs: {self.logs_dir}")

    def unpause(self, dag_id: str) -> None:
        self._set_paused(dag_id, False)

    def pause(self, dag_id: str) -> None:
        self._set_paused(dag_id, True)

    def _set_paused(self, dag_id: str, paused: bool) -> None:
        response = self.api("PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": paused},
                            params={"update_mask": "is_paused"})
        assert response.status_code == 200, f"pausing/unpausing {dag_id}: {response.status_code} {response.text}"

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None) -> str:
        """POST a DAG run with ``conf``; returns its run id. (It runs once the DAG is unpaused.)"""
        response = self.api("POST", f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf or {}})
        assert response.status_code == 200, f"triggering {dag_id}: {response.status_code} {response.text}"
        return response.json()["dag_run_id"]

    def runs(self, dag_id: str) -> list[dict[str, Any]]:
        response = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns", params={"limit": 100})
        assert response.status_code == 200, response.text
        return response.json()["dag_runs"]

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        response = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances")
        return {ti["task_id"]: ti["state"] for ti in response.json().get("task_instances", [])}

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        response = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
                            headers={"Accept": "text/plain"})
        return response.text

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 900.0) -> str:
        """Until the DAG run is success or failed; returns that state (fails the test after ``timeout``)."""
        deadline = time.monotonic() + timeout
        state = None
        while time.monotonic() < deadline:
            response = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
            assert response.status_code == 200, response.text
            state = response.json()["state"]
            if state in TERMINAL_STATES:
                return state
            time.sleep(2)
        raise AssertionError(f"{dag_id} run {run_id} still {state} after {timeout:g} s; tasks "
                             f"{self.task_states(dag_id, run_id)}; logs: {self.logs_dir}")

    def describe_failure(self, dag_id: str, run_id: str) -> str:
        """Task states and the failed tasks' logs, for an assertion message."""
        states = self.task_states(dag_id, run_id)
        logs = [f"--- {task} ---\n{self.task_log(dag_id, run_id, task)[-3000:]}"
                for task, state in states.items() if state in ("failed", "upstream_failed", "up_for_retry")]
        return f"tasks: {states}\n" + "\n".join(logs)

    def close(self) -> None:
        self._client.close()


@pytest.fixture(scope="session")
def airflow_stack(pg_admin_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowStack]:
    suffix = uuid.uuid4().hex[:10]
    metadata_db, training_db = f"airflow_stack_{suffix}", f"pgtrain_stack_{suffix}"
    metadata_url = devdb.create_database(pg_admin_url, metadata_db)
    training_url = devdb.create_database(pg_admin_url, training_db)
    with psycopg.connect(training_url) as conn:
        apply_migrations(conn)
    # the stack's signing and encryption keys chosen here, so that a test can look for them where they must not be
    keys = {"AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
            "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode()}
    extra_env = {**keys, **({"PGTRAIN_MODELS": str(STACK_MODELS)} if STACK_MODELS.exists() else {})}
    state_dir = tmp_path_factory.mktemp("airflow-stack")
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
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            for name in (metadata_db, training_db):
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


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
    of its own, waited for.

    The DAG is unpaused for the run (the scheduler leaves a paused DAG's triggered runs queued) and paused again
    afterwards, as the dag-processor created it, so no other test's trigger of it runs by surprise."""
    with psycopg.connect(airflow_stack.training_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE public.{} (id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, "
                             "features real[] NOT NULL, label integer NOT NULL)").format(sql.Identifier(STACK_TABLE)))
        examples.insert_samples(conn, *examples.synthetic(300, 8, 4, seed=3), table=("public", STACK_TABLE))
    airflow_stack.wait_for_dag("pgtrain_training")
    run_id = airflow_stack.trigger("pgtrain_training", STACK_CONF)
    airflow_stack.unpause("pgtrain_training")
    try:
        state = airflow_stack.wait_for_run("pgtrain_training", run_id)
    finally:
        airflow_stack.pause("pgtrain_training")
    assert state == "success", airflow_stack.describe_failure("pgtrain_training", run_id)
    return {"dag_id": "pgtrain_training", "dag_run_id": run_id, "conf": STACK_CONF}
