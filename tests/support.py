"""Test helpers shared by the test modules: seed rows, plan a run the way the DAG does."""

from __future__ import annotations

import psycopg

from pgtrain import examples, manifest, runs
from pgtrain.config import TrainingConfig


def seed_samples(conn: psycopg.Connection, rows: int, dim: int = 8, classes: int = 4, seed: int = 0) -> None:
    features, labels = examples.synthetic(rows, dim, classes, seed)
    examples.insert_samples(conn, features, labels)


def planned_run(conn: psycopg.Connection, dag_run_id: str = "test-run", **params) -> runs.Run:
    """plan_run + compute_shards, as the DAG's first tasks do; returns the run with its dimensions."""
    run = runs.plan_run(conn, "pgtrain_test", dag_run_id, TrainingConfig.from_mapping(params))
    manifest.plan_shards(conn, run)
    return runs.get_run(conn, run.run_id)
