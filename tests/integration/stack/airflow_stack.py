"""The client of the session's real Airflow stack: what the fixture ``airflow_stack`` (conftest.py) yields."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from dev import devstack

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
        extra = kwargs.pop("headers", {})
        for _ in range(2):
            headers = {"Authorization": f"Bearer {self.token()}", **extra}
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
        return {ti["task_id"]: ti["state"] for ti in self.task_instances(dag_id, run_id)}

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """The run's task instances as the API lists them (a mapped task's: one per map_index)."""
        response = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 100})
        assert response.status_code == 200, response.text
        return response.json().get("task_instances", [])

    def mapped_states(self, dag_id: str, run_id: str, task_id: str) -> dict[int, tuple[str | None, int]]:
        """map_index -> (state, try_number) of a mapped task's instances."""
        return {ti["map_index"]: (ti["state"], ti["try_number"]) for ti in self.task_instances(dag_id, run_id)
                if ti["task_id"] == task_id}

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1, map_index: int = -1) -> str:
        """The task try's log as the API serves it: one JSON event a line (Airflow 3.3 answers text/plain 406)."""
        response = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
                            headers={"Accept": "application/x-ndjson"}, params={"map_index": map_index})
        assert response.status_code == 200, f"{task_id} log: {response.status_code} {response.text}"
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
        instances = self.task_instances(dag_id, run_id)
        states = {(ti["task_id"], ti["map_index"]): ti["state"] for ti in instances}
        logs = [f"--- {ti['task_id']} [{ti['map_index']}] ---\n"
                f"{self.task_log(dag_id, run_id, ti['task_id'], max(ti['try_number'], 1), ti['map_index'])[-3000:]}"
                for ti in instances if ti["state"] in ("failed", "up_for_retry")]
        return f"tasks: {states}\n" + "\n".join(logs)

    def close(self) -> None:
        self._client.close()
