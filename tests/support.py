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


# Params of the example tables of pgtrain.examples (load them with examples.load_breast_cancer / load_diabetes).
def breast_cancer_params() -> dict[str, object]:
    """Classification on "Clinic"."Biopsies": 30 scalar double precision columns, smallint label "diagnosis"."""
    return {"source_table": '"Clinic"."Biopsies"', "key_column": "id", "features_column": None,
            "feature_columns": examples.breast_cancer()[0], "label_column": "diagnosis", "task": "classification"}


def diabetes_params() -> dict[str, object]:
    """Regression on public.diabetes: 10 scalar double precision columns, double precision target "progression"."""
    return {"source_table": "public.diabetes", "key_column": "id", "features_column": None,
            "feature_columns": examples.diabetes()[0], "label_column": "progression", "task": "regression"}
