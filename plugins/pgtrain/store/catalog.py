"""What the store holds, for people: models and their heads, versions, head moves, a run and its epochs.

Read-only queries shared by ``pgtrain-models`` (the CLI) and the models page of the Airflow UI
(``pgtrain.airflow.ui.app``). No Airflow here.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgtrain.runs import record, trials
from pgtrain.runs import versions as version_rows  # "versions" names lists of version numbers here


def list_models(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """Every model with a version: its head (version, when it moved, metrics), version count and newest version."""
    with conn.transaction():
        return version_rows.models(conn)


def list_versions(conn: psycopg.Connection, model_name: str | None = None) -> list[dict[str, Any]]:
    """Versions (of one model, or all), oldest first: metrics, run and DAG run, parent version, head mark."""
    with conn.transaction():
        rows = version_rows.listed(conn, model_name)
        return with_runs(conn, rows, ("dag_id", "dag_run_id"))


def version_configs(conn: psycopg.Connection, model_name: str) -> dict[int, dict[str, Any]]:
    """{version: its run's config snapshot} of the model's versions that have a run (the models page's "changed"
    column)."""
    versions = list_versions(conn, model_name)
    with conn.transaction():
        runs = record.recorded_runs(conn, (v["run_id"] for v in versions))
    return {v["version"]: runs[v["run_id"]]["config"] for v in versions if v["run_id"] in runs}


def with_runs(conn: psycopg.Connection, rows: list[dict[str, Any]], fields: tuple[str, ...]) -> list[dict[str, Any]]:
    """Each version row with ``fields`` of its run's record (``runs.record.recorded_runs``; None without a run)."""
    runs = record.recorded_runs(conn, (row["run_id"] for row in rows))
    for row in rows:
        run = runs.get(row["run_id"], {})
        row.update({name: run.get(name) for name in fields})
    return rows


def head_history(conn: psycopg.Connection, model_name: str) -> list[dict[str, Any]]:
    """Every move of the model's head, oldest first."""
    with conn.transaction():
        return version_rows.head_moves(conn, model_name)


def run_overview(conn: psycopg.Connection, run_id: str) -> dict[str, Any]:
    """A run for display: its record (config as a dict), the version it made (if any) and its epochs."""
    run = record.get_run(conn, run_id)
    with conn.transaction():
        made = version_rows.of_run(conn, run_id)
    return {"run_id": run.run_id, "dag_id": run.dag_id, "dag_run_id": run.dag_run_id,
            "model_name": run.model_name, "status": run.status, "status_reason": run.status_reason,
            "base_version": run.base_version, "config": run.config.to_dict(),
            "version": made.version if made else None, "epochs": record.epoch_metrics(conn, run_id)}


def version_details(conn: psycopg.Connection, model_name: str, versions: list[int]) -> list[dict[str, Any]]:
    """The given versions of a model, in the order asked, each with what it was made of: its spec (model, task,
    feature columns, source table, watermark, ...), its run's config snapshot, the rows the run planned (all,
    training, validation, and excluded as bad) and its epochs. A version not in the store is left out."""
    with conn.transaction():
        rows = version_rows.details(conn, model_name, versions)
        found = {row["version"]: row for row in with_runs(conn, rows, ("config", "dag_id", "dag_run_id"))}
        for row in found.values():
            row["epochs"] = record.epoch_metrics(conn, row["run_id"]) if row["run_id"] else []
            row["search"] = trials.search_of(conn, row["run_id"]) if row["run_id"] else None
    return [found[v] for v in dict.fromkeys(versions) if v in found]


def list_locks(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """Every lock row: who holds what, since when, until when (``held`` is False for free or expired)."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT name, token, owner, acquired_at, heartbeat_at, expires_at,
                      owner IS NOT NULL AND expires_at > clock_timestamp() AS held
               FROM pgtrain.locks ORDER BY name"""
        ).fetchall()
