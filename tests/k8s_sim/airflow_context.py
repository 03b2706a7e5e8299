"""Test doubles for the parts of an Airflow task context the operators read (outside a task runner).

Operator tests that need to kill a task mid-run or drive deferral step by step call ``execute``
with this context; the end-to-end test runs the real DAG through ``airflow dags test`` instead.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any


@dataclass
class FakeTaskInstance:
    dag_id: str
    task_id: str
    run_id: str
    try_number: int = 1
    map_index: int = -1
    start_date: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))
    xcoms: dict[str, Any] = field(default_factory=dict)

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


class FakeTaskStateStore:
    """Airflow 3.3's per-task-instance store that survives retries (``context["task_state_store"]``)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def set(self, key: str, value: Any) -> None:
        self.values[key] = value


def task_context(dag_id: str, run_id: str, *, task_id: str = "train", try_number: int = 1,
                 params: dict[str, Any] | None = None, state_store: FakeTaskStateStore | None = None) -> dict:
    ti = FakeTaskInstance(dag_id=dag_id, task_id=task_id, run_id=run_id, try_number=try_number)
    context: dict[str, Any] = {"ti": ti, "task_instance": ti, "run_id": run_id,
                               "dag": SimpleNamespace(dag_id=dag_id), "params": params or {}}
    if state_store is not None:
        context["task_state_store"] = state_store
    return context


def first_event(trigger: Any, timeout: float) -> dict[str, Any]:
    """The payload of the first event a deferred task's trigger yields: what the triggerer would hand back."""

    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(asyncio.wait_for(first(), timeout))
